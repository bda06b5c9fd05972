"""Hugging Face checkpoints (safetensors, one file or shards with an index json, and `config.json`) in and
out of a model's runtime variables, through the safetensors numpy API (no torch at run time).

A model says how its variables and a checkpoint's tensors relate with a `Layout` (the per-model maps live
with the workloads: benchmarks/lm/hf_names.py, benchmarks/gpt_oss_20b/hf_names.py, benchmarks/bert/hf_names.py):
each variable is made from parts of one or more checkpoint tensors (`Entry`), each exported tensor from one
or more variables (`Out`). Import checks the whole checkpoint first (every missing, unexpected, mis-shaped
or unreadable tensor, and the config.json mismatches the layout reports) and refuses it in one line, before
any weight is touched; then it reads one variable at a time, file by file, so a checkpoint larger than the
host's memory loads as long as its largest variable fits. A variable split over a DTensor mesh is read block
by block (`Entry.block`, safetensors' get_slice: each local device's slice alone); otherwise it is built on
the host and each local device still receives only its slice (`assign_host`), never a full copy. Export
streams: each tensor is made and written on its own (`write_safetensors` writes the header from the shapes
first, then the data in order).

bfloat16 tensors are read and written as `ml_dtypes.bfloat16` (installed with TensorFlow; importing it
registers the dtype numpy needs for safetensors' BF16).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Any, Callable, Sequence

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy: safetensors' numpy API needs it for BF16)
import numpy as np

from harness.errors import HarnessError
from harness.nn.safetensors_header import read_header

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHOWN = 4  # problems named in the one-line refusal (then "and N more")

# safetensors dtype names <-> numpy
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
FLOATS = ("F64", "F32", "F16", "BF16")


@dataclasses.dataclass(frozen=True)
class Part:
    """Checkpoint tensor `name` of full shape `shape`; `rows`: only rows [a, b) of its first axis are used
    (read with get_slice, so a fused q/k/v tensor is never read whole for each of its parts)."""
    name: str
    shape: tuple[int, ...]
    rows: tuple[int, int] | None = None
    dtypes: tuple[str, ...] = FLOATS   # the stored dtypes accepted (MXFP4 blocks and scales are U8)


Index = tuple[slice, ...]


@dataclasses.dataclass(frozen=True)
class Entry:
    """Model variable `path` (shape `shape`) = to_var(*arrays of `parts`), in the variable's dtype after.
    `block(read, index)`: the block `index` of the variable read straight from the checkpoint
    (read(name, tensor index)), or None where that block is not one rectangular slice of the tensor; a
    sharded variable is then filled block by block, each device's slice read alone."""
    path: str
    shape: tuple[int, ...]
    parts: tuple[Part, ...]
    to_var: Callable[..., np.ndarray]
    block: Callable[[Callable[[str, Index], np.ndarray], Index], np.ndarray | None] | None = None


@dataclasses.dataclass(frozen=True)
class Out:
    """Exported tensor `name` (shape `shape`) = to_hf(*arrays of the variables `paths`)."""
    name: str
    shape: tuple[int, ...]
    paths: tuple[str, ...]
    to_hf: Callable[..., np.ndarray]


@dataclasses.dataclass(frozen=True)
class Neutral:
    """A checkpoint tensor the model has no variable for, accepted when its values change nothing: zero
    biases, attention sinks so low their softmax weight is exactly zero. `test` says whether an array is
    neutral; `fill` is what export writes for it (the model's own computation, in the checkpoint's form)."""
    name: str
    shape: tuple[int, ...]
    what: str                                  # "zero", "<= -1e4": for the error line
    test: Callable[[np.ndarray], bool]
    fill: Callable[[tuple[int, ...]], np.ndarray]


def zero_neutral(name: str, shape: tuple[int, ...]) -> Neutral:
    return Neutral(name, shape, "all zero", lambda a: not np.any(a), lambda s: np.zeros(s, np.float32))


SINK_FLOOR = -1e4  # a sink logit this low has exp(sink - max) == 0 in float32 beside logits of O(100)


def sink_neutral(name: str, shape: tuple[int, ...]) -> Neutral:
    return Neutral(name, shape, f"all <= {SINK_FLOOR:g}", lambda a: bool(np.all(a <= SINK_FLOOR)),
                   lambda s: np.full(s, -1e9, np.float32))


@dataclasses.dataclass
class Layout:
    """How one model maps to one checkpoint layout. `ignore`: checkpoint tensors that carry nothing the
    model needs (buffers, tied copies): neither loaded nor reported."""
    entries: list[Entry]
    outs: list[Out]
    neutral: list[Neutral] = dataclasses.field(default_factory=list)
    ignore: Callable[[str], bool] = lambda name: False
    # (LM head tensor, embedding tensor) where the head may be the embedding: a checkpoint without the head
    # is read tied only when its config.json says tie_word_embeddings (transformers' rule; these models'
    # configs default to false), and one that says so while holding a head of its own is refused (transformers
    # would use the embedding, the layout the head)
    tie: tuple[str, str] | None = None

    def expected(self) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
        """Checkpoint tensor name -> (shape, accepted dtypes) for every tensor some variable reads."""
        return {p.name: (p.shape, p.dtypes) for e in self.entries for p in e.parts}


# ---------------------------------------------------------------------------------------- transforms

def flat_range(shape: Sequence[int], index: Index) -> tuple[int, int] | None:
    """The range of the row-major flattening of `shape` that block `index` covers, when it is one range: at
    most one axis is cut, and every axis before it has size 1."""
    bounds = [s.indices(n)[:2] for s, n in zip(index, shape)]
    cut = [i for i, (a, b) in enumerate(bounds) if (a, b) != (0, shape[i])]
    if len(cut) > 1 or (cut and any(shape[i] != 1 for i in range(cut[0]))):
        return None
    if not cut:
        return 0, math.prod(shape)
    inner = math.prod(shape[cut[0] + 1:])
    a, b = bounds[cut[0]]
    return a * inner, b * inner


def direct(path: str, shape: tuple[int, ...], part: Part) -> Entry:
    """A variable that is the tensor itself (reshaped only when the shapes differ)."""
    def block(read, index):
        if tuple(part.shape) == tuple(shape):
            return read(part.name, index)
        rows = flat_range(shape, index)   # a reshape: only a contiguous run of the flat tensor is a block
        if rows is None or len(part.shape) != 1:
            return None
        return read(part.name, (slice(*rows),)).reshape([s.indices(n)[1] - s.indices(n)[0]
                                                         for s, n in zip(index, shape)])
    return Entry(path, shape, (part,), same(shape), block)


def transposed(path: str, shape: tuple[int, ...], part: Part) -> Entry:
    """A kernel [in..., out...] of `shape` from a torch Linear weight [out, in] (`linear`); a block of it is one
    rectangle of the weight when its in axes and its out axes each cover one flat range."""
    first, n_in = (part.rows or (0, 0))[0], part.shape[1]
    split = next(k for k in range(len(shape) + 1) if math.prod(shape[:k]) == n_in)

    def block(read, index):
        cols, rows = flat_range(shape[:split], index[:split]), flat_range(shape[split:], index[split:])
        if cols is None or rows is None:
            return None
        dims = [s.indices(n)[1] - s.indices(n)[0] for s, n in zip(index, shape)]
        rows = slice(first + rows[0], first + rows[1])   # a part of a fused tensor starts at its own rows
        return np.ascontiguousarray(read(part.name, (rows, slice(*cols))).T).reshape(dims)
    return Entry(path, shape, (part,), linear(shape), block)


def linear(shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """A torch Linear weight [out, in] -> a kernel [in, ...] of `shape` (transposed, then reshaped)."""
    return lambda w: np.ascontiguousarray(w.T).reshape(shape)


def linear_out(rows: int) -> Callable[[np.ndarray], np.ndarray]:
    """The inverse of `linear`: a kernel [in, ...] -> a Linear weight [out, in] with `rows` input rows."""
    return lambda k: np.ascontiguousarray(k.reshape(rows, -1).T)


def same(shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: np.asarray(a).reshape(shape)


class Checker:
    """Collects config.json mismatches against the model config, one line each."""

    def __init__(self, hf: dict[str, Any]) -> None:
        self.hf, self.problems = hf, []

    def same(self, key: str, want: Any, model_key: str, default: Any = None, close: bool = False) -> None:
        got = self.hf.get(key, default)
        if got is None:
            self.problems.append(f"config.json has no {key} (the model has {model_key}={want})")
        elif close and (isinstance(got, bool) or not isinstance(got, (int, float))):
            self.problems.append(f"config.json {key}={got!r} is not a number (the model has {model_key}={want})")
        elif type(got) is not type(want) and not (close and isinstance(want, (int, float))) and \
                not (isinstance(got, int) and isinstance(want, float)):
            # "64" is not 64: transformers would fail on (or misread) the string; name the type
            self.problems.append(f"config.json {key}={got!r} is {type(got).__name__}, not {type(want).__name__} "
                                 f"(the model has {model_key}={want!r})")
        elif (not math.isclose(float(got), float(want), rel_tol=1e-6)) if close else got != want:
            self.problems.append(f"config.json {key}={got}, the model has {model_key}={want}")

    def flag(self, key: str, default: Any, want: Any, why: str) -> None:
        got = self.hf.get(key, default)
        if got != want:
            self.problems.append(f"config.json {key}={got}: {why}")


def problems_line(where: str, problems: list[str]) -> HarnessError:
    shown = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
    return HarnessError(f"{where}: {len(problems)} problem(s): {shown}")


# ---------------------------------------------------------------------------------------- reading

def files_for(stem: str) -> tuple[str, str]:
    """(single file, index json) of a checkpoint whose weights are named `stem` (transformers: model;
    diffusers: diffusion_pytorch_model)."""
    return f"{stem}.safetensors", f"{stem}.safetensors.index.json"


def is_hf_dir(path: str, stem: str = "model") -> bool:
    """A Hugging Face checkpoint directory: config.json beside <stem>.safetensors or its index."""
    single, index = files_for(stem)
    return os.path.isdir(path) and os.path.exists(os.path.join(path, CONFIG)) and (
        os.path.exists(os.path.join(path, single)) or os.path.exists(os.path.join(path, index)))


class Checkpoint:
    """A checkpoint directory, read lazily: names, shapes and dtypes from the file headers; tensors (or row
    ranges of them) one at a time. Files are found through the index's weight_map, never by their names."""

    def __init__(self, path: str, what: str = "checkpoint", stem: str = "model") -> None:
        from safetensors import safe_open

        self.path, self.what = path, what
        self.single, index_name = files_for(stem)
        self._open = safe_open
        if not os.path.isdir(path):
            raise HarnessError(f"{what} {path}: no such directory")
        cfg_path = os.path.join(path, CONFIG)
        if not os.path.exists(cfg_path):
            raise HarnessError(f"{what} {path}: no {CONFIG} (a Hugging Face checkpoint directory has one)")
        self.config = self._json(cfg_path)
        index = os.path.join(path, index_name)
        if os.path.exists(index):
            weight_map = self._json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise HarnessError(f"{what} {index}: no weight_map")
            odd = [n for n, f in weight_map.items() if not isinstance(f, str) or os.path.basename(f) != f]
            if odd:
                raise HarnessError(f"{what} {index}: weight_map must give each tensor a file name in the "
                                   f"directory ({odd[0]!r} -> {weight_map[odd[0]]!r})")
            self.files = {name: os.path.join(path, f) for name, f in weight_map.items()}
        elif os.path.exists(os.path.join(path, self.single)):
            self.files = None
        else:
            raise HarnessError(f"{what} {path}: neither {self.single} nor {index_name}")
        self.meta = self._headers()

    def _json(self, path: str) -> dict[str, Any]:
        try:
            with open(path) as f:
                out = json.load(f)
        except (OSError, ValueError) as e:
            raise HarnessError(f"{self.what} {path}: not readable JSON ({e})") from None
        if not isinstance(out, dict):
            raise HarnessError(f"{self.what} {path}: not a JSON object")
        return out

    def _headers(self) -> dict[str, tuple[str, tuple[int, ...], str]]:
        """name -> (file, shape, safetensors dtype), from each file's header only."""
        files = sorted(set(self.files.values())) if self.files else [os.path.join(self.path, self.single)]
        meta = {}
        for file in files:
            try:
                header = read_header(file)
            except (OSError, ValueError) as e:
                raise HarnessError(f"{self.what} {file}: not a readable safetensors file ({e})") from None
            for name, info in header.items():
                if name != "__metadata__":
                    meta[name] = (file, tuple(info["shape"]), info["dtype"])
        if self.files:
            missing = [n for n, f in self.files.items() if n not in meta or meta[n][0] != f]
            if missing:
                raise HarnessError(f"{self.what} {self.path}: the index names {len(missing)} tensor(s) not in "
                                   f"the file it gives ({', '.join(missing[:SHOWN])})")
        return meta

    def read(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        if rows is None:
            with self._open(self.meta[name][0], framework="np") as f:
                return f.get_tensor(name)
        return self.read_block(name, (slice(*rows),))

    def read_block(self, name: str, index: Index) -> np.ndarray:
        """Block `index` of tensor `name`, read without the rest of it."""
        with self._open(self.meta[name][0], framework="np") as f:
            return f.get_slice(name)[index]


def check(ckpt: Checkpoint, layout: Layout, config_problems: list[str]) -> list[str]:
    """Every problem of loading `ckpt` into `layout`: config.json mismatches first, then per tensor."""
    problems = list(config_problems)
    expected = layout.expected()
    if layout.tie:
        head, embedding = layout.tie
        tied = ckpt.config.get("tie_word_embeddings", False)
        if head not in ckpt.meta and tied is not True:
            problems.append(f"tensor {head} missing (config.json tie_word_embeddings={tied}: transformers does not "
                            f"tie it to {embedding}, so the LM head has no weight)")
        elif head in ckpt.meta and tied is True:
            problems.append(f"tensor {head} present but config.json tie_word_embeddings=true: transformers ties "
                            f"the LM head to {embedding} and ignores it")
    neutral = {n.name: n for n in layout.neutral}
    for name, (shape, dtypes) in expected.items():
        if name not in ckpt.meta:
            problems.append(f"tensor {name} missing")
            continue
        _, got, dtype = ckpt.meta[name]
        if got != shape:
            problems.append(f"tensor {name} has shape {list(got)}, the model needs {list(shape)}")
        elif dtype not in dtypes:
            problems.append(f"tensor {name} has dtype {dtype} (supported here: {', '.join(dtypes)})")
    for name in ckpt.meta:
        if name in expected or layout.ignore(name):
            continue
        if name in neutral:
            n = neutral[name]
            if ckpt.meta[name][1] != n.shape:
                problems.append(f"tensor {name} has shape {list(ckpt.meta[name][1])}, expected {list(n.shape)}")
            elif not n.test(ckpt.read(name).astype(np.float32)):
                problems.append(f"tensor {name}: the model has no such weight, so it must be {n.what}")
            continue
        problems.append(f"tensor {name} unexpected (the model has no weight for it)")
    return problems


def load(runtime: Any, ckpt: Checkpoint, layout: Layout, config_problems: list[str]) -> int:
    """Checks, then fills every layout variable of `runtime` from `ckpt`; returns the variables filled."""
    variables = {v.path: v.variable for v in runtime.variables()}
    problems = [f"model variable {e.path} does not exist (layout and model disagree)"
                for e in layout.entries if e.path not in variables]
    problems += check(ckpt, layout, config_problems)
    for e in layout.entries:
        if e.path in variables and tuple(variables[e.path].shape) != e.shape:
            problems.append(f"model variable {e.path} has shape {list(variables[e.path].shape)}, the layout "
                            f"says {list(e.shape)}")
    if problems:
        raise problems_line(f"{ckpt.what} {ckpt.path}", problems)
    # File by file (a variable's first part decides): each shard is visited once.
    order = sorted(layout.entries, key=lambda e: ckpt.meta[e.parts[0].name][0])
    for e in order:
        var = variables[e.path]
        if e.block is not None and assign_blocks(var, lambda index: e.block(ckpt.read_block, index)):
            continue
        value = e.to_var(*[ckpt.read(p.name, p.rows) for p in e.parts])
        if tuple(value.shape) != e.shape:
            raise HarnessError(f"{ckpt.what} {ckpt.path}: {e.path} came out as {list(value.shape)}, "
                               f"not {list(e.shape)}")
        assign_host(var, np.asarray(value).astype(var.dtype.as_numpy_dtype))
        del value
    return len(order)


# ---------------------------------------------------------------------------------------- variables

def assign_host(var: Any, value: np.ndarray) -> None:
    """Sets `var` to the host array `value`. A DTensor variable: each local device gets only its slice of
    the stored layout (FSDP shards included), packed onto the mesh; any other variable: one assign (a
    mirrored or TPU variable copies it to its replicas)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    current = var.read_value()
    if not dtensor.is_dtensor(current):
        var.assign(value)
        return
    layout = dtensor.fetch_layout(current)
    parts = [tf.constant(value[local_slice(value.shape, layout, loc)])
             for loc in layout.mesh.local_device_locations()]
    with tf.device(dtensor.device_name()):
        var.assign(dtensor.pack(parts, layout))


def assign_blocks(var: Any, block: Callable[[Index], np.ndarray | None]) -> bool:
    """Fills a sharded DTensor variable from `block(index)`, one read per distinct local block (replicated
    copies share it). False, touching nothing, when the variable is not split or a block is not readable
    alone (the caller then builds the whole value)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    current = var.read_value()
    if not dtensor.is_dtensor(current):
        return False
    layout = dtensor.fetch_layout(current)
    if all(spec == dtensor.UNSHARDED for spec in layout.sharding_specs):
        return False
    shape, dtype = tuple(var.shape), var.dtype.as_numpy_dtype
    blocks: dict[tuple, np.ndarray] = {}
    indices = [local_slice(shape, layout, loc) for loc in layout.mesh.local_device_locations()]
    for index in indices:
        key = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
        if key not in blocks:
            value = block(index)
            if value is None:
                return False
            blocks[key] = np.asarray(value).astype(dtype)
    parts = [tf.constant(blocks[tuple(s.indices(n)[:2] for s, n in zip(index, shape))]) for index in indices]
    with tf.device(dtensor.device_name()):
        var.assign(dtensor.pack(parts, layout))
    return True


def local_slice(shape: Sequence[int], layout: Any, location: dict[str, int]) -> tuple[slice, ...]:
    """The index of the block a device at mesh `location` holds of a tensor of `shape` in `layout`."""
    from tensorflow.experimental import dtensor

    index = []
    for axis, spec in enumerate(layout.sharding_specs):
        if spec == dtensor.UNSHARDED:
            index.append(slice(None))
        else:
            n = layout.mesh.dim_size(spec)
            size = shape[axis] // n
            index.append(slice(location[spec] * size, (location[spec] + 1) * size))
    return tuple(index)


def host_value(var: Any) -> np.ndarray:
    """A variable's whole value on this host, assembled from its local shards (a DTensor) or read."""
    from tensorflow.experimental import dtensor

    current = var.read_value()
    if not dtensor.is_dtensor(current):
        return np.asarray(current.numpy())
    layout = dtensor.fetch_layout(current)
    out = np.empty(tuple(var.shape), var.dtype.as_numpy_dtype)
    filled = np.zeros(out.shape, bool) if out.size else None
    for loc, part in zip(layout.mesh.local_device_locations(), dtensor.unpack(current)):
        index = local_slice(out.shape, layout, loc)
        out[index] = part.numpy()
        if filled is not None:
            filled[index] = True
    if filled is not None and not filled.all():
        raise HarnessError(f"variable {var.name}: this host holds only part of it (a mesh over several hosts); "
                           "weights are written from one host only")
    return out


# ---------------------------------------------------------------------------------------- writing

def write_safetensors(path: str, tensors: Sequence[tuple[str, tuple[int, ...], Any]],
                      produce: Callable[[str], np.ndarray], metadata: dict[str, str] | None = None) -> int:
    """Writes a safetensors file tensor by tensor: the header from `tensors` (name, shape, numpy dtype), then
    each `produce(name)` in that order (only one in memory at a time). Returns the bytes of tensor data."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, shape, dtype in tensors:
        n = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": NAMES[np.dtype(dtype)], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the library writes it
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, dtype in tensors:
            value = np.ascontiguousarray(np.asarray(produce(name)).astype(dtype, copy=False))
            if tuple(value.shape) != tuple(shape):
                raise HarnessError(f"{path}: tensor {name} came out as {list(value.shape)}, not {list(shape)}")
            f.write(value.tobytes())
    os.replace(tmp, path)
    return offset


def parse_size(text: str) -> int:
    """'5GB', '500MB', '20KB' or bytes -> bytes (decimal units, as transformers' max_shard_size)."""
    units = {"TB": 10 ** 12, "GB": 10 ** 9, "MB": 10 ** 6, "KB": 10 ** 3, "B": 1}
    s = str(text).strip().upper()
    for unit, scale in units.items():
        if s.endswith(unit) and s[:-len(unit)].strip().replace(".", "", 1).isdigit():
            size = int(float(s[:-len(unit)]) * scale)
            if size > 0:
                return size
    if s.isdigit() and int(s) > 0:
        return int(s)
    raise HarnessError(f"max shard size {text!r}: give a positive number of bytes or a size such as 5GB, 500MB, "
                       f"20KB")


def write_checkpoint(out_dir: str, tensors: Sequence[tuple[str, tuple[int, ...], Any]],
                     produce: Callable[[str], np.ndarray], config: dict[str, Any], max_shard_bytes: int,
                     stem: str = "model") -> list[str]:
    """A Hugging Face checkpoint directory: `config.json`, and `<stem>.safetensors` when everything fits in
    one shard of `max_shard_bytes`, else `<stem>-0000i-of-0000N.safetensors` (tensors in order, a tensor
    larger than a shard alone in its own) and `<stem>.safetensors.index.json` (metadata.total_size,
    weight_map). Returns the files written."""
    single, index = files_for(stem)
    os.makedirs(out_dir, exist_ok=True)
    shards: list[list[tuple[str, tuple[int, ...], Any]]] = [[]]
    size = 0
    for t in tensors:
        n = math.prod(t[1]) * np.dtype(t[2]).itemsize
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    written = []
    with open(os.path.join(out_dir, CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    written.append(CONFIG)
    if len(shards) == 1:
        write_safetensors(os.path.join(out_dir, single), shards[0], produce)
        return written + [single]
    weight_map, total, params = {}, 0, 0
    for i, shard in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(os.path.join(out_dir, name), shard, produce)
        params += sum(math.prod(t[1]) for t in shard)
        weight_map.update({t[0]: name for t in shard})
        written.append(name)
    with open(os.path.join(out_dir, index), "w") as f:
        json.dump({"metadata": {"total_parameters": params, "total_size": total}, "weight_map": weight_map},
                  f, indent=2)
        f.write("\n")
    return written + [index]


def export_tensors(layout: Layout, read: Callable[[str], np.ndarray],
                   dtype: Any) -> tuple[list[tuple[str, tuple[int, ...], Any]], Callable[[str], np.ndarray]]:
    """(tensor list, producer) for `write_checkpoint`: each `Out` from the variables `read` returns, and each
    neutral tensor (one the model has no weight for) filled with what the model computes."""
    outs = {o.name: o for o in layout.outs}
    fills = {n.name: n for n in layout.neutral if n.name not in outs}
    names = [(o.name, o.shape, dtype) for o in layout.outs] + [(n.name, n.shape, dtype) for n in fills.values()]

    def produce(name: str) -> np.ndarray:
        if name in outs:
            o = outs[name]
            return o.to_hf(*[read(p) for p in o.paths])
        return fills[name].fill(fills[name].shape)

    return names, produce


def variables_file_tensors(file: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """A harness weights file's tensors: path -> (shape, dtype)."""
    try:
        header = read_header(file)
    except (OSError, ValueError) as e:
        raise HarnessError(f"{file}: not a readable safetensors file ({e})") from None
    return {k: (tuple(v["shape"]), v["dtype"]) for k, v in header.items() if k != "__metadata__"}


# ---------------------------------------------------------------------------------------- per workload

@dataclasses.dataclass(frozen=True)
class Format:
    """A workload's Hugging Face form, from its model config section alone (no model needs to exist):
    `layout(model_cfg, checkpoint tensor names, have(variable path))`, `config_problems(config.json, model_cfg)`
    and `config(run config, dtype name)` for export; `stem`: the weights files' name (`files_for`)."""
    layout: Callable[[Any, set[str], Callable[[str], bool]], Layout]
    config_problems: Callable[[dict[str, Any], Any], list[str]]
    config: Callable[[Any, str], dict[str, Any]]
    stem: str = "model"


def check_config(path: str, fmt: Format, model_cfg: Any, what: str = "model.init_checkpoint") -> Checkpoint:
    """The checks that need no model (before the log opens): a checkpoint directory whose config.json
    matches the model config and whose tensors (from the file headers) have the names, shapes and dtypes
    the model's layout needs. Layout entries a model option adds are taken as present here (their tensors'
    shapes do not depend on it); whether a tensor the model lacks is neutral is read at load."""
    ckpt = Checkpoint(path, what, fmt.stem)
    problems = check(ckpt, fmt.layout(model_cfg, set(ckpt.meta), lambda p: True),
                     fmt.config_problems(ckpt.config, model_cfg))
    if problems:
        raise problems_line(f"{what} {path}", problems)
    return ckpt


def load_into(runtime: Any, path: str, fmt: Format, model_cfg: Any, what: str = "model.init_checkpoint") -> int:
    """Loads checkpoint directory `path` into the runtime's variables (after the model is built)."""
    ckpt = Checkpoint(path, what, fmt.stem)
    paths = {v.path for v in runtime.variables()}
    layout = fmt.layout(model_cfg, set(ckpt.meta), lambda p: p in paths)
    return load(runtime, ckpt, layout, fmt.config_problems(ckpt.config, model_cfg))
