"""The one small interface that the loop, the layers and the workloads use to reach devices.

Two families sit behind it: tf.distribute strategies (data parallel: default, mirrored, multi_worker,
tpu) and a DTensor mesh (data x model parallel). Model code creates every variable through
`Runtime.variable` with named dimensions, so the same model runs on both families: a strategy ignores the
names, a mesh maps them to mesh dimensions through the config's layout rules.

Members by who calls them:
- model code: `variable` (named dimensions, stateless seeded initializers), `replica_all_sum`, `assign_mean`,
  `take_along_axis1` (a batched take, e.g. beam reordering: a gather on the strategies, a one-hot
  contraction on the mesh, whose partitioner rejects gather with batch_dims), `place`, `shards` /
  `check_divides`, `batch_norm_group` (any divisor of the replicas: on mirrored / multi_worker one
  `all_reduce` of per-replica slots of a zero tensor, each replica keeping its group's rows, so no
  `merge_call` and it compiles inside per-replica XLA on GPUs; grouped `cross_replica_sum` on TPU),
  `spatial_partition_ways` / `split_spatially` (TPU only; refused elsewhere before any device is touched);
- the loop: `distribute_dataset`, `run`, `sum` / `mean`, `all_reduce_gradients`, `gather` (per-example
  outputs of every replica and host), `to_host`, `broadcast_from_chief`, `replica_id`, `function`,
  `replica_function`;
- topology: `num_replicas`, `num_hosts`, `host_id`, `is_chief`, `device_type`, `description`.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What an input pipeline needs to know to produce its share of the data.

    `batch_size` is the batch each dataset element must have: the per-replica batch under a
    tf.distribute strategy, the per-host batch on a mesh.
    """
    num_hosts: int
    host_id: int
    batch_size: int
    seed: int


@dataclasses.dataclass
class VariableInfo:
    path: str
    variable: tf.Variable
    dims: tuple[str | None, ...]
    trainable: bool
    frozen: bool = False  # created under `Runtime.frozen`: a fine-tune's base, held in its frozen dtype
    shape: tuple[int, ...] = ()  # as declared, the whole model's (a dry run's stand-in may hold a device's share)


# Spatial partitioning: logical devices per replica -> TPU computation shape [x, y, z, core] (the values
# TensorFlow Model Garden uses on v2/v3 topologies, two cores per chip).
SPATIAL_COMPUTATION_SHAPES = {2: [1, 1, 1, 2], 4: [1, 2, 1, 2], 8: [2, 2, 1, 2], 16: [4, 2, 1, 2]}


def check_spatial_partition(dims: Sequence[int], kind: str) -> tuple[int, ...]:
    """Validates runtime.spatial_partition before any device is touched; returns the dims (() when off).

    Only the image height (dimension 1) may be split, as Google's v0.7 SSD does. Off TPU the split is
    refused: DTensor's halo exchange for a height-sharded convolution exists only on TPU (measured on
    CPU: "Halo exchange is only supported on TPU"), and nothing else splits one example over devices.
    """
    dims = tuple(int(d) for d in dims)
    what = f"runtime.spatial_partition={list(dims)}"
    if not dims:
        return ()
    if len(dims) != 4:
        raise HarnessError(f"{what} must have rank 4 ([batch, height, width, channels]), e.g. [1, 8, 1, 1]")
    if any(d < 1 for d in dims):
        raise HarnessError(f"{what}: every entry must be >= 1 (1 = not split)")
    if any(d > 1 for i, d in enumerate(dims) if i != 1):
        raise HarnessError(f"{what}: only dimension 1 (image height) may be split, e.g. [1, {max(dims)}, 1, 1]")
    if dims[1] == 1:
        return ()
    if kind != "tpu":
        raise HarnessError(f"{what}: spatial partitioning needs a TPU (runtime.kind=tpu, here {kind}): the "
                           f"halo exchange a height-split convolution needs exists only on TPU; remove "
                           f"runtime.spatial_partition")
    if dims[1] not in SPATIAL_COMPUTATION_SHAPES:
        raise HarnessError(f"{what}: a TPU replica can span {', '.join(map(str, SPATIAL_COMPUTATION_SHAPES))} "
                           f"cores, not {dims[1]}")
    return dims


class Runtime(abc.ABC):
    kind: str = ""
    # runtime.spatial_partition once validated: () when each example stays on one device.
    spatial_dims: tuple[int, ...] = ()
    # The layout: tensor dimension name -> mesh dimension, and mesh dimension sizes (empty: nothing split).
    rules: dict[str, str] = {}
    sizes: dict[str, int] = {}
    # True where the steps run under DTensor's layout propagation (the mesh runtime), which expands only some ops
    # (no TensorList loops such as map_fn or scan, no MatrixDiag): a workload then picks forms of the same numbers
    # it can lay out. Asked instead of the runtime's kind (tests/test_layout.py).
    laid_out: bool = False

    def __init__(self, precision: str, jit_compile: bool | None) -> None:
        self._variables: dict[str, VariableInfo] = {}
        # Per thread: MirroredStrategy traces each replica's function in its own thread.
        self._replica_local = threading.local()
        self.precision = precision
        self.compute_dtype = {"float32": tf.float32, "bfloat16": tf.bfloat16, "float16": tf.float16}[precision]
        on_accelerator = self.device_type in ("GPU", "TPU")
        self.jit_compile = on_accelerator if jit_compile is None else jit_compile

    # ----------------------------------------------------------------------------- description
    @property
    @abc.abstractmethod
    def num_replicas(self) -> int:
        """Data-parallel replicas: the global batch is split this many ways."""

    @property
    def num_hosts(self) -> int:
        return 1

    @property
    def host_id(self) -> int:
        return 0

    @property
    def is_chief(self) -> bool:
        """Only the chief writes the MLPerf log and outputs."""
        return self.host_id == 0

    @property
    @abc.abstractmethod
    def device_type(self) -> str:
        """'CPU', 'GPU' or 'TPU'."""

    @property
    def spatial_partition_ways(self) -> int:
        """Devices each example's image height is split over (1: no spatial partitioning)."""
        return self.spatial_dims[1] if self.spatial_dims else 1

    @property
    def description(self) -> str:
        split = (f", image height split {self.spatial_partition_ways} ways per replica"
                 if self.spatial_partition_ways > 1 else "")
        return (f"{self.kind}: {self.num_replicas} replica(s) on {self.device_type}, {self.num_hosts} "
                f"host(s){split}")

    def check_batch(self, global_batch: int, what: str = "schedule.global_batch_size") -> None:
        if global_batch % self.num_replicas:
            raise HarnessError(f"{what}={global_batch} does not divide over {self.num_replicas} replicas "
                               f"({self.description}); use a multiple of {self.num_replicas}")

    def program_batch(self, global_batch: int) -> int:
        """The examples one program of a step holds: a replica's share under tf.distribute (the mesh runtime,
        whose one program holds the global batch, says so). What a workload sizes per-step buffers by."""
        return global_batch // max(1, self.num_replicas)

    def host_batch(self, global_batch: int) -> int:
        return global_batch // self.num_hosts

    def shards(self, dim_name: str) -> int:
        """How many ways tensors' dimension `dim_name` is split over devices (1: kept whole)."""
        mesh_dim = self.rules.get(dim_name)
        return self.sizes.get(mesh_dim, 1) if mesh_dim else 1

    def check_divides(self, what: str, size: int, dim_name: str) -> None:
        """A model size that a layout splits over devices must divide evenly (checked before the log)."""
        n = self.shards(dim_name)
        if size % n:
            raise HarnessError(f"{what}={size} does not divide over {n} devices (runtime.layout.{dim_name}="
                               f"{self.rules[dim_name]} of size {n})")

    def batch_norm_group(self, span: int, replica_batch: int, what: str = "model.bn_span") -> int:
        """How many replicas pool batch statistics for a requested span of examples (0: one replica's
        batch). Groups are consecutive replicas, so the group size must divide the replica count."""
        n = self.num_replicas
        span = span or replica_batch
        group = span // replica_batch
        if span % replica_batch or n % group:
            valid = ", ".join(str(replica_batch * g) for g in range(1, n + 1) if n % g == 0)
            raise HarnessError(f"{what}={span} with a per-replica batch of {replica_batch} on {n} replicas: "
                               f"the span must be the per-replica batch times a divisor of {n} "
                               f"(valid spans: {valid}; 0 = {replica_batch})")
        return group

    # ------------------------------------------------------------------------------ variables
    @abc.abstractmethod
    def scope(self) -> Any:
        """Context manager under which variables are created."""

    def variable(self, path: str, shape: Sequence[int], dims: Sequence[str | None],
                 initializer: Callable[[Sequence[int], tf.DType], tf.Tensor], *, trainable: bool = True,
                 dtype: tf.DType = tf.float32, sync: str = "first") -> tf.Variable:
        """Creates (once) the variable `path` with named dimensions `dims` (one name or None per axis).

        `sync` says how a data-parallel runtime merges updates made on every replica: "first" for values
        that are identical everywhere (weights updated from all-reduced gradients, optimizer slots),
        "mean" for values computed from each replica's own data (batch-norm moving statistics), which
        must be updated through `assign_mean`.
        """
        if path in self._variables:
            raise ValueError(f"variable {path} created twice")
        freeze = getattr(self, "_freeze", None)
        frozen_dtype = freeze(path) if freeze is not None and trainable and dtype == tf.float32 else None
        if frozen_dtype is not None:
            trainable, dtype = False, frozen_dtype
        if len(shape) != len(dims):
            raise ValueError(f"variable {path}: shape {shape} and dims {dims} differ in rank")
        var = self._make_variable(path, tuple(int(s) for s in shape), tuple(dims), initializer,
                                  trainable, dtype, sync)
        self._variables[path] = VariableInfo(path, var, tuple(dims), trainable, frozen_dtype is not None,
                                             tuple(int(s) for s in shape))
        return var

    @abc.abstractmethod
    def _make_variable(self, path, shape, dims, initializer, trainable, dtype, sync) -> tf.Variable:
        ...

    @contextlib.contextmanager
    def frozen(self, dtype_of: Callable[[str], tf.DType | None]) -> Iterator[None]:
        """Within: a float32 trainable variable whose path `dtype_of` maps to a dtype is created frozen
        instead (not trainable, so no gradient, optimizer slot or all-reduce, and stored in that dtype);
        None leaves it trainable (a fine-tune's adapters)."""
        self._freeze = dtype_of
        try:
            yield
        finally:
            self._freeze = None

    def read(self, variable: tf.Variable) -> tf.Tensor:
        """A variable's value as the model computes with it (a mesh with FSDP gathers the shards)."""
        return variable.read_value()

    def read_after(self, variable: tf.Variable, after: tf.Tensor) -> tf.Tensor:
        """`read(variable)` as a value that exists only once the scalar `after` does (`after_zero`), so
        nothing derived from it is merged with the same derivation from another read (XLA and Grappler
        CSE) or computed ahead of `after`. A recomputed layer reads its frozen weights so (decoder `remat`):
        a plain read is one value for the forward pass and the backward's recompute alike, and each copy
        made of it (XLA's transposed layout, a bfloat16 weight cast, an FSDP gather) would be made once
        in the forward pass and held until the backward pass reaches the layer. A runtime whose read
        gathers a stored shard ties the shard, before the gather."""
        return self.read(variable) + after_zero(after, variable.dtype)

    def variables(self, trainable: bool | None = None) -> list[VariableInfo]:
        return [v for v in self._variables.values() if trainable is None or v.trainable == trainable]

    # ------------------------------------------------------------------------------ execution
    @abc.abstractmethod
    def distribute_dataset(self, dataset_fn: Callable[[InputContext], tf.data.Dataset],
                           global_batch: int, seed: int) -> Any:
        """An iterable whose elements `run` accepts; `dataset_fn` gets this host's InputContext."""

    @abc.abstractmethod
    def run(self, fn: Callable, args: tuple) -> Any:
        """Runs `fn` on every replica (inside a tf.function); returns per-replica results."""

    @abc.abstractmethod
    def sum(self, per_replica: Any) -> Any:
        """Cross-replica sum of `run`'s results (nested structure of tensors), in cross-replica context."""

    def all_reduce_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """In replica context: sums gradients over replicas (losses are pre-divided by global counts)."""
        return grads

    def replica_id(self) -> tf.Tensor:
        """In replica context: this replica's index (0 where one program sees the whole batch)."""
        return tf.constant(0, tf.int32)

    @abc.abstractmethod
    def gather(self, per_replica: Any) -> Any:
        """Cross-replica: per-example outputs (leading batch axis) of every replica and host, concatenated
        in replica order, available on every host."""

    def to_host(self, value: Any) -> np.ndarray:
        """A compiled function's output (reduced or gathered) as a numpy array on this host."""
        return np.asarray(value)

    def broadcast_from_chief(self, value: np.ndarray) -> np.ndarray:
        """The chief's `value` on every host (a collective: every host must call it)."""
        if self.num_hosts == 1:
            return np.asarray(value)
        raise HarnessError(f"the {self.kind} runtime cannot broadcast between {self.num_hosts} hosts")

    @abc.abstractmethod
    def mean(self, per_replica: Any) -> Any:
        """Cross-replica mean of `run`'s results (for per-replica scalars such as the loss)."""

    def replica_all_sum(self, tensors: Any, group_size: int) -> Any:
        """In replica context: sums `tensors` over groups of `group_size` consecutive replicas (batch-norm
        span; replica r is in group r // group_size). Differentiable: the gradient of each input is the
        sum of the gradients of its group's outputs."""
        if group_size == 1:
            return tensors
        raise HarnessError(f"{self.kind} runtime cannot reduce over groups of {group_size} replicas")

    def assign_mean(self, variable: tf.Variable, value: tf.Tensor) -> None:
        """In replica context: sets a sync="mean" variable to the mean over replicas of `value`. Inside
        `batched_mean_updates` the assign waits for the block's end, so all of them share one reduction."""
        pending = getattr(self._replica_local, "pending_means", None)
        if pending is not None:
            pending.append((variable, value))
        else:
            self._apply_means([(variable, value)])

    @contextlib.contextmanager
    def batched_mean_updates(self) -> Any:
        """In replica context: `assign_mean` calls inside are applied together, at the end of the block,
        with one cross-replica reduction (batch-norm moving statistics: one per step, not per variable)."""
        local = self._replica_local
        outer = getattr(local, "pending_means", None)
        local.pending_means = pending = []
        try:
            yield
        finally:
            local.pending_means = outer
        if pending:
            self._apply_means(pending)

    def _apply_means(self, pending: list[tuple[tf.Variable, tf.Tensor]]) -> None:
        # One program sees the whole batch (one device, or a mesh): the value is already the mean.
        for variable, value in pending:
            variable.assign(value)

    def take_along_axis1(self, x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        """In replica context: x (batch, n, ...) -> rows `index` (batch, k) of axis 1, per batch row (a
        batched gather, e.g. reordering beams). Each runtime implements it the way its devices can."""
        return tf.gather(x, index, batch_dims=1)

    def place(self, t: tf.Tensor, dims: Sequence[str | None]) -> tf.Tensor:
        """In replica context: lays tensor `t` out by named dimensions `dims` (one name or None per axis),
        as variables are. A mesh reshards it (e.g. experts split where the batch was: an all-to-all);
        data-parallel runtimes hold whole tensors per replica and return it unchanged."""
        return t

    def split_spatially(self, t: tf.Tensor) -> tf.Tensor:
        """In replica context, on an image input [batch, height, ...]: marks its height to be split over
        the replica's devices (runtime.spatial_partition); identity when spatial partitioning is off."""
        return t

    def function(self, fn: Callable) -> Callable:
        """Compiles a host-side loop function (iterator, step loop): a plain tf.function, never XLA,
        since XLA has no kernels for host iteration (IteratorGetNext)."""
        return tf.function(fn)

    def replica_function(self, fn: Callable) -> Callable:
        """The per-replica computation `run` executes (train step, eval step): XLA-compiled when
        runtime.jit_compile is on. Compile errors propagate unchanged (the caller may translate them)."""
        return tf.function(fn, jit_compile=True) if self.jit_compile else fn

    def shutdown(self) -> None:
        """Releases cluster resources (multi-worker, TPU) at the end of a run."""


def one_hot_take_along_axis1(x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """`Runtime.take_along_axis1` as a one-hot contraction instead of a gather.

    For runtimes whose partitioner rejects gather with batch_dims (DTensor in TF 2.21): it keeps each
    batch row where it is and split axes where they were. One-hot weights make it exact for floats and
    integers alike; it costs n multiply-adds per taken value where the gather copies it once, so only the
    runtimes that need it use it.
    """
    batch, n = x.shape[0], x.shape[1]
    flat = tf.reshape(x, [batch, n, -1])
    if x.dtype.is_floating:
        picked = tf.einsum("bkn,bnf->bkf", tf.one_hot(index, n, dtype=x.dtype), flat)
    else:
        one = tf.expand_dims(tf.one_hot(index, n, dtype=tf.int32), 3)
        picked = tf.reduce_sum(one * tf.expand_dims(tf.cast(flat, tf.int32), 1), 2)
        picked = tf.cast(picked, x.dtype)
    return tf.reshape(picked, [batch, index.shape[1]] + x.shape[2:].as_list())


def after_zero(after: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """-0.0 in `dtype`, computed from the scalar `after` (finite): x + after_zero(...) is x bit for bit
    (-0.0 is the one additive identity that keeps a -0.0 too), yet depends on `after`, which no compiler may
    fold away (a float multiply by zero keeps NaN and infinity). A non-finite `after` turns it into NaN."""
    return -tf.cast(tf.abs(after) * 0.0, dtype)
