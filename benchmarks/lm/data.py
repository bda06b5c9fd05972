"""Rows of seq_length + 1 tokens (inputs are the first seq_length, targets the last) from two sources.

- `synthetic`: a seeded Markov language. Each token (1..V-1) has `branching` successors, its main one
  with probability `main_prob`; documents of `doc_min`..`doc_max` tokens end in EOD (id `eod_id`) and the
  next document starts at a uniformly drawn token. Rows are packed full with whole documents, the last
  one cut. Its entropy rate is `entropy_rate()` nats per scored token (0.72 at the smoke settings), while
  the unigram entropy is about 3.7 at V=64 (measured on smoke rows), so a model must learn the
  transitions to get below 3.34.
- `indexed`: the reference's Megatron pre-tokenized C4 (`<prefix>.bin` + `<prefix>.idx`, format
  MMIDIDX version 1); rows are consecutive windows of the concatenated documents (stride seq_length, one
  token shared, as Megatron's GPT dataset samples them), read by TensorFlow ops alone (fixed-length records of
  the .bin decoded in place), so the tf.data service's workers and a TPU host can run the pipeline.
  `indexed_dataset.write` makes such files.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError
from harness.runtime.base import InputContext

from benchmarks.lm import indexed_dataset
from benchmarks.lm.config import DataConfig


class SyntheticLanguage:
    """The transition table of one seed and rows drawn from it."""

    def __init__(self, vocab: int, eod_id: int, seed: int, branching: int, main_prob: float,
                 doc_min: int, doc_max: int) -> None:
        if vocab < branching + 2:
            raise HarnessError(f"synthetic data: vocabulary of {vocab} is too small for "
                               f"data.synthetic_branching={branching}")
        self.vocab, self.eod_id = vocab, eod_id
        self.doc_min, self.doc_max = doc_min, doc_max
        self.words = np.array([t for t in range(vocab) if t != eod_id])
        rng = np.random.default_rng([seed, 0x6F55])
        self.successors = np.stack([rng.choice(self.words, branching, replace=False) for _ in range(vocab)])
        rest = (1.0 - main_prob) / (branching - 1) if branching > 1 else 0.0
        self.probs = np.array([main_prob if branching > 1 else 1.0] + [rest] * (branching - 1))
        self.cumulative = np.cumsum(self.probs)
        self.seed = seed

    def entropy_rate(self) -> float:
        """Nats per scored token of the ideal model: each in-document transition has the successor
        entropy, and a document's last token is EOD with probability ~1 / mean length (ignored: small)."""
        p = self.probs[self.probs > 0]
        return float(-(p * np.log(p)).sum())

    def rows(self, split: int, count: int, length: int) -> np.ndarray:
        """`count` packed rows of `length` tokens for `split` (0 train, 1 eval), vectorized over rows."""
        rng = np.random.default_rng([self.seed, split, 0x0D0C])
        out = np.empty([count, length], np.int32)
        left = rng.integers(self.doc_min, self.doc_max + 1, size=count)
        cur = self.words[rng.integers(len(self.words), size=count)]
        for t in range(length):
            end = left == 1
            out[:, t] = np.where(end, self.eod_id, cur)
            pick = np.searchsorted(self.cumulative, rng.random(count), side="right").clip(0, len(self.probs) - 1)
            following = self.successors[cur, pick]
            fresh = self.words[rng.integers(len(self.words), size=count)]
            cur = np.where(end, fresh, following)
            left = np.where(end, rng.integers(self.doc_min, self.doc_max + 1, size=count), left - 1)
        return out


class Source:
    """Training rows (shuffled, repeated, split over hosts) and the fixed eval rows of one data config."""

    def __init__(self, cfg: DataConfig, vocab: int) -> None:
        self.cfg, self.vocab = cfg, vocab
        self.row = cfg.seq_length + 1
        self._train: np.ndarray | None = None
        self._eval: np.ndarray | None = None
        self._language: SyntheticLanguage | None = None

    @property
    def language(self) -> SyntheticLanguage:
        c = self.cfg
        if self._language is None:
            self._language = SyntheticLanguage(self.vocab, c.eod_id, c.synthetic_seed, c.synthetic_branching,
                                               c.synthetic_main_prob, c.synthetic_doc_min, c.synthetic_doc_max)
        return self._language

    def _path(self, prefix: str) -> str:
        return os.path.join(self.cfg.data_dir, prefix)

    def validate(self, closed: bool = False) -> None:
        """Checks the source before any log exists (one HarnessError line); `closed`: a stated
        data.train_samples must be the files' rows."""
        c = self.cfg
        if c.eod_id >= self.vocab:
            raise HarnessError(f"data.eod_id={c.eod_id} is outside the vocabulary of {self.vocab}")
        if c.source == "synthetic":
            if c.synthetic_doc_min > c.synthetic_doc_max:
                raise HarnessError(f"data.synthetic_doc_min={c.synthetic_doc_min} exceeds "
                                   f"data.synthetic_doc_max={c.synthetic_doc_max}")
            return
        for prefix in (c.train_prefix, c.eval_prefix):
            info = indexed_dataset.open_index(self._path(prefix))
            if info.max_token >= self.vocab:
                raise HarnessError(f"{self._path(prefix)}.bin holds token id {info.max_token}, outside "
                                   f"model.vocab_size={self.vocab}")
        rows = self.indexed_rows(c.eval_prefix)
        if rows < c.eval_samples:
            raise HarnessError(f"{self._path(c.eval_prefix)} holds {rows} rows of {self.row} tokens but "
                               f"data.eval_samples={c.eval_samples}")
        train_rows = self.indexed_rows(c.train_prefix)
        if train_rows < 1:
            raise HarnessError(f"{self._path(c.train_prefix)} holds fewer than {self.row} tokens")
        if c.train_samples > train_rows:
            raise HarnessError(f"data.train_samples={c.train_samples} but {self._path(c.train_prefix)} holds "
                               f"{train_rows} rows of {self.row} tokens")
        if closed and c.train_samples and c.train_samples != train_rows:
            raise HarnessError(f"closed run: data.train_samples={c.train_samples} but {self._path(c.train_prefix)} "
                               f"holds {train_rows} rows of {self.row} tokens; set data.train_samples=0 (counted "
                               "from the files)")

    def example_spec(self) -> dict[str, tf.TensorSpec]:
        """One unbatched example, as `train` and `eval_parse` give it: a row of seq_length + 1 tokens."""
        return {"tokens": tf.TensorSpec([self.row], tf.int32)}

    def eval_parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"tokens": record}

    def stand_in_rows(self, cfg: Any) -> tuple[int, str]:
        """A dry run's training rows where the index files are not read, and how they were stood in."""
        return cfg.optimizer.max_steps * cfg.schedule.global_batch_size, "optimizer.max_steps x global batch"

    def indexed_rows(self, prefix: str) -> int:
        return max(0, (indexed_dataset.open_index(self._path(prefix)).tokens - 1) // self.cfg.seq_length)

    def counts(self) -> dict[str, int]:
        """Rows of seq_length + 1 tokens the train file holds (`data count`; {} for synthetic data, which is
        generated to fit). Not the eval file's: eval_samples is the rules' number of its first rows (closed:
        1024), not all it holds; `validate` checks that it holds that many."""
        if self.cfg.source == "synthetic":
            return {}
        return {"train_samples": self.indexed_rows(self.cfg.train_prefix)}

    @property
    def train_samples(self) -> int:
        c = self.cfg
        if c.train_samples:
            return c.train_samples
        return c.synthetic_train_rows if c.source == "synthetic" else self.indexed_rows(c.train_prefix)

    # ------------------------------------------------------------------------------------ datasets
    def _indexed_dataset(self, prefix: str, count: int) -> tf.data.Dataset:
        """Rows 0..count-1 of `prefix` in order: row i is tokens [i * seq, i * seq + seq], read as record i of
        the .bin in records of seq tokens (its first token) joined to record i of the same records shifted by
        one token (the other seq). TensorFlow ops only: no Python runs per row."""
        info = indexed_dataset.open_index(self._path(prefix))
        seq, size = self.cfg.seq_length, info.dtype.itemsize
        record, total, path = seq * size, info.tokens * size, self._path(prefix) + ".bin"
        out = tf.as_dtype(info.dtype)  # little-endian, as Megatron writes it and decode_raw reads it

        def records(offset: int) -> tf.data.Dataset:
            return tf.data.FixedLengthRecordDataset(path, record, header_bytes=offset,
                                                    footer_bytes=total - offset - count * record,
                                                    buffer_size=1 << 20).take(count)

        def row(first: tf.Tensor, rest: tf.Tensor) -> tf.Tensor:
            tokens = tf.concat([tf.io.decode_raw(first, out)[:1], tf.io.decode_raw(rest, out)], 0)
            return tf.ensure_shape(tf.cast(tokens, tf.int32), [self.row])

        return tf.data.Dataset.zip((records(0), records(size))).map(
            row, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """This host's rows, shuffled and repeated (`repeat=False`: one epoch, each row once, shuffled afresh
        per tf.data service job)."""
        c = self.cfg
        if c.source == "synthetic":
            if self._train is None:
                self._train = self.language.rows(0, self.train_samples, self.row)
            ds = tf.data.Dataset.from_tensor_slices(self._train)
        else:
            ds = self._indexed_dataset(c.train_prefix, self.train_samples)
        ds = ds.shard(ctx.num_hosts, ctx.host_id)
        ds = ds.shuffle(c.shuffle_buffer, seed=ctx.seed if repeat else None, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        return ds.map(lambda t: {"tokens": t})

    def eval_records(self) -> tf.data.Dataset:
        c = self.cfg
        if c.source == "synthetic":
            if self._eval is None:
                self._eval = self.language.rows(1, c.eval_samples, self.row)
            return tf.data.Dataset.from_tensor_slices(self._eval)
        return self._indexed_dataset(c.eval_prefix, c.eval_samples)
