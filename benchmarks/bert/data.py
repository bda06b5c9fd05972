"""BERT inputs: MLPerf BERT TFRecords, or a learnable synthetic corpus from a fixed random grammar.

Both produce the MLPerf feature set: input_ids, input_mask, segment_ids (seq_length), masked_lm_positions,
masked_lm_ids, masked_lm_weights (max_predictions) and next_sentence_labels. Train pipelines are split
per host, shuffled and repeated; eval sources return records in a fixed order (the harness pads, shards
and masks them so every eval sequence counts exactly once).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from harness.train.datafiles import check_count, check_examples, counted_records, list_files, sharded_records
from harness.errors import HarnessError
from harness.runtime.base import InputContext

from benchmarks.bert.config import DataConfig

PAD, CLS, SEP, MASK = 0, 1, 2, 3
FIRST_WORD = 4
INT_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")


def feature_spec(seq_length: int, max_predictions: int) -> dict[str, tf.io.FixedLenFeature]:
    """The MLPerf BERT TFRecord schema (as written by the reference's create_pretraining_data)."""
    s, p = seq_length, max_predictions
    return {
        "input_ids": tf.io.FixedLenFeature([s], tf.int64),
        "input_mask": tf.io.FixedLenFeature([s], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([s], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([p], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([p], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([p], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def to_model_features(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    out = {k: tf.cast(ex[k], tf.int32) for k in INT_FEATURES}
    out["masked_lm_weights"] = tf.cast(ex["masked_lm_weights"], tf.float32)
    out["next_sentence_labels"] = tf.squeeze(tf.cast(ex["next_sentence_labels"], tf.int32), -1)  # [1] or [B, 1]
    return out


class TFRecordSource:
    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.spec = feature_spec(cfg.seq_length, cfg.max_predictions)

    def files(self, pattern: str) -> list[str]:
        return list_files(self.cfg.data_dir, pattern, "MLPerf BERT TFRecords")

    def counts(self) -> dict[str, int]:
        """Records in the training and eval files (from the record headers, cached beside the data)."""
        return {"train_samples": counted_records(self.files(self.cfg.train_pattern)),
                "eval_samples": counted_records(self.files(self.cfg.eval_pattern))}

    def validate(self) -> None:
        """The files exist and hold exactly data.train_samples / data.eval_samples sequences."""
        for key, counted in self.counts().items():
            pattern = self.cfg.train_pattern if key == "train_samples" else self.cfg.eval_pattern
            check_count(key, getattr(self.cfg, key), counted, "sequences", f"{pattern} under {self.cfg.data_dir}")
        for pattern in (self.cfg.train_pattern, self.cfg.eval_pattern):
            check_examples(self.files(pattern), self.spec, "MLPerf BERT sequences (input_ids, input_mask, "
                           "segment_ids, masked_lm_*, next_sentence_labels)")

    def parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        return to_model_features(tf.io.parse_single_example(record, self.spec))

    def parse_many(self, records: tf.Tensor) -> dict[str, tf.Tensor]:
        """A block of records [B] -> features with a leading [B]: one vectorized parse, not B."""
        return to_model_features(tf.io.parse_example(records, self.spec))

    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """Element order follows the dataset options' `deterministic` (data.deterministic). `repeat=False`: one
        epoch, each record once (a tf.data service job)."""
        c = self.cfg
        ds = sharded_records(self.files(c.train_pattern), ctx, c.shuffle_buffer, cycle_length=c.parallel_reads,
                             deterministic=None, repeat=repeat)
        if c.parse_block == 1:
            return ds.map(self.parse, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(c.parse_block).map(self.parse_many, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(self.files(self.cfg.eval_pattern))

    def eval_parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        return self.parse(record)


class SyntheticSource:
    """Sentence pairs drawn from a fixed random grammar: each word has `synthetic_branching` successors,
    the first taken with probability `synthetic_main_prob`. A masked word is thus predictable from its
    neighbours (accuracy well above 0.72 is reachable, 1.0 is not), and a random second sentence breaks
    the chain at [SEP], which makes next-sentence prediction learnable too. Sequences and masks are
    fixed by `synthetic_seed` (train and eval from disjoint streams); the run seed fixes the order.
    """

    POOL = 1 << 16  # distinct training sequences held in memory (indices wrap around beyond it)

    def __init__(self, cfg: DataConfig, vocab_size: int) -> None:
        if vocab_size <= FIRST_WORD + cfg.synthetic_branching:
            raise HarnessError(f"model.vocab_size={vocab_size} is too small for the synthetic grammar")
        self.cfg = cfg
        self.vocab = vocab_size
        rng = np.random.default_rng([cfg.synthetic_seed, 0])
        self.successors = rng.integers(FIRST_WORD, vocab_size, size=(vocab_size, cfg.synthetic_branching))
        self._train: dict[str, np.ndarray] | None = None

    def validate(self) -> None:
        pass

    def generate(self, n: int, stream: int) -> dict[str, np.ndarray]:
        """`n` sequences with masks, as numpy arrays in the MLPerf feature layout."""
        c = self.cfg
        s, p = c.seq_length, c.max_predictions
        rng = np.random.default_rng([c.synthetic_seed, stream])
        length = rng.integers(max(s // 2, 5), s + 1, size=n)                    # real tokens incl. specials
        len_a = 1 + (rng.random(n) * (length - 4)).astype(np.int64)             # 1 .. length-4
        random_next = rng.random(n) < 0.5
        # One word chain per sequence; the second sentence restarts it when it is a random "next".
        choice = np.where(rng.random((n, s)) < c.synthetic_main_prob, 0,
                          rng.integers(1, c.synthetic_branching, size=(n, s)))
        fresh = rng.integers(FIRST_WORD, self.vocab, size=(n, s))
        chain = np.zeros((n, s), np.int64)
        chain[:, 0] = fresh[:, 0]
        for t in range(1, s):
            follow = self.successors[chain[:, t - 1], choice[:, t]]
            chain[:, t] = np.where(random_next & (t == len_a), fresh[:, t], follow)
        pos = np.arange(s)[None, :]
        la, ln = len_a[:, None], length[:, None]
        in_a = (pos >= 1) & (pos <= la)
        in_b = (pos >= la + 2) & (pos <= ln - 2)
        ids = np.full((n, s), PAD, np.int64)
        ids[:, 0] = CLS
        ids = np.where(in_a, np.take_along_axis(chain, np.clip(pos - 1, 0, s - 1), 1), ids)
        ids = np.where(in_b, np.take_along_axis(chain, np.clip(pos - 2, 0, s - 1), 1), ids)
        ids = np.where((pos == la + 1) | (pos == ln - 1), SEP, ids)
        input_mask = (pos < ln).astype(np.int64)
        segment_ids = ((pos >= la + 2) & (pos < ln)).astype(np.int64)
        # Mask 15% of the words (at most p), sorted by position; 80% [MASK], 10% random, 10% kept.
        words = in_a | in_b
        count = np.minimum(p, np.maximum(1, np.round(0.15 * length).astype(np.int64)))
        order = np.argsort(np.where(words, rng.random((n, s)), 2.0), axis=1)[:, :p]
        valid = np.arange(p)[None, :] < count[:, None]
        positions = np.where(valid, np.sort(np.where(valid, order, s), axis=1), 0)
        positions = np.where(positions >= s, 0, positions)
        masked_ids = np.where(valid, np.take_along_axis(ids, positions, 1), 0)
        action = rng.random((n, p))
        replace = np.where(action < 0.8, MASK,
                           np.where(action < 0.9, rng.integers(FIRST_WORD, self.vocab, size=(n, p)), masked_ids))
        rows = np.repeat(np.arange(n)[:, None], p, 1)
        shown = ids.copy()
        shown[rows[valid], positions[valid]] = replace[valid]
        return {"input_ids": shown, "input_mask": input_mask, "segment_ids": segment_ids,
                "masked_lm_positions": positions, "masked_lm_ids": masked_ids,
                "masked_lm_weights": valid.astype(np.float32),
                "next_sentence_labels": random_next.astype(np.int64)[:, None]}

    def pool(self) -> dict[str, np.ndarray]:
        if self._train is None:
            self._train = self.generate(min(self.cfg.train_samples, self.POOL), stream=1)
        return self._train

    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """The pool's sequences, shuffled and repeated; `repeat=False`: one epoch of data.train_samples
        (sequence i is the pool's i mod its size), this host's share, shuffled afresh per tf.data service job."""
        pool = self.pool()
        n = len(pool["input_ids"])
        if not repeat:
            ds = tf.data.Dataset.range(self.cfg.train_samples).shard(ctx.num_hosts, ctx.host_id)
            ds = ds.shuffle(min(self.cfg.train_samples, self.cfg.shuffle_buffer))
            return ds.map(lambda i: to_model_features({k: tf.gather(v, i % n) for k, v in pool.items()}),
                          num_parallel_calls=tf.data.AUTOTUNE)
        ds = tf.data.Dataset.from_tensor_slices(pool).map(to_model_features)
        ds = ds.shard(ctx.num_hosts, ctx.host_id)
        return ds.shuffle(min(n, self.cfg.shuffle_buffer), seed=ctx.seed, reshuffle_each_iteration=True).repeat()

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.generate(self.cfg.eval_samples, stream=2))

    def eval_parse(self, record: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return to_model_features(record)


def make_source(cfg: DataConfig, vocab_size: int) -> Any:
    if cfg.source == "synthetic":
        return SyntheticSource(cfg, vocab_size)
    return TFRecordSource(cfg)
