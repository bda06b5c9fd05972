"""flux1's inputs: the reference's precomputed embeddings, or a learnable synthetic set for smokes.

`embeddings`: the MLPerf downloads flux-1-cc12m-preprocessed (training) and flux-1-coco-preprocessed
(validation), each a Hugging Face `datasets` folder written by `Dataset.save_to_disk`: Arrow IPC stream shards
(`*.arrow`) beside dataset_info.json and state.json (torchtitan 9603aa83 experiments/flux/scripts/
preprocess_flux_dataset.py, dataset/flux_dataset.py). Every row holds, as the bytes of an `.npy` file (np.save),
a uint16 array that is the bit pattern of a bfloat16 tensor: `t5_encodings` [256, 4096] (T5-v1.1-XXL's last
hidden state), `clip_encodings` [768] (CLIP-L's pooled text), `mean` and `logvar` [16, 32, 32] (the VAE
posterior's moments); and `timestep` (int32, 0..7, validation rows only). The empty prompt's encodings
(flux-1-empty-encodings: t5_empty.npy [1, 256, 4096] and clip_empty.npy [1, 768], float16) replace a training
sample's text with probability data.cfg_dropout.

Both sources hand the device the same features: uint16 bfloat16 bits, which the device turns into numbers
(`decode`) exactly, with the stored shapes. The `.npy` header is not parsed per row: the shapes are fixed, so
each array is the last n x 2 bytes of its blob (the header's shape is checked once per file).

Order (torchtitan dataset/flux_dataset.py: datasets' split_dataset_by_node on a map-style dataset, unshuffled,
`infinite=True`): each data-parallel replica reads one contiguous chunk of the rows in stored order and loops
over it; the global batch of step k holds, for every replica r, the next `local batch` rows of chunk r. The
validation set is read whole, in stored order, once per eval.

`synthetic`: a learnable stand-in, said so everywhere a run reports: `synthetic_classes` captions, each a fixed
random T5 / CLIP pattern and a fixed latent mean (logvar small), so the velocity is predictable from the text
and the noisy latent, and a small model gets below the benchmark's loss in a few hundred steps.
"""
from __future__ import annotations

import io
import json
import os
from typing import Any, Iterator

import ml_dtypes
import numpy as np
import tensorflow as tf

from harness.errors import HarnessError
from harness.runtime.base import InputContext
from harness.train import datafiles

COLUMNS = ("t5_encodings", "clip_encodings", "mean", "logvar")
FEATURES = ("t5", "clip", "mean", "logvar")
EMPTY_FILES = ("t5_empty.npy", "clip_empty.npy")


def shapes(d: Any, m: Any) -> dict[str, tuple[int, ...]]:
    """Each feature's stored shape, from the data and model sections."""
    c, s = d.latent_channels, d.latent_size
    return {"t5": (d.text_tokens, m.context_in_dim), "clip": (m.vec_in_dim,), "mean": (c, s, s), "logvar": (c, s, s)}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float values -> the uint16 bit patterns of their bfloat16 roundings (round to nearest even)."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def decode_np(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> their float32 values (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def decode(bits: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """uint16 bfloat16 bit patterns -> values in `dtype` (exact: every bfloat16 is a float32)."""
    return tf.cast(tf.bitcast(bits, tf.bfloat16), dtype)


def npy_tail(blob: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """The uint16 array of an `.npy` blob of known shape: its last prod(shape) x 2 bytes."""
    n = int(np.prod(shape))
    return np.frombuffer(blob, np.uint16, count=n, offset=len(blob) - 2 * n).reshape(shape)


def check_npy(blob: bytes, shape: tuple[int, ...], what: str) -> None:
    """One blob's `.npy` header against the expected uint16 array (once per file)."""
    try:
        arr = np.load(io.BytesIO(blob), allow_pickle=False)
    except (ValueError, OSError) as e:
        raise HarnessError(f"{what}: not an .npy array ({e})") from None
    if arr.dtype != np.uint16 or tuple(arr.shape) != tuple(shape):
        raise HarnessError(f"{what}: holds {arr.dtype} {list(arr.shape)}, the reference's layout is uint16 (bfloat16 "
                           f"bits) {list(shape)}")


# -------------------------------------------------------------------------------------- arrow shards

def open_table(path: str):
    """A shard's rows (a pyarrow Table over the memory-mapped file: nothing is read until used)."""
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(pa.memory_map(path, "r")).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise HarnessError(f"{path}: not an Arrow IPC stream shard of a datasets folder ({e})") from None


def arrow_rows(files: list[str]) -> int:
    """Rows in the shards (read from their record batches' lengths)."""
    return sum(open_table(f).num_rows for f in files)


class Table:
    """The rows of a set of shards, in file then row order, each column read by row index."""

    def __init__(self, files: list[str], feature_shapes: dict[str, tuple[int, ...]], with_timestep: bool) -> None:
        import pyarrow as pa

        tables = [open_table(f) for f in files]
        need = list(COLUMNS) + (["timestep"] if with_timestep else [])
        for f, t in zip(files, tables):
            missing = [c for c in need if c not in t.column_names]
            if missing:
                raise HarnessError(f"{f}: no column(s) {', '.join(missing)} (the reference's columns: "
                                   f"{', '.join(need)})")
            if t.num_rows:
                for col, feat in zip(COLUMNS, FEATURES):
                    check_npy(t.column(col)[0].as_py(), feature_shapes[feat], f"{f} row 0 column {col}")
        self.table = pa.concat_tables([t.select(need) for t in tables])
        self.rows = self.table.num_rows
        self.shapes = feature_shapes
        self.columns = {c: self.table.column(c) for c in need}

    def row(self, i: int) -> dict[str, np.ndarray]:
        out = {feat: npy_tail(self.columns[col][i].as_py(), self.shapes[feat]) for col, feat in zip(COLUMNS, FEATURES)}
        if "timestep" in self.columns:
            k = self.columns["timestep"][i].as_py()
            out["timestep"] = np.int32(-1 if k is None else k)
        return out


def replica_order(rows: int, replicas: int, local_batch: int, first: int, count: int) -> Iterator[int]:
    """Row indices in the reference's order for replicas [first, first + count) of `replicas`: contiguous chunks,
    each looped over forever; per step, each of these replicas' next `local_batch` rows in turn."""
    bounds = [rows * r // replicas for r in range(replicas + 1)]
    step = 0
    while True:
        for r in range(first, first + count):
            start, length = bounds[r], bounds[r + 1] - bounds[r]
            for j in range(local_batch):
                yield start + (step * local_batch + j) % length
        step += 1


def signature(feature_shapes: dict[str, tuple[int, ...]], eval_set: bool) -> dict[str, tf.TensorSpec]:
    """A training example: the features and its `slot` (position in the global batch); a validation example: the
    features, its stored timestep index and its index in the set."""
    spec = {k: tf.TensorSpec(v, tf.uint16) for k, v in feature_shapes.items()}
    if eval_set:
        spec.update(timestep=tf.TensorSpec([], tf.int32), index=tf.TensorSpec([], tf.int64))
    else:
        spec["slot"] = tf.TensorSpec([], tf.int64)
    return spec


def with_slots(ds: tf.data.Dataset, ctx: InputContext, replicas: int, local_batch: int) -> tf.data.Dataset:
    """Each training example's `slot`: its position in the GLOBAL batch of its step, which keys its draws
    (flow.py). This host's pipeline holds, per step, its replicas' batches in turn (`replica_order`): under a
    tf.distribute strategy the runtime hands consecutive per-replica batches of it to the local replicas in
    turn, on a mesh the host batch is sliced the same way, so example i of the stream sits at host_id x host
    batch + i mod host batch in the global batch whatever the layout. Carried with the example, not made on
    the device (tf.range would count each replica's or device's own rows)."""
    host_batch = replicas // ctx.num_hosts * local_batch
    first = ctx.host_id * host_batch
    return ds.enumerate().map(lambda i, x: {**x, "slot": first + i % host_batch})


# ------------------------------------------------------------------------------------------- sources

class EmbeddingsSource:
    """The reference's precomputed embeddings (module docstring)."""

    def __init__(self, d: Any, m: Any) -> None:
        self.d, self.shapes = d, shapes(d, m)
        self._tables: dict[str, Table] = {}

    def files(self, which: str) -> list[str]:
        pattern = self.d.train_pattern if which == "train" else self.d.eval_pattern
        return datafiles.list_files(self.d.data_dir, pattern, f"the flux1 {which} embeddings")

    def table(self, which: str) -> Table:
        if which not in self._tables:
            self._tables[which] = Table(self.files(which), self.shapes, which == "eval")
        return self._tables[which]

    def counts(self) -> dict[str, int]:
        return {"train_samples": arrow_rows(self.files("train")),
                "eval_samples": arrow_rows(self.files("eval"))}

    def validate(self) -> None:
        train, evals = self.table("train"), self.table("eval")
        d = self.d
        if d.train_samples and d.train_samples != train.rows:
            raise HarnessError(f"data.train_samples={d.train_samples} but the training shards hold {train.rows} rows; "
                               f"set data.train_samples=0 (counted from the files)")
        if evals.rows < d.eval_samples:
            raise HarnessError(f"data.eval_samples={d.eval_samples} but the validation shards hold {evals.rows} rows")
        self.empty()

    @property
    def train_samples(self) -> int:
        return self.d.train_samples or self.table("train").rows

    def empty(self) -> dict[str, np.ndarray]:
        """The empty prompt's encodings as bfloat16 bits (stored float16, cast to bfloat16 on load)."""
        out = {}
        for name, feat in zip(EMPTY_FILES, ("t5", "clip")):
            path = os.path.join(self.d.data_dir, self.d.empty_dir, name)
            try:
                arr = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise HarnessError(f"{path}: cannot read the empty prompt's encodings ({e})") from None
            arr = arr.reshape(arr.shape[1:]) if arr.ndim == len(self.shapes[feat]) + 1 else arr
            if tuple(arr.shape) != self.shapes[feat]:
                raise HarnessError(f"{path}: shape {list(arr.shape)}, expected {list(self.shapes[feat])} (or with "
                                   f"a leading 1)")
            out[feat] = bf16_bits(arr.astype(np.float32))
        return out

    def train(self, ctx: InputContext, replicas: int, local_batch: int) -> tf.data.Dataset:
        table = self.table("train")
        per_host = replicas // ctx.num_hosts

        def gen():
            for i in replica_order(table.rows, replicas, local_batch, ctx.host_id * per_host, per_host):
                yield table.row(i)
        spec = {k: v for k, v in signature(self.shapes, False).items() if k != "slot"}
        rows = tf.data.Dataset.from_generator(lambda: ({k: r[k] for k in spec} for r in gen()), output_signature=spec)
        return with_slots(rows, ctx, replicas, local_batch)

    def eval_records(self) -> tf.data.Dataset:
        table = self.table("eval")
        spec = signature(self.shapes, True)

        def gen():
            for i in range(min(self.d.eval_samples, table.rows)):
                row = table.row(i)
                row["index"] = np.int64(i)
                yield row
        return tf.data.Dataset.from_generator(gen, output_signature=spec)


class SyntheticSource:
    """A learnable synthetic set (module docstring): sample i has caption i mod classes; the validation set's
    sample i has timestep index i mod eval_timesteps, as the reference's (timestep = arange(N) % 8)."""

    def __init__(self, d: Any, m: Any) -> None:
        self.d, self.shapes = d, shapes(d, m)
        rng = np.random.default_rng(d.synthetic_seed)
        k = d.synthetic_classes
        self.t5 = bf16_bits(rng.normal(size=(k,) + self.shapes["t5"]))
        self.clip = bf16_bits(rng.normal(size=(k,) + self.shapes["clip"]))
        self.mean = bf16_bits(rng.normal(size=(k,) + self.shapes["mean"]))
        self.logvar = bf16_bits(np.full((k,) + self.shapes["logvar"], -6.0))
        self.empty_bits = {f: bf16_bits(np.zeros(self.shapes[f])) for f in ("t5", "clip")}

    def counts(self) -> dict[str, int]:
        return {}

    def validate(self) -> None:
        pass

    @property
    def train_samples(self) -> int:
        return self.d.train_samples or self.d.synthetic_train_samples

    def empty(self) -> dict[str, np.ndarray]:
        return self.empty_bits

    def _rows(self, n: int) -> dict[str, np.ndarray]:
        c = np.arange(n) % self.d.synthetic_classes
        return {"t5": self.t5[c], "clip": self.clip[c], "mean": self.mean[c], "logvar": self.logvar[c]}

    def train(self, ctx: InputContext, replicas: int, local_batch: int) -> tf.data.Dataset:
        n = self.train_samples
        rows = self._rows(n)
        per_host = replicas // ctx.num_hosts
        # a new iterator per call: a mesh runs one copy of this pipeline per local replica, each from the start
        index = tf.data.Dataset.from_generator(
            lambda: replica_order(n, replicas, local_batch, ctx.host_id * per_host, per_host),
            output_signature=tf.TensorSpec([], tf.int64))
        table = {k: tf.constant(v) for k, v in rows.items()}
        return with_slots(index.map(lambda i: {k: tf.gather(v, i) for k, v in table.items()}), ctx, replicas,
                          local_batch)

    def eval_records(self) -> tf.data.Dataset:
        n = self.d.eval_samples
        rows = self._rows(n)
        rows["timestep"] = (np.arange(n) % self.d.eval_timesteps).astype(np.int32)
        rows["index"] = np.arange(n, dtype=np.int64)
        return tf.data.Dataset.from_tensor_slices(rows)


def make_source(d: Any, m: Any):
    return SyntheticSource(d, m) if d.source == "synthetic" else EmbeddingsSource(d, m)


def write_shard(path: str, rows: list[dict[str, np.ndarray]], keys: list[str]) -> None:
    """Writes rows in the reference's layout as one Arrow IPC stream shard (what `datasets` save_to_disk writes;
    for tests and small local sets): each array as the bytes of an .npy file, `timestep` when rows carry it."""
    import pyarrow as pa

    def blob(a: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.save(buf, np.asarray(a, np.uint16))
        return buf.getvalue()

    cols = {"__key__": pa.array(keys, pa.string())}
    for col, feat in zip(COLUMNS, FEATURES):
        cols[col] = pa.array([blob(r[feat]) for r in rows], pa.binary())
    cols["timestep"] = pa.array([int(r["timestep"]) if "timestep" in r else None for r in rows], pa.int32())
    table = pa.table(cols)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with open(os.path.join(os.path.dirname(path), "state.json"), "w") as f:
        json.dump({"_data_files": [{"filename": os.path.basename(path)}]}, f)
