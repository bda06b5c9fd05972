"""Writes llama2_70b_lora train and validation parquet files in the reference's schema from the synthetic source.

    python scripts/make_lora_parquet.py OUT_DIR [--train_rows 3901] [--eval_rows 173] [--seq 8192]

The files are named as the reference's (`train-00000-of-00001.parquet`, `validation-00000-of-00001.parquet`)
and hold the rows `data.source=synthetic` generates with the same settings (benchmarks/llama2_70b_lora/data.py):
packed `BOS prompt SEP answer EOS` examples, validation labels -100 outside the answers. `data.source=parquet`
with `data.data_dir=OUT_DIR` then trains on exactly what the synthetic source gives, through the parquet reader:
a smoke of the file path, or a check that a pipeline reads the files as the synthetic rows (same seed, same
counts). At the reference's counts and sequence length the files are about 250 MB (int32 ids).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.llama2_70b_lora.data import synthetic_rows, write_parquet  # noqa: E402
from benchmarks.llama2_70b_lora.data_config import LoraDataConfig  # noqa: E402
from benchmarks.llama2_70b_lora.rules import REFERENCE_EVAL_ROWS, REFERENCE_TRAIN_ROWS  # noqa: E402


def write(out_dir: str, train_rows: int, eval_rows: int, seq: int, seed: int = 0, alphabet: int = 16,
          prompt_len: int = 4, train_labels: str = "all", dtype: type = np.int32,
          map_seed: int = -1) -> dict[str, str]:
    """Writes both files; {split: path}."""
    c = LoraDataConfig()
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, (name, rows) in enumerate(((c.train_file, train_rows), (c.eval_file, eval_rows))):
        ids, labels = synthetic_rows(seed, split, rows, seq, alphabet, prompt_len,
                                     score_prompts=split == 0 and train_labels == "all", map_seed=map_seed)
        paths[name] = os.path.join(out_dir, name)
        write_parquet(paths[name], ids, labels, dtype=dtype)
    return paths


def main() -> None:
    c = LoraDataConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--train_rows", type=int, default=REFERENCE_TRAIN_ROWS)
    p.add_argument("--eval_rows", type=int, default=REFERENCE_EVAL_ROWS)
    p.add_argument("--seq", type=int, default=8192, help="tokens per row (the model's sequence length)")
    p.add_argument("--seed", type=int, default=c.synthetic_seed, help="data.synthetic_seed")
    p.add_argument("--map_seed", type=int, default=c.synthetic_map_seed, help="data.synthetic_map_seed")
    p.add_argument("--alphabet", type=int, default=c.synthetic_alphabet, help="data.synthetic_alphabet")
    p.add_argument("--prompt_len", type=int, default=c.synthetic_prompt_len, help="data.synthetic_prompt_len")
    p.add_argument("--train_labels", choices=("all", "answer"), default=c.synthetic_train_labels,
                   help="data.synthetic_train_labels")
    p.add_argument("--int64", action="store_true", help="store ids as int64 lists (int32 otherwise)")
    a = p.parse_args()
    if min(a.train_rows, a.eval_rows, a.seq, a.alphabet, a.prompt_len) < 1:
        raise SystemExit("error: rows, --seq, --alphabet and --prompt_len must be at least 1")
    for path in write(a.out_dir, a.train_rows, a.eval_rows, a.seq, a.seed, a.alphabet, a.prompt_len,
                      a.train_labels, np.int64 if a.int64 else np.int32, a.map_seed).values():
        print(path)


if __name__ == "__main__":
    main()
