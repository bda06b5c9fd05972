"""Writes the synthetic translation language in the reference's file layout, so the real-data path
(`data.source=tfrecord`) can run, and be packaged, offline.

The layout is the one the MLPerf reference's preprocessing leaves in its data dir:
- `<prefix>-encoded-train-%05d-of-%05d` shards of tf.Examples with int64 `inputs`/`targets` (subword ids + EOS);
- the subword vocab file they were encoded with (`vocab.ende.32768` is the reference's name; here it holds the
  synthetic language's words, one whole subtoken each);
- `newstest2014.en` / `newstest2014.de`: the raw eval sources and BLEU references, one sentence a line.

    python -m benchmarks.transformer.tfrecord_writer --out DIR [--train-pairs 10000 --eval-sentences 400]
"""
from __future__ import annotations

import argparse
import os
from typing import Sequence

import tensorflow as tf

from benchmarks.transformer.config import DataConfig
from benchmarks.transformer.data import SyntheticSource, with_eos
from benchmarks.transformer.subword import write_vocab_file
from benchmarks.transformer.synthetic_language import SyntheticLanguage

VOCAB_NAME = "vocab.ende.32768"


def _example(inputs: list[int], targets: list[int]) -> bytes:
    feats = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
             for k, v in (("inputs", inputs), ("targets", targets))}
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def write_synthetic(out_dir: str, train_pairs: int, eval_sentences: int, seed: int = 0, shards: int = 4,
                    max_sequence_length: int = 32, row_length: int = 64) -> dict[str, str | int]:
    """Writes the files; returns the `data.*` overrides that read them, `train_samples` included (the
    rows the corpus packs into, counted as the synthetic source counts them)."""
    os.makedirs(out_dir, exist_ok=True)
    lang = SyntheticLanguage(seed)
    vocab = os.path.join(out_dir, VOCAB_NAME)
    write_vocab_file(vocab, lang.subtokens())
    pairs = lang.pairs("train", train_pairs)
    shards = max(1, min(shards, train_pairs))
    names = [os.path.join(out_dir, f"synthetic-encoded-train-{s + 1:05d}-of-{shards:05d}") for s in range(shards)]
    writers = [tf.io.TFRecordWriter(n) for n in names]
    try:
        for i, (src, tgt) in enumerate(pairs):
            writers[i % shards].write(_example(with_eos(lang.encode(src)), with_eos(lang.encode(tgt))))
    finally:
        for w in writers:
            w.close()
    files, eval_pairs = {}, lang.pairs("eval", eval_sentences)
    for lang_name, column in (("en", 0), ("de", 1)):
        files[lang_name] = os.path.join(out_dir, f"newstest2014.{lang_name}")
        with open(files[lang_name], "w", encoding="utf-8") as f:
            f.writelines(pair[column] + "\n" for pair in eval_pairs)
    cfg = DataConfig(source="synthetic", max_sequence_length=max_sequence_length, row_length=row_length,
                     eval_samples=eval_sentences, synthetic_seed=seed, synthetic_train_pairs=train_pairs)
    return {"source": "tfrecord", "data_dir": out_dir, "vocab_file": vocab, "eval_source_file": files["en"],
            "eval_reference_file": files["de"], "max_sequence_length": max_sequence_length,
            "row_length": row_length, "train_samples": SyntheticSource(cfg).counted_rows(),
            "eval_samples": eval_sentences}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--train-pairs", type=int, default=10000)
    p.add_argument("--eval-sentences", type=int, default=400)
    p.add_argument("--seed", type=int, default=0, help="the language (data.synthetic_seed)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--max-sequence-length", type=int, default=32)
    p.add_argument("--row-length", type=int, default=64)
    a = p.parse_args(argv)
    data = write_synthetic(a.out, a.train_pairs, a.eval_sentences, a.seed, a.shards, a.max_sequence_length,
                           a.row_length)
    print(f"wrote {a.train_pairs} training pairs in {a.shards} shards, {a.eval_sentences} eval sentences and "
          f"the vocab to {a.out}; use:\n  --set " + " ".join(f"data.{k}={v}" for k, v in data.items()))


if __name__ == "__main__":
    main()
