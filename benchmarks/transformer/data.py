"""Transformer inputs: the reference's encoded TFRecords, TFDS wmt14_translate from a local data dir, or
a learnable synthetic translation language; all three end in the same packed (or padded) rows.

Training ids end in EOS (1) and pad with 0, as in the reference's files. The eval set is small (3003
sentences of newstest2014), so it is read and encoded on the host once: source ids for the decoder and
the raw reference sentences for BLEU, which is computed on detokenized text as the reference does.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Protocol, Sequence

import numpy as np
import tensorflow as tf

from harness.train.datafiles import (cached_count, check_count, check_examples, file_error, first_record, list_files,
                                     sharded_records)
from harness.errors import HarnessError
from harness.runtime.base import InputContext

from benchmarks.transformer import packing
from benchmarks.transformer.config import DataConfig
from benchmarks.transformer.subword import EOS_ID, Subtokenizer
from benchmarks.transformer.synthetic_language import SyntheticLanguage


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def with_eos(ids: Sequence[int]) -> list[int]:
    return list(ids) + [EOS_ID]


def cut_at_eos(ids: Sequence[int]) -> list[int]:
    """A hypothesis up to (not including) its first EOS; padding zeros dropped."""
    out = []
    for t in ids:
        if t == EOS_ID:
            break
        if t:
            out.append(int(t))
    return out


def ragged_pairs(inputs: list[list[int]], targets: list[list[int]]) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices({"inputs": tf.ragged.constant(inputs, tf.int32),
                                               "targets": tf.ragged.constant(targets, tf.int32)})


class Source:
    """What the workload needs from any source: a tokenizer, training pairs and the eval set."""

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg

    @property
    def row_length(self) -> int:
        return self.cfg.row_length or self.cfg.max_sequence_length

    tokenizer: Tokenizer

    def validate(self) -> None:
        """Checks files and the eval set before the log is created."""

    def train_rows(self, ctx: InputContext) -> tf.data.Dataset:
        raise NotImplementedError

    def epoch_rows(self, ctx: InputContext) -> tf.data.Dataset | None:
        """One epoch of this host's rows, exactly `counted_rows` of them, for a tf.data service job (no
        Python callbacks, shuffled afresh per job); None when the source cannot give one."""
        return None

    def counted_rows(self) -> int | None:
        """Rows in one epoch when the source can count them exactly (a fixed corpus), else None."""
        return None

    @functools.cached_property
    def eval_set(self) -> tuple[list[list[int]], list[str]]:
        """(source ids with EOS, reference sentences), in eval-set order."""
        raise NotImplementedError

    def _rows(self, pairs: tf.data.Dataset, flush_at_end: bool = False) -> tf.data.Dataset:
        pairs = pairs.filter(packing.within_length(self.cfg.max_sequence_length))
        return packing.to_rows(pairs, self.row_length, self.cfg.packing, flush_at_end)


class SyntheticSource(Source):
    """The synthetic language (synthetic_language.py): a fixed corpus, packed once into a fixed set of rows, so
    an epoch is exactly one pass over them; the run seed only changes their order."""

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg)
        self.language = SyntheticLanguage(cfg.synthetic_seed)
        self.tokenizer = self.language

    @functools.cached_property
    def rows(self) -> dict[str, np.ndarray]:
        pairs = self.language.pairs("train", self.cfg.synthetic_train_pairs)
        ds = ragged_pairs([with_eos(self.tokenizer.encode(s)) for s, _ in pairs],
                          [with_eos(self.tokenizer.encode(t)) for _, t in pairs])
        rows = list(self._rows(ds, flush_at_end=True).batch(4096).as_numpy_iterator())
        if not rows:
            raise HarnessError(f"no synthetic training pair fits data.max_sequence_length="
                               f"{self.cfg.max_sequence_length}")
        return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}

    def counted_rows(self) -> int:
        return len(self.rows["inputs"])

    def train_rows(self, ctx: InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(self.rows).shard(ctx.num_hosts, ctx.host_id)
        return ds.shuffle(self.counted_rows(), seed=ctx.seed, reshuffle_each_iteration=True).repeat()

    def epoch_rows(self, ctx: InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(self.rows).shard(ctx.num_hosts, ctx.host_id)
        return ds.shuffle(self.counted_rows())

    @functools.cached_property
    def eval_set(self) -> tuple[list[list[int]], list[str]]:
        pairs = self.language.pairs("eval", self.cfg.eval_samples)
        return [with_eos(self.tokenizer.encode(s)) for s, _ in pairs], [t for _, t in pairs]


_LENGTH_SPEC = {"inputs": tf.io.VarLenFeature(tf.int64), "targets": tf.io.VarLenFeature(tf.int64)}


def _lengths(records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    ex = tf.io.parse_example(records, _LENGTH_SPEC)
    n = tf.size(records)
    return tuple(tf.math.bincount(tf.cast(ex[k].indices[:, 0], tf.int32), minlength=n, maxlength=n)
                 for k in ("inputs", "targets"))


def _pair_lengths(files: list[str]):
    """(inputs, targets) lengths of every pair, one record from each sorted file in turn."""
    ds = tf.data.Dataset.from_tensor_slices(sorted(files)).interleave(
        tf.data.TFRecordDataset, cycle_length=len(files), block_length=1)
    for n_in, n_tgt in ds.batch(4096).map(_lengths).as_numpy_iterator():
        yield from zip(n_in.tolist(), n_tgt.tolist())


def _read_lines(path: str, what: str) -> list[str]:
    if not path:
        raise HarnessError(f"data.{what} is required for data.source=tfrecord")
    if not os.path.isfile(path):
        raise HarnessError(f"data.{what} {path} does not exist")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


class TFRecordSource(Source):
    """The reference's files: `*encoded-train*` shards of tf.Examples with int64 `inputs`/`targets`
    (subword ids + EOS), the subword vocab they were encoded with, and raw newstest2014 for the eval."""

    SPEC = {"inputs": tf.io.VarLenFeature(tf.int64), "targets": tf.io.VarLenFeature(tf.int64)}

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg)
        self._tokenizer: Subtokenizer | None = None
        self._rows_counted: int | None = None

    @property
    def tokenizer(self) -> Subtokenizer:
        if self._tokenizer is None:
            if not self.cfg.vocab_file:
                raise HarnessError(f"data.vocab_file is required for data.source={self.cfg.source}")
            self._tokenizer = Subtokenizer.from_file(self.cfg.vocab_file)
        return self._tokenizer

    def files(self) -> list[str]:
        return list_files(self.cfg.data_dir, self.cfg.train_pattern, "the reference's encoded TFRecords")

    def validate(self) -> None:
        files = self.files()
        if first_record(files[0]) is None:
            raise HarnessError(f"{files[0]} holds no records")
        check_examples(files, self.SPEC, "int64 'inputs' and 'targets', the reference's encoded format")
        if self.cfg.train_samples:
            check_count("train_samples", self.cfg.train_samples, self.counted_rows(), "training rows",
                        f"{self.cfg.train_pattern} under {self.cfg.data_dir} (packed as data.packing, "
                        f"data.row_length and data.max_sequence_length say)")

    def counts(self) -> dict[str, int]:
        return {"train_samples": self.counted_rows(), "eval_samples": len(self.eval_set[0])}

    def counted_rows(self) -> int:
        """Rows one epoch packs into: the files' pairs read round-robin over the sorted shards (the order the
        reference-layout writers use), length-filtered and packed in that order. Counted from the pairs'
        lengths once, and cached beside the data keyed by the files and the packing settings."""
        if self._rows_counted is None:
            files, c = self.files(), self.cfg
            settings = {"row_length": self.row_length, "max_sequence_length": c.max_sequence_length,
                        "packing": c.packing}

            def count() -> int:
                try:
                    return packing.count_rows(_pair_lengths(files), self.row_length, c.max_sequence_length,
                                              c.packing)
                except tf.errors.OpError as e:  # a record that is not an Example of int64 lists
                    raise file_error(files, lambda f: sum(1 for _ in _pair_lengths([f])), e,
                                     f"{c.train_pattern} under {c.data_dir}") from None

            self._rows_counted = cached_count(files, "packed rows", settings, count)
        return self._rows_counted

    def parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        ex = tf.io.parse_single_example(record, self.SPEC)
        return {k: tf.cast(tf.sparse.to_dense(ex[k]), tf.int32) for k in self.SPEC}

    def parse_block(self, records: tf.Tensor) -> dict[str, tf.RaggedTensor]:
        """A block of records -> int32 RaggedTensors [records, None]: one vectorized parse, not one a record."""
        ex = tf.io.parse_example(records, self.SPEC)
        return {k: tf.cast(tf.RaggedTensor.from_sparse(ex[k]), tf.int32) for k in self.SPEC}

    def train_rows(self, ctx: InputContext) -> tf.data.Dataset:
        ds = sharded_records(self.files(), ctx, self.cfg.shuffle_buffer, cycle_length=self.cfg.parallel_reads,
                             deterministic=True)
        if not self.cfg.packing:
            return self._rows(ds.map(self.parse, num_parallel_calls=tf.data.AUTOTUNE))
        # Parsed, length-filtered and packed a block of records at a time (the same rows as pair by pair).
        blocks = ds.batch(packing.BLOCK).map(self.parse_block, num_parallel_calls=tf.data.AUTOTUNE)
        blocks = blocks.map(packing.within_length_block(self.cfg.max_sequence_length),
                            num_parallel_calls=tf.data.AUTOTUNE)
        return packing.pack_blocks(blocks, self.row_length)

    def epoch_rows(self, ctx: InputContext) -> tf.data.Dataset:
        """Packed: the rows `counted_rows` counts, packed from the pairs in that order (sorted shards read
        round-robin), in one tf.data service split (the rows depend on the order of every pair before them,
        so one worker packs a whole epoch), then shuffled; every epoch trains on the same rows in a fresh order.
        Unpacked (a row per pair, order-free): the shards are split between the workers."""
        c, files = self.cfg, self.files()
        if not c.packing:
            ds = sharded_records(files, ctx, c.shuffle_buffer, cycle_length=c.parallel_reads, deterministic=None,
                                 repeat=False)
            return self._rows(ds.map(self.parse, num_parallel_calls=tf.data.AUTOTUNE))
        if ctx.num_hosts > 1:
            raise HarnessError("data.service with the Transformer's packed TFRecords on several hosts: the rows "
                               "are counted over every shard in one order; preprocess locally or set "
                               "data.packing=false")
        parse, keep, length = self.parse_block, packing.within_length_block(c.max_sequence_length), self.row_length

        def whole_epoch(_: tf.Tensor) -> tf.data.Dataset:
            records = tf.data.Dataset.from_tensor_slices(sorted(files)).interleave(
                tf.data.TFRecordDataset, cycle_length=len(files), block_length=1)
            blocks = records.batch(packing.BLOCK).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            blocks = blocks.map(keep, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            return packing.pack_blocks(blocks, length, flush_at_end=True)

        return tf.data.Dataset.range(1).flat_map(whole_epoch).shuffle(c.shuffle_buffer)

    @functools.cached_property
    def eval_set(self) -> tuple[list[list[int]], list[str]]:
        sources = _read_lines(self.cfg.eval_source_file, "eval_source_file")
        references = _read_lines(self.cfg.eval_reference_file, "eval_reference_file")
        if len(references) != len(sources):
            raise HarnessError(f"data.eval_reference_file has {len(references)} lines but data.eval_source_file "
                               f"has {len(sources)}: they must be the same sentences")
        return [with_eos(self.tokenizer.encode(s)) for s in sources], references


class TFDSSource(TFRecordSource):
    """`wmt14_translate/de-en` (features 'en', 'de') from a local TFDS data dir, encoded on the host with
    the reference subword vocab; nothing is downloaded."""

    def builder(self) -> Any:
        import tensorflow_datasets as tfds
        if not self.cfg.data_dir:
            raise HarnessError("data.source=tfds needs data.data_dir (a local TFDS data dir)")
        try:
            builder = tfds.builder(self.cfg.tfds_name, data_dir=self.cfg.data_dir)
            builder.info  # noqa: B018 - touches the prepared metadata
        except Exception as e:  # noqa: BLE001 - tfds raises many kinds for a missing dataset
            raise HarnessError(f"TFDS dataset {self.cfg.tfds_name} is not prepared under {self.cfg.data_dir} "
                               f"({type(e).__name__}); nothing is downloaded at run time") from None
        return builder

    def load(self, split: str, shuffle: bool = False) -> tf.data.Dataset:
        import tensorflow_datasets as tfds
        try:
            return tfds.load(self.cfg.tfds_name, split=split, data_dir=self.cfg.data_dir, download=False,
                             shuffle_files=shuffle)
        except Exception as e:  # noqa: BLE001
            raise HarnessError(f"cannot read TFDS {self.cfg.tfds_name} split {split!r} from {self.cfg.data_dir}: "
                               f"{str(e).splitlines()[0][:200]}") from None

    def counts(self) -> dict[str, int]:
        raise HarnessError("data.source=tfds: counting the rows would encode the whole corpus on the host; "
                           "state data.train_samples")

    def counted_rows(self) -> None:
        """Counting would encode the whole corpus on the host: data.train_samples is required instead."""
        return None

    def epoch_rows(self, ctx: InputContext) -> None:
        """None: the pairs are encoded by Python (the subword tokenizer), which a service worker cannot run."""
        return None

    def validate(self) -> None:
        self.tokenizer  # noqa: B018 - a missing vocab file fails here
        if not self.cfg.train_samples:
            raise HarnessError("data.train_samples (training rows per epoch) is required for data.source=tfds")
        self.load(self.cfg.tfds_train_split)

    def _encode(self, text: tf.Tensor) -> tf.Tensor:
        def encode(t: bytes) -> np.ndarray:
            return np.asarray(with_eos(self.tokenizer.encode(t.decode("utf-8"))), np.int32)
        ids = tf.numpy_function(encode, [text], tf.int32, stateful=False)
        ids.set_shape([None])
        return ids

    def train_rows(self, ctx: InputContext) -> tf.data.Dataset:
        ds = self.load(self.cfg.tfds_train_split, shuffle=True).shard(ctx.num_hosts, ctx.host_id)
        ds = ds.shuffle(self.cfg.shuffle_buffer, seed=ctx.seed).repeat()
        ds = ds.map(lambda ex: {"inputs": self._encode(ex["en"]), "targets": self._encode(ex["de"])},
                    num_parallel_calls=tf.data.AUTOTUNE)
        return self._rows(ds)

    @functools.cached_property
    def eval_set(self) -> tuple[list[list[int]], list[str]]:
        sources, references = [], []
        for ex in self.load(self.cfg.tfds_eval_split).as_numpy_iterator():
            sources.append(with_eos(self.tokenizer.encode(ex["en"].decode("utf-8"))))
            references.append(ex["de"].decode("utf-8"))
        return sources, references


def make_source(cfg: DataConfig) -> Source:
    return {"synthetic": SyntheticSource, "tfrecord": TFRecordSource, "tfds": TFDSSource}[cfg.source](cfg)
