"""dlrmv4's samples as `HSTURanker` reads them (one dict of int64 features per sample, histories zero-padded to
model.history_length): the reference's Yambda flat cache (`YambdaSource`, benchmarks/dlrmv4/yambda.py) or a
learnable synthetic stream for smokes (`SyntheticSource`, said so in every log through data.source).

Synthetic task: user u has genre u mod G and item i genre i mod G; a history holds mostly items of its user's
genre (9 in 10) at increasing times; the label is whether the candidate's genre is the user's. The ranker can
learn it from the user's history, its uid token and the candidate's item row: the synthetic AUC climbs past
0.75 within a few hundred samples at the smoke's size.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError
from harness.runtime.base import InputContext

from benchmarks.dlrmv4 import yambda
from benchmarks.dlrmv4.config import CONTEXT_TABLES, NUM_ACTION_BITS

HISTORY_FEATURES = ("uih_item_id", "uih_artist_id", "uih_album_id", "uih_timestamp", "uih_action")
SCALAR_FEATURES = ("uih_length", "cand_item_id", "cand_artist_id", "cand_album_id", "label")


def signature(history_length: int) -> dict[str, tf.TensorSpec]:
    """One sample's features (train and eval alike)."""
    spec = {k: tf.TensorSpec([history_length], tf.int64) for k in HISTORY_FEATURES}
    spec.update({k: tf.TensorSpec([], tf.int64) for k in SCALAR_FEATURES})
    spec["context_ids"] = tf.TensorSpec([len(CONTEXT_TABLES)], tf.int64)
    return spec


class SyntheticSource:
    """The learnable synthetic stream (module docstring), generated whole from data.synthetic_seed."""

    def __init__(self, d: Any, m: Any) -> None:
        self.d, self.m = d, m

    def counts(self) -> dict[str, int]:
        return {}

    def validate(self) -> None:
        if self.d.synthetic_min_history > self.m.history_length:
            raise HarnessError(f"data.synthetic_min_history={self.d.synthetic_min_history} is longer than "
                               f"model.history_length={self.m.history_length}")

    @property
    def train_samples(self) -> int:
        return self.d.train_samples or self.d.synthetic_train_samples

    @property
    def eval_samples(self) -> int:
        return self.d.eval_samples or self.d.synthetic_eval_samples

    def samples(self, n: int, stream: int) -> dict[str, np.ndarray]:
        """n samples of stream 0 (train) or 1 (eval), as arrays with a leading sample axis."""
        d, m, t = self.d, self.m, self.m.tables
        rng = np.random.default_rng([d.synthetic_seed, stream])
        genres, h = d.synthetic_genres, m.history_length
        uid = rng.integers(1, t["uid"], n)
        length = rng.integers(min(d.synthetic_min_history, h), h + 1, n)
        own = rng.random((n, h)) < 0.9
        genre = np.where(own, (uid % genres)[:, None], rng.integers(0, genres, (n, h)))
        # the items of a genre g: g + genres * k for k >= 1 (never the padding id 0), below the table's rows
        per_genre = max(1, (t["item_id"] - genres) // genres)
        items = genre + genres * rng.integers(1, per_genre + 1, (n, h))
        cand = rng.integers(1, t["item_id"], n)
        ts = 1_600_000_000 + np.cumsum(rng.integers(60, 7200, (n, h)), axis=1)
        action = 1 << rng.integers(0, NUM_ACTION_BITS, (n, h))
        valid = np.arange(h)[None, :] < length[:, None]

        def hist(x: np.ndarray) -> np.ndarray:
            return np.where(valid, x, 0).astype(np.int64)

        hour = (ts[np.arange(n), length - 1] // 3600) % 24
        artist, album = cand % t["artist_id"], cand % t["album_id"]
        context = [uid]
        for name, key in zip(CONTEXT_TABLES[1:], (artist, album, hour, cand * 24 + hour, artist * 24 + hour,
                                                  np.zeros(n, np.int64), artist * 24 + hour)):
            context.append((uid * 7919 + key * 104729) % t[name] if name.startswith("user") else key % t[name])
        return {"uih_length": length.astype(np.int64), "uih_item_id": hist(items),
                "uih_artist_id": hist(items % t["artist_id"]), "uih_album_id": hist(items % t["album_id"]),
                "uih_timestamp": hist(ts), "uih_action": hist(action),
                "cand_item_id": cand.astype(np.int64), "cand_artist_id": artist.astype(np.int64),
                "cand_album_id": album.astype(np.int64),
                "label": (cand % genres == uid % genres).astype(np.int64),
                "context_ids": np.stack(context, 1).astype(np.int64)}

    def train(self, ctx: InputContext, replicas: int, local_batch: int) -> tf.data.Dataset:
        """The train samples in order, repeated; each host takes its replicas' consecutive slices of every
        global batch (the mesh's and the mirrored runtime's replicas take consecutive per-replica batches)."""
        ds = tf.data.Dataset.from_tensor_slices(self.samples(self.train_samples, 0)).repeat()
        per_host = local_batch * replicas // ctx.num_hosts
        if ctx.num_hosts > 1:
            ds = ds.batch(per_host * ctx.num_hosts).map(lambda b: {k: v[ctx.host_id * per_host:
                                                                        (ctx.host_id + 1) * per_host]
                                                                   for k, v in b.items()}).unbatch()
        return ds

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.samples(self.eval_samples, 1))


class YambdaSource:
    """The reference's flat cache, read by benchmarks/dlrmv4/yambda.py: training walks windows
    0..train_windows-1 once, each dealt to the replicas as the reference's StreamingWindowSampler deals it;
    every eval scores the eval window's anchors in order (all of them: the reference's eval loader drops the
    last partial batch of 1024 per rank, scoring up to 1024 x ranks fewer)."""

    def __init__(self, d: Any, m: Any) -> None:
        self.d, self.m = d, m
        self._store: yambda.FlatStore | None = None

    @property
    def store(self) -> yambda.FlatStore:
        if self._store is None:
            if not self.d.data_dir:
                raise HarnessError("data.source=yambda needs data.data_dir (the reference's flat cache)")
            self._store = yambda.FlatStore(self.d.data_dir, self.d.metadata_dir or self.d.data_dir,
                                           self.m.history_length)
        return self._store

    def counts(self) -> dict[str, int]:
        """Anchors in the train windows and in the eval window."""
        days = (np.asarray(self.store.anchor_ts, np.int64) - self.store.t_min) // yambda.WINDOW_SECONDS
        return {"train_samples": int(np.sum(days < self.d.train_windows)),
                "eval_samples": int(np.sum(days == self.d.eval_window))}

    def validate(self) -> None:
        counts = self.counts()
        for key, got in counts.items():
            want = getattr(self.d, key)
            if want and want != got:
                raise HarnessError(f"data.{key}={want:,} but {self.d.data_dir} holds {got:,} (0 = counted)")
        if not counts["eval_samples"]:
            raise HarnessError(f"day window data.eval_window={self.d.eval_window} of {self.d.data_dir} has no anchors")

    @property
    def train_samples(self) -> int:
        return self.d.train_samples or self.counts()["train_samples"]

    @property
    def eval_samples(self) -> int:
        return self.d.eval_samples or self.counts()["eval_samples"]

    def features(self, anchor: int) -> dict[str, np.ndarray]:
        s = self.store.sample(int(anchor), self.m.history_length)
        s["context_ids"] = yambda.context_ids(s.pop("anchor_keys"), self.m.tables)
        return s

    def _train_anchors(self, replicas: int, local_batch: int, first: int, count: int) -> Iterator[int]:
        while True:  # one pass is the benchmark; the loop stops at its budget
            for w in range(self.d.train_windows):
                for step in yambda.replica_order(self.store.window(w), replicas, local_batch):
                    yield from step[first * local_batch:(first + count) * local_batch]

    def train(self, ctx: InputContext, replicas: int, local_batch: int) -> tf.data.Dataset:
        per_host = replicas // ctx.num_hosts
        anchors = tf.data.Dataset.from_generator(
            lambda: self._train_anchors(replicas, local_batch, ctx.host_id * per_host, per_host),
            output_signature=tf.TensorSpec([], tf.int64))
        return self._built(anchors)

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.store.window(self.d.eval_window).astype(np.int64))

    def _built(self, anchors: tf.data.Dataset) -> tf.data.Dataset:
        return anchors.map(self.parse)

    def parse(self, anchor: tf.Tensor) -> dict[str, tf.Tensor]:
        """An anchor index built into its features (in a tf.data map: the reader is numpy)."""
        spec = signature(self.m.history_length)
        names = sorted(spec)

        def build(a: np.int64) -> list[np.ndarray]:
            f = self.features(int(a))
            return [np.asarray(f[k], np.int64) for k in names]

        out = tf.numpy_function(build, [anchor], [tf.int64] * len(names), stateful=False)
        return {k: tf.ensure_shape(v, spec[k].shape) for k, v in zip(names, out)}


def make_source(d: Any, m: Any):
    return SyntheticSource(d, m) if d.source == "synthetic" else YambdaSource(d, m)
