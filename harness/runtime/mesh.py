"""DTensor mesh runtime: data x model parallelism (the Mesh-TensorFlow idea) behind the Runtime interface.

Each variable's named dimensions are mapped to mesh dimensions through `runtime.layout` (for example
{batch: data, heads: model, ff: model, vocab: model}); unnamed or unmapped dimensions are replicated.
Inputs arrive with their batch dimension sharded on the batch mesh dimension, so every reduction the
model does over the batch is already global: `sum`, `mean` and gradient all-reduce are identities, and
DTensor inserts the collectives. Everything runs inside tf.functions executed under the mesh.

FSDP (`runtime.fsdp`, ZeRO-3 style): every variable is additionally split over the batch mesh dimension
on one of its dimensions (see `MeshRuntime.storage_layout`), so weights, their gradients and the optimizer
slots made with the same dims are 1/data per device; a weight is gathered (all-gather) to its compute
layout where the model reads it, and its gradient comes back reduced into the shard. The split dimension
is the largest one the data size divides (`fsdp_axis`); scalars and variables with no such dimension stay
replicated. A `ShardedDVariable`'s tensor reads (`value()`, `tf.gather`) are all-gathered to the compute
layout once per weight per step, its gradient is all-reduced over data and sliced to the shard (DTensor
fuses the two to a reduce-scatter where they are adjacent), and optimizer updates run on the shards. On
GPUs a bfloat16 all-gather lowers to zero-fill + all-reduce. FSDP has never run on an accelerator.

Several hosts are DTensor clients (`DTENSOR_NUM_CLIENTS` and its siblings) of one
`create_distributed_mesh`, TPU or GPU only (never run): each host batch is sliced into its local replicas'
batches, so DTensorDataset's auto-shard leaves them whole on any host count.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.runtime.base import InputContext, Runtime, after_zero, one_hot_take_along_axis1

BATCH = "batch"
REPLICATED = "replicated"  # a layout value that keeps a named dimension whole on every device


def _slicer(parts: int, rows: int) -> Callable[..., tf.data.Dataset]:
    """flat_map function: one batch of `parts * rows` -> `parts` consecutive batches of `rows`, each with a
    static batch dimension (DTensorDataset requires one, even from a pipeline that did not drop remainders)."""

    def split(*batch: Any) -> tf.data.Dataset:
        value = batch[0] if len(batch) == 1 else batch
        return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(
            lambda t: tf.reshape(t, tf.concat([[parts, rows], tf.shape(t)[1:]], 0)), value))

    return split


def fsdp_axis(shape: tuple[int, ...] | list[int], split: list[bool], n: int) -> int | None:
    """The dimension FSDP splits `n` ways: the largest not already `split` that `n` divides (the first on a
    tie); None if there is none (the variable stays whole over the data axis). The dry run uses it too."""
    free = [axis for axis, size in enumerate(shape) if not split[axis] and size % n == 0]
    return max(free, key=lambda a: (shape[a], -a)) if free else None


class ShardedDVariable(dtensor.DVariable):
    """A DVariable stored in a layout (`storage_layout`) that the model never computes with: every read
    as a tensor (`value()`: tf.cast(v), v * x, tf.matmul(x, v), convert_to_tensor) is relaid to the
    variable's compute layout, i.e. gathered over the FSDP axis (DTensorAllGather). The gradient of that
    Relayout is a relayout back to the stored layout, so gradients arrive as shards. `read_value()` stays
    in the stored layout: optimizers read and update their 1/N share of the weight with no communication.
    """

    compute_layout: dtensor.Layout | None = None

    def value(self) -> tf.Tensor:
        stored = super().value()
        return stored if self.compute_layout is None else dtensor.relayout(stored, self.compute_layout)

    def sparse_read(self, indices: Any, name: str | None = None) -> tf.Tensor:
        # tf.gather(variable, ids) reads rows straight from the variable (ResourceGather); from a shard,
        # its data-split rows would conflict with the batch's split downstream. Gather from the weight.
        return tf.gather(self.value(), indices, name=name)

    def gather_nd(self, indices: Any, name: str | None = None) -> tf.Tensor:
        return tf.gather_nd(self.value(), indices, name=name)


class MeshRuntime(Runtime):
    kind = "mesh"
    laid_out = True

    def __init__(self, mesh: dtensor.Mesh, sizes: dict[str, int], layout: dict[str, str], device_type: str,
                 precision: str, jit_compile: str, fsdp: bool = False) -> None:
        self.mesh = mesh
        self.sizes = dict(sizes)
        self.rules = dict(layout)
        self.batch_dim = self.rules.get(BATCH, "data")
        self.fsdp = fsdp
        self._device_type = device_type
        self._broadcast_fn: Callable | None = None
        super().__init__(precision, jit_compile)

    # ----------------------------------------------------------------------------- description
    @property
    def num_replicas(self) -> int:
        return self.sizes[self.batch_dim]

    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def num_hosts(self) -> int:
        return dtensor.num_clients()

    @property
    def host_id(self) -> int:
        return dtensor.client_id()

    @property
    def description(self) -> str:
        shape = " x ".join(f"{k}={v}" for k, v in self.sizes.items())
        return f"mesh {shape} on {math.prod(self.sizes.values())} {self.device_type} device(s)"

    def program_batch(self, global_batch: int) -> int:
        """One SPMD program holds the global batch (DTensor splits it underneath)."""
        return global_batch

    def batch_norm_group(self, span: int, replica_batch: int, what: str = "model.bn_span") -> int:
        """Statistics over a sharded batch are global here: the only span is the global batch."""
        global_batch = replica_batch * self.num_replicas
        if span not in (0, global_batch):
            raise HarnessError(f"{what}={span}: on a mesh runtime batch norm spans the global batch "
                               f"({global_batch}); set it to 0 or {global_batch}")
        return self.num_replicas

    def layout_for(self, dims: tuple[str | None, ...]) -> dtensor.Layout:
        """Named tensor dimensions -> a Layout; a mesh dimension is used at most once per tensor."""
        specs, used = [], set()
        for name in dims:
            mesh_dim = self.rules.get(name) if name else None
            if mesh_dim and mesh_dim in self.sizes and mesh_dim not in used and self.sizes[mesh_dim] > 1:
                specs.append(mesh_dim)
                used.add(mesh_dim)
            else:
                specs.append(dtensor.UNSHARDED)
        return dtensor.Layout(specs, self.mesh)

    def storage_layout(self, shape: tuple[int, ...], dims: tuple[str | None, ...]) -> dtensor.Layout:
        """Where a variable lives: its compute layout (`layout_for(dims)`) and, with FSDP, the batch mesh
        dimension on the largest dimension that is not already split and that the batch mesh size divides
        (the first such on a tie). A variable with no such dimension (scalars, a bias or norm scale whose
        size the data axis does not divide, a dimension already on the model axis that is the only one
        large enough) stays as its compute layout says: replicated over the data axis, which
        `fsdp_replicated_bytes` counts."""
        layout = self.layout_for(dims)
        n = self.sizes.get(self.batch_dim, 1)
        specs = list(layout.sharding_specs)
        if not self.fsdp or n == 1 or self.batch_dim in specs:
            return layout
        axis = fsdp_axis(shape, [spec != dtensor.UNSHARDED for spec in specs], n)
        if axis is None:
            return layout
        specs[axis] = self.batch_dim
        return dtensor.Layout(specs, self.mesh)

    def read(self, variable: tf.Variable) -> tf.Tensor:
        return variable.value()  # a ShardedDVariable's value() is gathered to its compute layout

    def read_after(self, variable: tf.Variable, after: tf.Tensor) -> tf.Tensor:
        layout = getattr(variable, "compute_layout", None)
        if layout is None:
            return super().read_after(variable, after)
        return dtensor.relayout(variable.read_value() + after_zero(after, variable.dtype), layout)  # tie, gather

    def fsdp_replicated_bytes(self) -> int:
        """Bytes of variables (any, optimizer slots included) that FSDP could not split over the data axis
        (each device holds them whole, or as their model-axis shard)."""
        total = 0
        for info in self.variables():
            layout = dtensor.fetch_layout(info.variable.read_value())
            if self.batch_dim not in layout.sharding_specs:
                total += info.variable.shape.num_elements() * info.variable.dtype.size
        return total

    # ------------------------------------------------------------------------------ variables
    def scope(self) -> Any:
        return contextlib.nullcontext()

    def _make_variable(self, path, shape, dims, initializer, trainable, dtype, sync) -> tf.Variable:
        layout = self.layout_for(dims)
        for axis, spec in enumerate(layout.sharding_specs):
            if spec != dtensor.UNSHARDED and shape[axis] % self.sizes[spec]:
                raise HarnessError(f"variable {path}: dimension '{dims[axis]}' of size {shape[axis]} does not "
                                   f"divide over mesh dimension {spec}={self.sizes[spec]}")
        stored = self.storage_layout(shape, dims)
        # The value is computed once on the host, as on any runtime, then split: same numbers everywhere.
        value = initializer(shape, dtype)
        if stored == layout:
            return dtensor.DVariable(self.to_mesh(value, layout), trainable=trainable, name=path)
        var = ShardedDVariable(self.to_mesh(value, stored), trainable=trainable, name=path)
        var.compute_layout = layout
        return var

    def to_mesh(self, value: Any, layout: dtensor.Layout) -> tf.Tensor:
        """A host tensor -> a DTensor with `layout` (replicate, then keep each device's slice)."""
        value = tf.convert_to_tensor(value)
        replicated = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(self.mesh, value.shape.rank))
        return dtensor.relayout(replicated, layout)

    def local_shapes(self, variable: tf.Variable) -> list[tuple[int, ...]]:
        """The shape of the shard each device holds."""
        return [tuple(t.shape) for t in dtensor.unpack(variable.read_value())]

    # ------------------------------------------------------------------------------ execution
    def distribute_dataset(self, dataset_fn: Callable[[InputContext], tf.data.Dataset],
                           global_batch: int, seed: int) -> Any:
        self.check_batch(global_batch)
        per_host = self.host_batch(global_batch)
        per_replica = global_batch // self.num_replicas
        ds = dataset_fn(InputContext(num_hosts=self.num_hosts, host_id=self.host_id, batch_size=per_host,
                                     seed=seed))
        # DTensorDataset wants per-replica batches: each of this host's L local replicas reads its own
        # copy of the stream, auto-sharded to every L-th element (DATA policy). Each host batch is sliced
        # into L consecutive per-replica batches, so local replica i gets rows [i*B/L, (i+1)*B/L) and the
        # global batch holds the same examples, in the same order, as one device's batch would. Not
        # `rebatch`: given the global replica count, auto-sharding rewrites a rebatch to host batch /
        # global replicas, right only on one host (tests/test_mesh_hosts.py).
        ds = ds.flat_map(_slicer(per_host // per_replica, per_replica))
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds = ds.with_options(options)
        layouts = tf.nest.map_structure(
            lambda s: dtensor.Layout.batch_sharded(self.mesh, self.batch_dim, s.shape.rank), ds.element_spec)
        return dtensor.DTensorDataset(ds, mesh=self.mesh, layouts=layouts, global_batch_size=global_batch,
                                      dataset_already_batched=True, batch_dim=self.batch_dim, prefetch=2)

    def run(self, fn: Callable, args: tuple) -> Any:
        return fn(*args)

    def sum(self, per_replica: Any) -> Any:
        return per_replica

    def mean(self, per_replica: Any) -> Any:
        return per_replica

    def replica_all_sum(self, tensors: Any, group_size: int) -> Any:
        return tensors  # batch statistics over a sharded batch are global already

    def take_along_axis1(self, x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        return one_hot_take_along_axis1(x, index)  # DTensor's layout pass rejects gather with batch_dims

    def place(self, t: tf.Tensor, dims) -> tf.Tensor:
        if len(dims) != t.shape.rank:
            raise ValueError(f"place: dims {tuple(dims)} do not match a tensor of rank {t.shape.rank}")
        # `batch` maps to the batch mesh dimension like any other named dimension.
        return dtensor.relayout(t, self.layout_for(tuple(dims)))

    def gather(self, per_replica: Any) -> Any:
        return tf.nest.map_structure(
            lambda t: dtensor.relayout(t, dtensor.Layout.replicated(self.mesh, t.shape.rank)), per_replica)

    def to_host(self, value: Any) -> np.ndarray:
        if isinstance(value, tf.Tensor) and dtensor.is_dtensor(value):
            return dtensor.unpack(value)[0].numpy()  # replicated: every device holds the whole value
        return np.asarray(value)

    def broadcast_from_chief(self, value: np.ndarray) -> np.ndarray:
        """A sum over every device of the mesh where only the chief's first device holds `value`: each
        device holds one block of a tensor sharded over all mesh dimensions, so DTensor all-reduces it
        across clients (hosts) as it does any reduction."""
        value = np.asarray(value)
        if self.num_hosts == 1:
            return value
        if self._broadcast_fn is None:
            dims = list(self.sizes)

            def total(blocks: tf.Tensor) -> tf.Tensor:
                out = tf.reduce_sum(blocks, axis=list(range(len(dims))))
                return dtensor.relayout(out, dtensor.Layout.replicated(self.mesh, out.shape.rank))

            self._broadcast_fn = self.function(total)
        local = self.mesh.local_devices()
        parts = [tf.constant(value if self.is_chief and i == 0 else np.zeros_like(value), tf.float64)
                 for i in range(len(local))]
        parts = [tf.reshape(p, [1] * len(self.sizes) + list(value.shape)) for p in parts]
        layout = dtensor.Layout(list(self.sizes) + [dtensor.UNSHARDED] * value.ndim, self.mesh)
        with tf.device(dtensor.device_name()):
            blocks = dtensor.pack(parts, layout)
        return self.to_host(self._broadcast_fn(blocks)).reshape(value.shape)

    def function(self, fn: Callable) -> Callable:
        # The host loop stays a plain tf.function; XLA, where it applies, goes on replica_function.
        compiled = tf.function(fn)
        mesh = self.mesh

        def call(*args: Any, **kwargs: Any) -> Any:
            with dtensor.default_mesh(mesh):
                return compiled(*args, **kwargs)

        call.compiled = compiled  # type: ignore[attr-defined]
        return call

    def replica_function(self, fn: Callable) -> Callable:
        # DTensor on CPU ignores jit_compile (no XLA module is built; measured with an XLA dump), and on
        # TPU it always compiles: only a GPU mesh takes the flag. make_mesh says so on a CPU mesh.
        if self.jit_compile and self.device_type == "GPU":
            return tf.function(fn, jit_compile=True)
        return fn


def make_mesh(cfg: RuntimeConfig) -> MeshRuntime:
    """Builds the mesh from `cfg.mesh` over CPUs (logical devices), GPUs or TPU cores, checking sizes."""
    from harness.runtime.distribute import configure_logical_cpus

    sizes = {str(k): int(v) for k, v in cfg.mesh.items()}
    if not sizes or any(v < 1 for v in sizes.values()):
        raise HarnessError(f"runtime.mesh={cfg.mesh}: every mesh dimension needs a size >= 1")
    layout = dict(cfg.layout) or {BATCH: "data"}
    layout.setdefault(BATCH, "data")
    if layout[BATCH] not in sizes:
        raise HarnessError(f"runtime.layout.batch={layout[BATCH]!r} must name a mesh dimension "
                           f"({', '.join(sizes)}): the batch is what data parallelism splits")
    for name, mesh_dim in layout.items():
        if mesh_dim not in sizes and mesh_dim != REPLICATED:
            raise HarnessError(f"runtime.layout.{name}={mesh_dim!r} is not a mesh dimension "
                               f"(runtime.mesh has {', '.join(sizes)}; or use '{REPLICATED}')")
    wanted = math.prod(sizes.values())
    shape = " x ".join(f"{k}={v}" for k, v in sizes.items())
    if tf.config.list_physical_devices("TPU"):
        device_type = "TPU"
    elif tf.config.list_physical_devices("GPU"):
        device_type = "GPU"
    else:
        device_type = "CPU"
    # Several hosts (a TPU pod slice, GPU hosts) are DTensor clients: each process is started with
    # DTENSOR_CLIENT_ID, DTENSOR_NUM_CLIENTS, DTENSOR_JOB_NAME and DTENSOR_JOBS, and the mesh spans the
    # devices of all of them. Never run here (one host, no accelerator).
    clients = dtensor.num_clients()
    if clients > 1 and device_type == "CPU":
        raise HarnessError(f"DTENSOR_NUM_CLIENTS={clients}: a mesh over several hosts needs TPUs or GPUs; "
                           "DTensor's multi-client collectives over CPUs fail in this TensorFlow")
    local = max(cfg.cpu_devices, 1) if device_type == "CPU" else len(tf.config.list_physical_devices(device_type))
    have = local * clients
    if wanted != have:
        hint = f"; set runtime.cpu_devices={wanted}" if device_type == "CPU" else ""
        hosts = f" ({clients} hosts x {local})" if clients > 1 else ""
        raise HarnessError(f"runtime.mesh {shape} needs {wanted} devices but {have} {device_type} "
                           f"device(s) are available{hosts}{hint}")
    if device_type == "CPU" and cfg.cpu_devices > 1:
        configure_logical_cpus(cfg.cpu_devices)
    if device_type == "CPU" and cfg.jit_compile:
        print("runtime: jit_compile does not apply on a CPU mesh (DTensor on CPU builds no XLA program); "
              "running without XLA", flush=True)
    if device_type == "GPU":
        # DTensor's GPU collectives use NCCL only when asked (its default is "0"); set before initializing.
        os.environ.setdefault("DTENSOR_GPU_USE_NCCL_COMMUNICATION", "1")
    if device_type != "CPU":
        dtensor.initialize_accelerator_system(device_type)
    if clients > 1:
        mesh = dtensor.create_distributed_mesh(list(sizes.items()), device_type=device_type)
    else:
        mesh = dtensor.create_mesh(list(sizes.items()), device_type=device_type)
    return MeshRuntime(mesh, sizes, layout, device_type, cfg.precision, cfg.jit_compile, fsdp=cfg.fsdp)
