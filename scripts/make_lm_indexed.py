"""Writes Megatron `.bin`/`.idx` train and eval files in the reference's C4 layout, on Llama 3.1's vocabulary.

    python scripts/make_lm_indexed.py OUT_DIR [--train_rows 1024] [--eval_rows 64] [--seq 1024]

The decoder LMs' `indexed` source reads these as it reads the reference's C4 download
(`c4-train.en_6_text_document` and `c4-validation-91205-samples.en_text_document`, MMIDIDX version 1, int32
tokens, one sequence per document ending in EOD), so a CPU run exercises the real vocabulary's embedding,
LM head and loss without the 80 GB download. The text is the synthetic Markov language of
benchmarks/lm/data.py (its `--words` words, main successor probability `--main_prob`), its words mapped onto
ids drawn at random from the whole vocabulary and EOD onto `--eod` (Llama 3.1's <|end_of_text|>, 128001), so a
model must learn embedding and output rows spread over the full table. Each file holds at least its rows of
`--seq` + 1 tokens as the reader cuts them (`benchmarks/lm/data.py:Source.indexed_rows`).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.lm import indexed_dataset  # noqa: E402
from benchmarks.lm.config import DataConfig  # noqa: E402
from benchmarks.lm.data import SyntheticLanguage  # noqa: E402

LLAMA31_VOCAB, LLAMA31_EOD = 128256, 128001


def spread_ids(words: int, vocab: int, eod: int, seed: int) -> np.ndarray:
    """The id each language token becomes: 0 (the language's EOD) -> `eod`, the others distinct ids drawn
    from the whole vocabulary (never `eod`)."""
    rng = np.random.default_rng([seed, 0x1D5])
    pool = np.delete(np.arange(vocab), eod)
    return np.concatenate([[eod], rng.choice(pool, words - 1, replace=False)]).astype(np.int32)


def documents(language: SyntheticLanguage, split: int, rows: int, seq: int) -> list[np.ndarray]:
    """Whole documents (each ending in EOD) of the language's packed rows, enough for `rows` rows of
    `seq` + 1 tokens read with stride `seq` (what Source.indexed_rows counts)."""
    stream = language.rows(split, rows + 1, seq).reshape(-1)
    ends = np.flatnonzero(stream == language.eod_id) + 1
    docs = np.split(stream, ends)
    tail = docs.pop()
    if len(tail):  # the cut-off last document, closed as Megatron's --append-eod closes every document
        docs.append(np.append(tail, language.eod_id))
    return docs


def write(out_dir: str, train_rows: int, eval_rows: int, seq: int, vocab: int = LLAMA31_VOCAB,
          eod: int = LLAMA31_EOD, words: int = 256, main_prob: float = 0.9, seed: int = 0) -> dict[str, int]:
    """Writes both files under the reference's prefixes; {prefix: tokens written}."""
    if not 2 <= words <= vocab or not 0 <= eod < vocab:
        raise SystemExit(f"error: --words must be 2..{vocab} and --eod below {vocab}")
    c = DataConfig()
    language = SyntheticLanguage(words, 0, seed, c.synthetic_branching, main_prob, c.synthetic_doc_min,
                                 c.synthetic_doc_max)
    ids = spread_ids(words, vocab, eod, seed)
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for split, (prefix, rows) in enumerate(((c.train_prefix, train_rows), (c.eval_prefix, eval_rows))):
        docs = [ids[d] for d in documents(language, split, rows, seq)]
        indexed_dataset.write(os.path.join(out_dir, prefix), docs, np.int32)
        written[prefix] = int(sum(len(d) for d in docs))
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--train_rows", type=int, default=1024, help="rows of --seq + 1 tokens in the train file")
    p.add_argument("--eval_rows", type=int, default=64, help="rows in the eval file")
    p.add_argument("--seq", type=int, default=1024, help="data.seq_length the rows are counted at")
    p.add_argument("--vocab", type=int, default=LLAMA31_VOCAB)
    p.add_argument("--eod", type=int, default=LLAMA31_EOD)
    p.add_argument("--words", type=int, default=256, help="distinct tokens of the language, EOD included")
    p.add_argument("--main_prob", type=float, default=0.9, help="probability of a token's main successor")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    written = write(a.out_dir, a.train_rows, a.eval_rows, a.seq, a.vocab, a.eod, a.words, a.main_prob, a.seed)
    for prefix, tokens in written.items():
        print(f"{os.path.join(a.out_dir, prefix)}.bin/.idx: {tokens:,} tokens ({(tokens - 1) // a.seq} rows "
              f"of {a.seq} + 1)")


if __name__ == "__main__":
    main()
