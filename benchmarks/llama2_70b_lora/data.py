"""Rows of `seq_length` tokens with their labels (-100: not scored), from two sources.

- `parquet`: the MLPerf reference's files (SCROLLS GovReport, tokenized and packed by the reference: 3901 train
  and 173 validation rows of 8192 tokens), columns `input_ids` and `labels`, each a list of integer ids per row.
  Rows are used as the files hold them: no repacking, no padding, positions 0..seq-1, the loss mask taken from
  `labels` alone. Read once into memory with pyarrow (3901 x 8192 x 2 int32 = 256 MB) and checked whole
  before the run, so a wrong file is one line naming it rather than an op error mid-run.
- `synthetic`: examples `BOS x_1..x_P SEP y_1..y_P EOS` with prompt tokens x drawn from a small alphabet and
  y_i = perm(x_i) for a seeded permutation (`data.synthetic_map_seed`), packed end to end into rows (an example
  may cross a row boundary, as the reference's packing does; the remainder is dropped). Eval labels score only
  the answers (prompt and the final EOS are -100, as the reference's validation split); train labels score
  every token or only the answers (`data.synthetic_train_labels`). An ideal model's eval loss is 0, one that
  has not learned the map scores about ln(alphabet) (`chance_loss`), and a base trained on another map's rows
  scores well above that: it answers confidently by the wrong map. Measured on a plain-TensorFlow stand-in of
  the CPU smoke's model (2 layers, d 64, 4/2 heads, vocab 64, rows of 128, random base of init std 0.2,
  LoRA r 16 on fused qkv and o, lr 1e-2, batch 8): alphabet 4 went from 4.6-5.6 to 0.31-1.44 in 100 steps and
  0.15 in 200 (two seeds); alphabet 8 was still at 1.7 after 300 and alphabet 16 at 1.35 after 500.

Training rows are split over hosts by index (host h takes rows h, h + H, ...) and each host's share is shuffled
whole every epoch from the run seed, as the reference's random sampler draws a fresh permutation per epoch.
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf

from harness.errors import HarnessError
from harness.runtime.base import InputContext
from harness.train.workload import INDEX, MASK

from benchmarks.llama2_70b_lora.data_config import LoraDataConfig
from benchmarks.llama2_70b_lora.rules import REFERENCE_EVAL_ROWS, REFERENCE_TRAIN_ROWS

__all__ = ["LoraData", "LoraDataConfig", "read_parquet", "write_parquet", "synthetic_rows", "IGNORE"]

IGNORE = -100  # label of a position the loss skips (the reference's, Hugging Face's ignore_index)
BOS, EOS, SEP = 1, 2, 3  # Llama-2's BOS and EOS; SEP ends a synthetic prompt
FIRST_WORD = 4  # the synthetic alphabet's first token id
COLUMNS = ("input_ids", "labels")


# ------------------------------------------------------------------------------------------- parquet

def write_parquet(path: str, input_ids: np.ndarray, labels: np.ndarray, attention_mask: bool = False,
                  dtype: type = np.int32) -> None:
    """Rows [n, seq] of token ids and labels as a parquet file in the reference's schema (one list of ids per
    row and column); `attention_mask` adds an all-ones column of that name."""
    input_ids, labels = np.asarray(input_ids), np.asarray(labels)
    if input_ids.shape != labels.shape or input_ids.ndim != 2:
        raise ValueError(f"input_ids {input_ids.shape} and labels {labels.shape} must both be [rows, seq]")
    n, seq = input_ids.shape

    def column(values: np.ndarray) -> pa.Array:
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * seq)
        return pa.ListArray.from_arrays(offsets, pa.array(values.astype(dtype).reshape(-1)))

    arrays = {"input_ids": column(input_ids), "labels": column(labels)}
    if attention_mask:
        arrays["attention_mask"] = column(np.ones_like(input_ids))
    pq.write_table(pa.table(arrays), path)


def _rows(path: str, table: pa.Table, name: str, seq_length: int) -> np.ndarray:
    """Column `name` as an array [rows, seq_length] of its own integer type, or one line saying what is wrong."""
    col = table.column(name).combine_chunks() if table.num_rows else None
    if col is None:
        return np.zeros([0, seq_length], np.int64)
    if col.null_count:
        raise HarnessError(f"{path}: column {name} has {col.null_count} null rows")
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(lengths != seq_length)
    if bad.size:
        raise HarnessError(f"{path}: {bad.size} of {len(lengths)} rows of {name} do not hold {seq_length} tokens "
                           f"(the configured sequence length; row {bad[0]} holds {lengths[bad[0]]})")
    values = col.flatten()
    if values.null_count:
        raise HarnessError(f"{path}: column {name} holds {values.null_count} null values")
    return values.to_numpy(zero_copy_only=False).reshape(len(lengths), seq_length)


def read_parquet(path: str, seq_length: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, labels) int32 [rows, seq_length] of a file in the reference's schema, checked whole: every
    row of both columns `seq_length` long, ids in [0, vocab_size), each label -100 or its position's id, and an
    `attention_mask` column, if there is one, all ones (the reference's rows are unpadded; this pipeline
    applies no attention mask). Any other column is ignored."""
    if not os.path.isfile(path):
        raise HarnessError(f"{path} does not exist (data.data_dir and data.train_file / data.eval_file)")
    try:
        pfile = pq.ParquetFile(path)
        schema = pfile.schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise HarnessError(f"{path} is not a readable parquet file ({str(e).splitlines()[0]})") from None
    names = list(schema.names)
    wanted = [*COLUMNS, *(["attention_mask"] if "attention_mask" in names else [])]
    for name in wanted:
        if name not in names:
            raise HarnessError(f"{path} has no column {name} (it has {', '.join(names) or 'none'}); expected "
                               f"the reference's input_ids and labels")
        kind = schema.field(name).type
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
        if not listed or not (pa.types.is_integer(kind.value_type) or
                              (name == "attention_mask" and pa.types.is_boolean(kind.value_type))):
            raise HarnessError(f"{path}: column {name} is {kind}, expected a list of integer token ids per row")
    try:
        table = pfile.read(columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise HarnessError(f"{path} could not be read ({str(e).splitlines()[0]})") from None
    ids = _rows(path, table, "input_ids", seq_length)
    labels = _rows(path, table, "labels", seq_length)
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise HarnessError(f"{path}: input_ids holds token id {lo if lo < 0 else hi}, outside the model's "
                               f"vocabulary of {vocab_size}")
        bad = (labels != IGNORE) & ((labels < 0) | (labels >= vocab_size))
        if bad.any():
            row, pos = (int(i[0]) for i in np.nonzero(bad))
            raise HarnessError(f"{path}: labels holds {int(labels[row, pos])} (row {row}, position {pos}); each "
                               f"label must be {IGNORE} (not scored) or a token id below {vocab_size}")
        # The reference's labels are the row's own tokens (the model shifts them): pre-shifted labels would
        # train every position on the wrong target without any other sign.
        bad = (labels != IGNORE) & (labels != ids)
        if bad.any():
            row, pos = (int(i[0]) for i in np.nonzero(bad))
            raise HarnessError(f"{path}: labels differ from input_ids at {int(bad.sum())} scored positions (row "
                               f"{row}, position {pos}: label {int(labels[row, pos])}, token {int(ids[row, pos])}); "
                               f"each label must be {IGNORE} or the token at its own position (not shifted)")
    if "attention_mask" in wanted:
        mask = _rows(path, table, "attention_mask", seq_length)
        zeros = int(mask.size - np.count_nonzero(mask))
        if zeros:
            raise HarnessError(f"{path}: attention_mask has {zeros} zeros (padding), which this pipeline does "
                               f"not apply: the reference's packed rows are all real tokens")
    return ids.astype(np.int32, copy=False), labels.astype(np.int32, copy=False)


def count_rows(path: str) -> int:
    """Rows of a parquet file, from its footer alone."""
    if not os.path.isfile(path):
        raise HarnessError(f"{path} does not exist (data.data_dir and data.train_file / data.eval_file)")
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as e:
        raise HarnessError(f"{path} is not a readable parquet file ({str(e).splitlines()[0]})") from None


# ----------------------------------------------------------------------------------------- synthetic

def answer_map(seed: int, alphabet: int) -> np.ndarray:
    """perm[x - FIRST_WORD] is the answer token to prompt token x."""
    rng = np.random.default_rng([seed, 0x10A4])
    return (FIRST_WORD + rng.permutation(alphabet)).astype(np.int32)


def synthetic_rows(seed: int, split: int, rows: int, seq_length: int, alphabet: int, prompt_len: int,
                   score_prompts: bool, map_seed: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """`rows` packed rows (input_ids, labels) for `split` (0 train, 1 eval), answers by the map of `map_seed`
    (-1: `seed`); labels are -100 on each example's BOS, prompt and SEP and on its final EOS unless
    `score_prompts` (then every label is the token itself)."""
    perm = answer_map(seed if map_seed < 0 else map_seed, alphabet)
    length = 2 * prompt_len + 3
    count = math.ceil(rows * seq_length / length)
    rng = np.random.default_rng([seed, split, 0x5EED])
    prompts = FIRST_WORD + rng.integers(alphabet, size=[count, prompt_len], dtype=np.int32)
    examples = np.concatenate([np.full([count, 1], BOS, np.int32), prompts, np.full([count, 1], SEP, np.int32),
                               perm[prompts - FIRST_WORD], np.full([count, 1], EOS, np.int32)], axis=1)
    scored = np.zeros([length], bool)
    scored[prompt_len + 2:length - 1] = True
    labels = examples if score_prompts else np.where(scored, examples, IGNORE).astype(np.int32)
    take = rows * seq_length
    return (examples.reshape(-1)[:take].reshape(rows, seq_length),
            labels.reshape(-1)[:take].reshape(rows, seq_length))


# -------------------------------------------------------------------------------------------- source

class LoraData:
    """Training rows (split over hosts, shuffled per epoch, repeated) and the fixed eval rows of one config.

    The harness's loop batches training examples and pads the eval set itself: a workload returns
    `train_examples` from `Workload.train_dataset`, `train_examples(ctx, repeat=False)` from
    `train_epoch_dataset`, and `eval_records` / `eval_parse` from the methods of those names.
    `train_dataset` and `eval_dataset` are the same data batched (and padded) as the loop batches it, for
    scripts and tests that run without the loop.
    """

    def __init__(self, cfg_data: LoraDataConfig, seq_length: int, vocab_size: int) -> None:
        self.cfg, self.seq_length, self.vocab_size = cfg_data, seq_length, vocab_size
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    # ---------------------------------------------------------------------------------- facts
    @property
    def data_source(self) -> str:
        """'parquet' or 'synthetic'."""
        return self.cfg.source

    @property
    def is_synthetic(self) -> bool:
        return self.cfg.source == "synthetic"

    def path(self, split: str) -> str:
        return os.path.join(self.cfg.data_dir, self.cfg.train_file if split == "train" else self.cfg.eval_file)

    def counts(self) -> dict[str, int]:
        """Rows the parquet files hold, by the data key each belongs in ({} for synthetic data)."""
        if self.is_synthetic:
            return {}
        return {"train_samples": count_rows(self.path("train")), "eval_samples": count_rows(self.path("eval"))}

    @property
    def train_samples(self) -> int:
        c = self.cfg
        if c.train_samples:
            return c.train_samples
        return c.synthetic_train_rows if self.is_synthetic else count_rows(self.path("train"))

    @property
    def eval_samples(self) -> int:
        return self.cfg.eval_samples

    def chance_loss(self) -> float:
        """Eval loss (nats per answer token) of a model that knows the synthetic alphabet but not the map."""
        return math.log(self.cfg.synthetic_alphabet)

    def ideal_eval_loss(self) -> float:
        """Synthetic: the eval loss of a model that knows the map, averaged over rows as the benchmark's metric
        is. Only answers whose prompt token was cut off into the previous row are unpredictable (ln(alphabet)
        each); rows with no scored position are left out, as the metric leaves them."""
        c = self.cfg
        labels = self.arrays("eval")[1][:, 1:]  # position t's label is predicted at t - 1: label 0 is never scored
        scored = labels != IGNORE
        cut = np.arange(1, self.seq_length) < c.synthetic_prompt_len + 1  # its prompt token lies before the row
        counts = scored.sum(axis=1)
        keep = counts > 0
        lost = (scored & cut[None, :]).sum(axis=1)
        return float(np.mean(lost[keep] / counts[keep]) * self.chance_loss()) if keep.any() else 0.0

    def example_spec(self) -> dict[str, tf.TensorSpec]:
        """One unbatched example, as `train_examples` and `eval_parse` give it."""
        return {k: tf.TensorSpec([self.seq_length], tf.int32) for k in COLUMNS}

    def stand_in_rows(self, cfg: Any) -> tuple[int, str]:
        """A dry run's training rows where the parquet files are not read: the reference's train file's."""
        return REFERENCE_TRAIN_ROWS, "the reference's train file's"

    # ------------------------------------------------------------------------------- checking
    def validate(self, closed: bool = False) -> None:
        """Checks the source before any log exists (one HarnessError line): for parquet, both files read whole
        (schema, row lengths, ids and labels; `read_parquet`) and holding the stated counts, which the closed
        division fixes at the reference's 3901 / 173 rows."""
        c = self.cfg
        if self.is_synthetic:
            need = FIRST_WORD + c.synthetic_alphabet
            if need > self.vocab_size:
                raise HarnessError(f"data.synthetic_alphabet={c.synthetic_alphabet} needs a vocabulary of at least "
                                   f"{need} (ids 0-3 are special), the model has {self.vocab_size}")
            return
        if not c.data_dir:
            raise HarnessError("data.source=parquet needs data.data_dir (the folder of the reference's "
                               f"{c.train_file} and {c.eval_file})")
        if not os.path.isdir(c.data_dir):
            raise HarnessError(f"data.data_dir {c.data_dir} does not exist")
        for split, key, reference in (("train", "train_samples", REFERENCE_TRAIN_ROWS),
                                      ("eval", "eval_samples", REFERENCE_EVAL_ROWS)):
            path, stated = self.path(split), getattr(c, key)
            held = count_rows(path)
            if closed and held != reference:
                raise HarnessError(f"{path} holds {held} rows; the closed division needs the reference's "
                                   f"{reference} (use the MLPerf files or submission.division=open)")
            if stated and stated != held:
                raise HarnessError(f"data.{key}={stated} but {path} holds {held} rows; set data.{key}={held}")
            if held < 1:
                raise HarnessError(f"{path} holds no rows")
            _, labels = self.arrays(split)
            # The model scores label p with the prediction at p - 1 (shifted): a first-position label never counts.
            if not np.any(labels[:, 1:] != IGNORE):
                use = "training has nothing to learn from" if split == "train" else "eval would score nothing"
                raise HarnessError(f"{path}: every label past each row's first position is {IGNORE} (not scored): "
                                   f"{use}")

    # ------------------------------------------------------------------------------------ rows
    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, labels) int32 [rows, seq] of 'train' or 'eval', read or generated once."""
        if split not in self._cache:
            c = self.cfg
            if self.is_synthetic:
                rows = self.train_samples if split == "train" else self.eval_samples
                score_prompts = split == "train" and c.synthetic_train_labels == "all"
                self._cache[split] = synthetic_rows(c.synthetic_seed, 0 if split == "train" else 1, rows,
                                                    self.seq_length, c.synthetic_alphabet, c.synthetic_prompt_len,
                                                    score_prompts, c.synthetic_map_seed)
            else:
                self._cache[split] = read_parquet(self.path(split), self.seq_length, self.vocab_size)
        return self._cache[split]

    # -------------------------------------------------------------------------------- datasets
    def host_rows(self, ctx: InputContext) -> tf.data.Dataset:
        """Indices of this host's training rows (h, h + H, ...), in order."""
        return tf.data.Dataset.range(len(self.arrays("train")[0])).shard(ctx.num_hosts, ctx.host_id)

    def train_examples(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """This host's rows {"input_ids", "labels"} unbatched, its whole share shuffled afresh every epoch from
        the run seed and repeated (`repeat=False`: one epoch, each row once, shuffled afresh per tf.data service
        job). TensorFlow ops only: the tf.data service's workers can run it."""
        ids, labels = (tf.constant(a) for a in self.arrays("train"))
        index = self.host_rows(ctx)
        share = max(1, int(index.cardinality()))
        index = index.shuffle(share, seed=ctx.seed if repeat else None, reshuffle_each_iteration=True)
        if repeat:
            index = index.repeat()
        return index.map(lambda i: {"input_ids": tf.gather(ids, i), "labels": tf.gather(labels, i)},
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """`train_examples` under the name the other decoder sources use."""
        return self.train_examples(ctx, repeat)

    def train_dataset(self, ctx: InputContext) -> tf.data.Dataset:
        """Endless batches of `ctx.batch_size` of `train_examples` (the loop batches them so itself)."""
        return self.train_examples(ctx).batch(ctx.batch_size, drop_remainder=True)

    def eval_records(self, ctx: InputContext | None = None) -> tf.data.Dataset:
        """The eval rows in file order, unbatched: the whole set on every host (the loop takes each host's share
        after padding, so `ctx` changes nothing)."""
        ids, labels = self.arrays("eval")
        return tf.data.Dataset.from_tensor_slices({"input_ids": ids, "labels": labels})

    def eval_parse(self, record: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {k: record[k] for k in COLUMNS}

    def eval_dataset(self, ctx: InputContext) -> tf.data.Dataset:
        """One pass of this host's eval batches, as the loop's eval input pads them: the set padded with copies
        of row 0 to a whole number of global batches (ctx.batch_size per host x ctx.num_hosts), each example
        carrying MASK (1 real, 0 padding) and INDEX (its row, -1 for padding), each host a contiguous share."""
        n = self.eval_samples
        global_batch = ctx.batch_size * ctx.num_hosts
        padded = math.ceil(n / global_batch) * global_batch
        records = self.eval_records()
        real = records.take(n).enumerate().map(lambda i, r: (r, tf.constant(1.0), i))
        pad = records.take(1).repeat().map(lambda r: (r, tf.constant(0.0), tf.constant(-1, tf.int64)))
        per_host = padded // ctx.num_hosts
        ds = real.concatenate(pad).take(padded).skip(ctx.host_id * per_host).take(per_host)

        def parse(record: dict[str, tf.Tensor], mask: tf.Tensor, index: tf.Tensor) -> dict[str, tf.Tensor]:
            return {**self.eval_parse(record), MASK: mask, INDEX: index}

        return ds.map(parse).batch(ctx.batch_size, drop_remainder=True)
