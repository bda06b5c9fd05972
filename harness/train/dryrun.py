"""`mlperf-harness run CONFIG --dry_run`: compile a config's steps under XLA before hardware is booked.

The real run's devices are not here, so one CPU device stands in for one replica: it compiles what the
loop compiles on each replica (`CompiledSteps.train_step`, and the eval replica step) at the real run's
per-replica batch, with the real replica count and model-axis size answering every config check. Why not
logical CPU devices: MirroredStrategy over CPUs makes one XLA cluster of all replicas (it compiles per
replica only on GPUs), and a DTensor CPU mesh ignores `jit_compile`, so neither would show what an
accelerator compiles. What this cannot show is said in the report's notes: cross-replica collectives
are identities here, and a replica split over several devices (mesh model axis, TPU spatial
partitioning) is compiled whole, unpartitioned.

Numbers come from XLA itself: the HLO module TensorFlow hands to XLA (FLOPs are counted from it, since
TensorFlow's Python API does not expose XLA's HloCostAnalysis) and the optimized module's buffer
assignment (XLA:CPU's memory plan). No data set, checkpoint or MLPerf log is touched.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import time
from typing import Any, Callable

import tensorflow as tf

from harness import config as config_lib
from harness.errors import HarnessError
from harness.platforms import GPU_COUNT, device_memory, tpu_devices
from harness.runtime.base import check_spatial_partition
from harness.runtime.distribute import StrategyRuntime
from harness.plan import mfu
from harness.train.loop import CompiledSteps
from harness.train.preflight import Checked, preflight
from harness.train.workload import COUNT, INDEX, MASK
from harness.train.xla_errors import xla_compile_error

# -------------------------------------------------------------------------------------- the report


@dataclasses.dataclass
class CompileReport:
    workload: str            # registry name
    config: str              # config path
    replicas: int            # data-parallel replicas of the real run
    model_axis: int          # devices per replica (1 on tf.distribute runtimes)
    per_replica_batch: int   # training examples per replica per optimizer step
    global_batch: int
    eval_per_replica_batch: int
    params: int              # trainable parameters
    train_flops_per_replica_step: float  # one optimizer step of one replica (all of its devices)
    eval_flops_per_replica_step: float
    flops_source: str        # "xla cost analysis" or "counted (...)"
    weight_bytes_per_device: int
    optimizer_bytes_per_device: int
    gradient_bytes: int      # bytes a replica's step produces before reduction (its trainable params x grad dtype)
    peak_bytes_per_device: int | None  # XLA:CPU's plan (one device per replica), else the sum of the parts
    compile_seconds: dict[str, float]    # {"train": ..., "eval": ...}
    runtime_kind: str = ""
    precision: str = "float32"
    eval_peak_bytes_per_device: int | None = None
    gradient_bytes_per_device: int = 0   # each gradient split as its variable is
    activation_bytes_per_device: int | None = None  # estimate: see `memory_source`
    memory_source: str = ""  # how peak and activation bytes per device were obtained
    stand_in: list[str] = dataclasses.field(default_factory=list)  # what stood in for what, and how
    # runtime.fsdp: the data axis size, the per-device bytes of weights + optimizer state + gradients it
    # saves against the same mesh without FSDP, and the variable bytes it leaves whole over the data axis.
    fsdp_data_axis: int = 0
    fsdp_saved_bytes_per_device: int = 0
    fsdp_replicated_bytes: int = 0
    # The workload's useful FLOPs (benchmarks/<name>/cost.py) for the same per-replica batch: 0 = no cost model.
    useful_train_flops_per_replica_step: float = 0.0
    # Trainable parameters one replica's program holds: `params` but where the devices hold their own experts
    # only (an all-to-all dispatch, Workload.experts_stay_put); its gradients are `gradient_bytes`.
    replica_params: int = 0
    # The traced steps ({"train", "eval"} -> ConcreteFunction), for inspection; not part of to_dict().
    traced: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "traced"}

    def lines(self) -> list[str]:
        def gib(n: int | None) -> str:
            return "not reported" if n is None else f"{n / 2**30:.3f} GiB ({n:,} bytes)"

        how = "estimate" if self.memory_source.startswith("estimate") else "XLA:CPU buffer assignment"

        return [
            f"dry run: {self.workload} from {self.config} (XLA compile only: no data read, no log, no timing)",
            f"runtime: {self.runtime_kind}, {self.replicas} replica(s) x {self.model_axis} device(s) per replica, "
            f"precision {self.precision}",
            *(f"stood in: {s}" for s in self.stand_in),
            f"parameters: {self.params:,} trainable"
            + (f"; {self.replica_params:,} in one replica's program (its own experts)"
               if self.replica_params and self.replica_params != self.params else ""),
            f"batch: {self.per_replica_batch} per replica ({self.global_batch} global); eval "
            f"{self.eval_per_replica_batch} per replica",
            f"compile: train {self.compile_seconds['train']:.1f} s, eval {self.compile_seconds['eval']:.1f} s "
            f"(trace + XLA HLO passes on this CPU)",
            f"FLOPs per train step (one replica): {self.train_flops_per_replica_step:.4g}",
            f"FLOPs per eval step (one replica): {self.eval_flops_per_replica_step:.4g}",
            f"FLOPs source: {self.flops_source}",
            *([f"useful FLOPs per train step (one replica, the cost module's count): "
               f"{self.useful_train_flops_per_replica_step:.4g}; compiled / useful = "
               f"{self.train_flops_per_replica_step / self.useful_train_flops_per_replica_step:.2f}"]
              if self.useful_train_flops_per_replica_step else []),
            f"weights per device: {gib(self.weight_bytes_per_device)}",
            f"optimizer state per device: {gib(self.optimizer_bytes_per_device)}",
            f"gradients of one replica's step, before the cross-replica reduction: {gib(self.gradient_bytes)}",
            f"gradients per device: {gib(self.gradient_bytes_per_device)}",
            *([f"FSDP over data={self.fsdp_data_axis}: saves {gib(self.fsdp_saved_bytes_per_device)} per device "
               f"(weights, optimizer state and gradients) against no FSDP; "
               f"{gib(self.fsdp_replicated_bytes)} of variables stay whole over data (no dimension it divides)"]
              if self.fsdp_data_axis else []),
            f"activations and other temporaries per device (estimate, train step): "
            f"{gib(self.activation_bytes_per_device)}",
            f"peak memory per device ({how}, train step): {gib(self.peak_bytes_per_device)}",
            f"peak memory per device ({how}, eval step): {gib(self.eval_peak_bytes_per_device)}",
            f"memory source: {self.memory_source}",
        ]


# ------------------------------------------------------------------------ the real run's devices

@dataclasses.dataclass
class DevicePlan:
    replicas: int
    model_axis: int
    device_type: str
    notes: list[str]


DEFAULT_GPUS = 8  # submission.platform names are parsed in one place (harness/platforms.py)


def device_plan(cfg: config_lib.Config) -> DevicePlan:
    """The replica count and devices per replica the real run would have, from the config alone."""
    r = cfg.runtime
    if r.kind == "default":
        return DevicePlan(1, 1, "CPU or GPU", ["one device (runtime.kind=default)"])
    if r.kind == "mirrored":
        if r.cpu_devices > 0:
            return DevicePlan(r.cpu_devices, 1, "CPU", [f"runtime.cpu_devices={r.cpu_devices} logical CPUs"])
        if r.gpus > 0:
            return DevicePlan(r.gpus, 1, "GPU", [f"runtime.gpus={r.gpus} GPUs"])
        m = GPU_COUNT.search(cfg.submission.platform)
        if m:
            n = int(m.group(1) or m.group(2))
            return DevicePlan(n, 1, "GPU", [f"runtime.gpus=-1 (all visible): {n} GPUs, read from "
                                            f"submission.platform={cfg.submission.platform!r}"])
        return DevicePlan(DEFAULT_GPUS, 1, "GPU", [
            f"runtime.gpus=-1 (all visible) and submission.platform={cfg.submission.platform!r} names no "
            f"count: {DEFAULT_GPUS} GPUs assumed (one 8-GPU host); --set runtime.gpus=N checks another"])
    if r.kind == "multi_worker":
        hosts = 1
        try:
            hosts = sum(len(v) for k, v in json.loads(os.environ.get("TF_CONFIG", "{}"))
                        .get("cluster", {}).items() if k in ("chief", "worker")) or 1
        except (ValueError, AttributeError, TypeError):
            pass
        return DevicePlan(hosts, 1, "GPU", [f"{hosts} worker(s) from TF_CONFIG, one device each"])
    if r.kind == "tpu":
        dims = check_spatial_partition(r.spatial_partition, "tpu")
        ways = dims[1] if dims else 1
        source = next((s for s in (r.tpu, cfg.submission.platform) if tpu_devices(s)), None)
        if source is None:
            raise HarnessError(f"the dry run cannot tell how many TPU cores the run has: name the slice in "
                               f"submission.platform (e.g. tpu-v3-32), not {cfg.submission.platform!r}")
        cores = tpu_devices(source)
        if cores % ways:
            raise HarnessError(f"runtime.spatial_partition splits each replica over {ways} cores, which does not "
                               f"divide the {cores} cores of {source}")
        note = f"{cores} TPU cores read from {source!r}"
        if ways > 1:
            note += f", {ways} per replica (image height split; compiled unsplit here)"
        return DevicePlan(cores // ways, ways, "TPU", [note])
    if r.kind == "mesh":
        sizes = {str(k): int(v) for k, v in r.mesh.items()}
        batch_dim = (r.layout or {}).get("batch", "data")
        if batch_dim not in sizes:
            raise HarnessError(f"runtime.layout.batch={batch_dim!r} must name a mesh dimension ({', '.join(sizes)})")
        model_axis = math.prod(v for k, v in sizes.items() if k != batch_dim)
        return DevicePlan(sizes[batch_dim], model_axis, "TPU/GPU", [
            f"mesh {' x '.join(f'{k}={v}' for k, v in sizes.items())}: each replica's {model_axis} device(s) "
            f"compiled as one unpartitioned program (a DTensor CPU mesh ignores jit_compile)"])
    raise HarnessError(f"unknown runtime.kind {r.kind!r}")


class StandInRuntime(StrategyRuntime):
    """One CPU device compiling one replica's program, answering size questions as the real run would.

    Collectives are identities (one replica's values stand in for the group's sum), so per-replica
    shapes, and hence the compiled program, are those of the real replica; mesh configs keep their layout
    rules so every "does this size divide over the model axis" check runs for real.
    """

    def __init__(self, cfg: config_lib.Config, plan: DevicePlan) -> None:
        super().__init__(cfg.runtime.kind, tf.distribute.get_strategy(), "CPU", cfg.runtime.precision, True)
        self.plan = plan
        self._real_device_type = plan.device_type
        if cfg.runtime.kind == "mesh":
            self.sizes = {str(k): int(v) for k, v in cfg.runtime.mesh.items()}
            self.rules = dict(cfg.runtime.layout) or {"batch": "data"}
            self.rules.setdefault("batch", "data")
        self.fsdp = cfg.runtime.kind == "mesh" and cfg.runtime.fsdp
        self.local_experts = 1    # > 1: the devices whose experts split; this one holds 1/local_experts of them
        self._exchanged: dict[tuple[int, ...], tuple[int, int]] = {}

    def hold_own_experts(self) -> bool:
        """For a model whose tokens travel to their experts (`Workload.experts_stay_put`): when the layout puts
        `experts` on the batch axis, from now on variables with an `experts` dimension hold this device's
        share only and `place` moves tensors between batch-split and experts-split as one device's all-to-all
        does (`place`). False (nothing changed) where the experts are not split over the batch axis."""
        batch = self.rules.get("batch") if self.kind == "mesh" else None
        n = self.sizes.get(batch, 1) if batch else 1
        if self.rules.get("experts") != batch or n <= 1:
            return False
        self.local_experts = n
        return True

    def _make_variable(self, path, shape, dims, initializer, trainable, dtype, sync) -> tf.Variable:
        if self.local_experts > 1 and "experts" in dims:
            i = dims.index("experts")
            if shape[i] % self.local_experts:
                raise HarnessError(f"{path}: {shape[i]} experts do not split over {self.local_experts} devices")
            shape = shape[:i] + (shape[i] // self.local_experts,) + shape[i + 1:]
        return super()._make_variable(path, shape, dims, initializer, trainable, dtype, sync)

    def place(self, t: tf.Tensor, dims) -> tf.Tensor:
        """Where this device holds its own experts only: one device's side of the all-to-all. To experts-split
        (`experts` in dims): the experts axis is cut into one block per device and the blocks stacked on the
        first other axis (the batch), as the blocks the other devices send would arrive ([b, E, ...] ->
        [n b, E / n, ...]; here they are this device's own, so the values differ, the shapes and the work
        do not); back to batch-split (`batch` in dims) on a tensor of such a shape: the reverse."""
        n = self.local_experts
        if n <= 1:
            return t
        shape = t.shape.as_list()
        if "experts" in dims and "batch" not in dims:
            i = list(dims).index("experts")
            j = 1 if i == 0 else 0
            blocks = tf.reshape(t, shape[:i] + [n, shape[i] // n] + shape[i + 1:])   # the device axis at i
            order = list(range(len(shape) + 1))
            order.insert(j, order.pop(i))                                            # ... moved before axis j
            out = tf.transpose(blocks, order)
            new = list(shape)
            new[i], new[j] = shape[i] // n, n * shape[j]
            out = tf.reshape(out, new)
            self._exchanged[tuple(new)] = (i, j)
            return out
        if "batch" in dims and tuple(shape) in self._exchanged:
            i, j = self._exchanged[tuple(shape)]
            split = shape[:j] + [n, shape[j] // n] + shape[j + 1:]                  # the device axis at j
            blocks = tf.reshape(t, split)
            order = list(range(len(shape) + 1))
            order.insert(i, order.pop(j))                                            # ... moved before the experts
            out = tf.transpose(blocks, order)
            new = list(shape)
            new[i], new[j] = shape[i] * n, shape[j] // n
            return tf.reshape(out, new)
        return t

    @property
    def num_replicas(self) -> int:
        return self.plan.replicas

    @property
    def description(self) -> str:
        return f"{self.kind} (stood in): {self.plan.replicas} replica(s) x {self.plan.model_axis} device(s)"

    def batch_norm_group(self, span: int, replica_batch: int, what: str = "model.bn_span") -> int:
        if self.kind == "mesh":
            from harness.runtime.mesh import MeshRuntime  # the mesh's own rule, on the stood-in sizes

            return MeshRuntime.batch_norm_group(self, span, replica_batch, what)  # type: ignore[arg-type]
        return super().batch_norm_group(span, replica_batch, what)

    def all_reduce_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        return grads

    def replica_all_sum(self, tensors: Any, group_size: int) -> Any:
        return tensors

    def take_along_axis1(self, x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        if self.kind == "mesh":
            from harness.runtime.base import one_hot_take_along_axis1

            return one_hot_take_along_axis1(x, index)
        return super().take_along_axis1(x, index)

    def split_spatially(self, t: tf.Tensor) -> tf.Tensor:
        return t

    def mesh_dims_used(self, dims: tuple[str | None, ...]) -> set[str]:
        """The mesh dimensions the layout rules put on a variable's named dimensions (each once)."""
        named = [self.rules.get(name) for name in dims if name]
        return {d for d in named if d in self.sizes and self.sizes[d] > 1}

    def layout_shards(self, dims: tuple[str | None, ...], shape: tuple[int, ...] | None = None,
                      fsdp: bool | None = None) -> int:
        """How many devices one variable is split over (a mesh dimension counts once per tensor); with FSDP
        (and the variable's `shape`), times the data axis where the mesh runtime's rule finds it a dimension."""
        used, n, split = set(), 1, []
        for name in dims:
            mesh_dim = self.rules.get(name) if name else None
            split.append(mesh_dim in self.sizes and mesh_dim not in used and self.sizes[mesh_dim] > 1)
            if split[-1]:
                used.add(mesh_dim)
                n *= self.sizes[mesh_dim]
        if not (self.fsdp if fsdp is None else fsdp) or shape is None:
            return n
        from harness.runtime.mesh import fsdp_axis  # the mesh runtime's own rule

        data = self.sizes.get(self.rules["batch"], 1)
        if data > 1 and self.rules["batch"] not in used and fsdp_axis(shape, split, data) is not None:
            n *= data
        return n


# ---------------------------------------------------------------------------------- XLA numbers

def _hlo_pb2() -> Any:
    from tensorflow.compiler.xla.service import hlo_pb2

    return hlo_pb2


_ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "atan2", "negate",
    "abs", "sign", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt", "rsqrt", "cbrt",
    "tanh", "logistic", "sine", "cosine", "tan", "erf", "floor", "ceil", "round-nearest-afz",
    "round-nearest-even", "compare", "select", "clamp", "and", "or", "xor", "not", "is-finite",
}


def _elements(shape: Any) -> int:
    if shape.tuple_shapes:
        return sum(_elements(s) for s in shape.tuple_shapes)
    return math.prod(shape.dimensions) if shape.dimensions else 1


def count_flops(module: Any) -> float:
    """Floating-point operations of an HloModuleProto, by XLA's cost-analysis conventions.

    dot: 2 x output elements x contracted size; convolution: 2 x output elements x kernel window x input
    features per group (padding taps included); elementwise arithmetic, compare and select: one per output
    element; reduce: one per input element. Called computations (while bodies, conditionals, calls) are
    counted once per appearance, as XLA's HloCostAnalysis counts a while body once.
    """
    computations = {c.id: c for c in module.computations}

    def computation_flops(cid: int, seen: tuple[int, ...]) -> float:
        if cid in seen:
            return 0.0
        comp = computations[cid]
        by_id = {i.id: i for i in comp.instructions}
        total = 0.0
        for ins in comp.instructions:
            op = ins.opcode
            out = _elements(ins.shape)
            if op == "dot":
                lhs = by_id[ins.operand_ids[0]].shape
                contracted = math.prod(lhs.dimensions[d] for d in ins.dot_dimension_numbers.lhs_contracting_dimensions)
                total += 2.0 * out * contracted
            elif op == "convolution":
                kernel = by_id[ins.operand_ids[1]].shape
                dn = ins.convolution_dimension_numbers
                window = math.prod(kernel.dimensions[d] for d in dn.kernel_spatial_dimensions)
                total += 2.0 * out * window * kernel.dimensions[dn.kernel_input_feature_dimension]
            elif op in _ELEMENTWISE:
                total += out
            elif op in ("reduce", "reduce-window"):
                total += sum(_elements(by_id[o].shape) for o in ins.operand_ids[: len(ins.operand_ids) // 2])
            elif op in ("while", "conditional", "call", "fusion", "map"):
                total += sum(computation_flops(c, seen + (cid,)) for c in ins.called_computation_ids)
        return total

    return computation_flops(module.entry_computation_id, ())


def buffer_bytes(hlo_proto: Any) -> int:
    """XLA's memory plan for one execution: every buffer allocation but thread-local ones (parameters,
    outputs, constants and the one preallocated temporary buffer the heap simulator sized)."""
    return int(sum(a.size for a in hlo_proto.buffer_assignment.buffer_allocations if not a.is_thread_local))


@dataclasses.dataclass
class Compiled:
    flops: float
    peak_bytes: int | None
    seconds: float
    traced: Any  # the ConcreteFunction XLA compiled (its graph: what a TPU would be handed)


def compile_step(fn: Callable, specs: Any, workload: str, which: str, optimize: bool = True) -> Compiled:
    """Traces `fn(batch)` under XLA at `specs` (no tensor allocated, nothing run) and reads XLA's numbers;
    `optimize` also runs XLA's HLO passes and buffer assignment (the memory plan; most of the time)."""
    flat = tf.nest.flatten(specs)

    def step(*tensors: tf.Tensor) -> Any:
        return fn(tf.nest.pack_sequence_as(specs, list(tensors)))

    compiled = tf.function(step, jit_compile=True)
    hlo = _hlo_pb2()
    t0 = time.time()
    try:
        ir = compiled.experimental_get_compiler_ir(*flat)
        module = hlo.HloModuleProto.FromString(ir(stage="hlo_serialized"))
        optimized = hlo.HloProto.FromString(ir(stage="optimized_hlo_proto_serialized")) if optimize else None
    except Exception as e:  # noqa: BLE001 - translated below, or re-raised untouched
        error = xla_compile_error(e, workload, which)
        if error is not None:
            raise error from None
        raise
    seconds = time.time() - t0
    peak = buffer_bytes(optimized) if optimized is not None and optimized.HasField("buffer_assignment") else None
    return Compiled(count_flops(module), peak, seconds, compiled.get_concrete_function(*flat))


# ---------------------------------------------------------------------- TPU rules, checked on CPU

# Ops that only a host can run: Python callbacks, summaries and printing, input iterators, files.
HOST_ONLY_OPS = {
    "PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction", "PrintV2", "Print", "StringFormat",
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "MakeIterator", "AnonymousIterator",
    "AnonymousIteratorV2", "AnonymousIteratorV3", "IteratorV2", "OptionalGetValue", "OptionalHasValue",
    "ReadFile", "WriteFile",
}


def _graph_nodes(concrete: Any) -> list[Any]:
    """NodeDefs of a traced function and of every function it calls (while bodies, branches, calls)."""
    graph_def = concrete.graph.as_graph_def()
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


def host_only_ops(concrete: Any) -> list[str]:
    """`op_type name` of each node in a traced step that cannot be compiled for a TPU: a host-only op
    (HOST_ONLY_OPS, summaries) or any string tensor."""
    bad = []
    for node in _graph_nodes(concrete):
        types = []
        for value in node.attr.values():
            types += [value.type] if value.type else list(value.list.type)
        if (node.op in HOST_ONLY_OPS or "Summary" in node.op or tf.string.as_datatype_enum in types):
            bad.append(f"{node.op} {node.name}")
    return bad


def dynamic_inputs(concrete: Any) -> list[str]:
    """Inputs of a traced step (batch tensors and captured variables) whose shape is not fully static."""
    return [f"{t.name} {t.shape}" for t in concrete.inputs if not t.shape.is_fully_defined()]


# --------------------------------------------------------------------------------- the dry run

def _with_batch(spec: dict[str, tf.TensorSpec], batch: int) -> dict[str, tf.TensorSpec]:
    for k, s in spec.items():
        if not s.shape.is_fully_defined():
            raise HarnessError(f"input {k!r} has shape {s.shape}: a compiled step needs static shapes")
    return {k: tf.TensorSpec([batch] + s.shape.as_list(), s.dtype, name=k) for k, s in spec.items()}


def eval_replica_fn(steps: CompiledSteps) -> tuple[Callable, str | None]:
    """The eval computation one replica runs: the loop's own when it exposes it, else the smallest
    equivalent (the workload's eval_step plus the example count), said in the second value."""
    own = getattr(steps, "eval_replica_step", None)
    if own is not None:
        return own, None

    def replica(batch: dict[str, tf.Tensor]) -> Any:
        batch = dict(batch)
        mask, index = batch.pop(MASK), batch.pop(INDEX)
        out = dict(steps.workload.eval_step(batch, mask))
        out[COUNT] = tf.reduce_sum(mask)
        out[INDEX] = index
        return out

    return replica, ("eval step: the loop's per-replica eval function is nested in this version, so the "
                     "workload's eval_step plus the mask count is compiled")


def standin_checked(cfg: config_lib.Config) -> tuple[Checked, StandInRuntime, DevicePlan]:
    """The config's workload on the stand-in runtime after the run's pre-log checks (`preflight`), with
    its inputs described from the config."""
    plan = device_plan(cfg)
    runtime = StandInRuntime(cfg, plan)
    return preflight(cfg, runtime, dry_run=True), runtime, plan


def useful_train_flops(cfg: config_lib.Config, per_replica_batch: int) -> float:
    """What the workload's cost module counts as useful for one replica's train step (0: no cost module), so
    the report can show how much more the compiled step does (dense MoE dispatch, padding, recompute)."""
    return mfu.train_flops_per_sample(cfg) * per_replica_batch


# A model whose float32 weights and two optimizer slots would take more than this share of the host's memory
# is compiled at the smaller sizes its workload names (Workload.DRY_RUN_LINEAR) and extrapolated.
HOST_MEMORY_SHARE = 0.5
# The report's numbers that grow linearly with a layer count or a vocabulary size.
_LINEAR_FIELDS = ("params", "replica_params", "train_flops_per_replica_step", "eval_flops_per_replica_step",
                  "weight_bytes_per_device", "optimizer_bytes_per_device", "gradient_bytes",
                  "gradient_bytes_per_device", "activation_bytes_per_device", "peak_bytes_per_device",
                  "eval_peak_bytes_per_device", "fsdp_saved_bytes_per_device", "fsdp_replicated_bytes")


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _too_big_for_host(cfg: config_lib.Config) -> bool:
    from benchmarks import registry

    declared = registry.cost_model(cfg.workload)
    if declared is None:
        return False
    cost = declared.model_cost(cfg)
    # a frozen base (not in `params`: no gradients, no optimizer state) counts as the bytes it is held in
    return cost.params * 12 + cost.frozen_bytes > HOST_MEMORY_SHARE * host_memory_bytes()


@contextlib.contextmanager
def _model_freed_after() -> Any:
    """Frees what a compile built (weights, optimizer state) when it is done, before the next is built. A
    `tf.custom_gradient` traced in a graph (decoder remat's `tf.recompute_grad`, the MoE dispatch's gathers)
    registers its gradient function in TensorFlow's process-wide gradient registry under a fresh name and never
    removes it; the function's closure holds the layers, so every compiled model would stay in memory. The
    names this compile registered are dropped once its gradients are traced."""
    from tensorflow.python.framework import ops as tf_ops

    registry = tf_ops.gradient_registry._registry  # noqa: SLF001 - no public way to unregister
    before = set(registry)
    try:
        yield
    finally:
        for name in set(registry) - before:
            if name.startswith("CustomGradient-"):
                del registry[name]
        gc.collect()


def _compile_here(config_path: str, overrides: list[str], optimize: bool, full: config_lib.Config) -> CompileReport:
    with _model_freed_after():
        report = compile_report(config_path, overrides, optimize, stand_in=False, full=full)
        report.traced = {}  # a traced step holds its model's variables
    return report


# Each small compile of a model too big for this host runs in a Python process of its own: what XLA and the
# allocators keep after a compile (several GB at full width) would otherwise add up over the compiles, and a
# process hands everything back when it ends. Tests that stand a fake in for `compile_report` set it False.
COMPILE_APART = True


def _compile_apart(config_path: str, overrides: list[str], optimize: bool, full: config_lib.Config) -> CompileReport:
    """`_compile_here` in a new Python process (arguments and report pickled through files); its HarnessError
    comes back as one; its console output is dropped unless it fails otherwise."""
    import pickle
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dryrun-") as tmp:
        args, out = os.path.join(tmp, "args.pkl"), os.path.join(tmp, "report.pkl")
        with open(args, "wb") as f:
            pickle.dump((config_path, overrides, optimize, full), f)
        code = "import sys; from harness.train import dryrun; dryrun._compile_child(sys.argv[1], sys.argv[2])"
        proc = subprocess.run([sys.executable, "-c", code, args, out], capture_output=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")))
        if not os.path.exists(out):
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            killed = " (killed: out of host memory?)" if proc.returncode in (-9, 137) else ""
            raise HarnessError(f"the stood-in compile of {os.path.basename(config_path)} with {overrides} failed "
                               f"(exit {proc.returncode}{killed}): {last[0].strip()[:300]}")
        with open(out, "rb") as f:
            ok, value = pickle.load(f)
    if not ok:
        raise HarnessError(value)
    return value


def _compile_child(args: str, out: str) -> None:
    import pickle

    with open(args, "rb") as f:
        config_path, overrides, optimize, full = pickle.load(f)
    try:
        result = (True, _compile_here(config_path, overrides, optimize, full))
    except HarnessError as e:
        result = (False, str(e))
    with open(out, "wb") as f:
        pickle.dump(result, f)


def linear_stand_in(config_path: str, overrides: list[str], optimize: bool, cfg: config_lib.Config,
                    sizes: dict[str, tuple[int, int]],
                    pairs: tuple[tuple[str, str], ...] = ()) -> CompileReport:
    """The report of a model too big to build here, from compiles at small values of the config keys it is
    linear in (`sizes`: key -> (a, b)): one at every key's `a`, one per key at its `b`, and one per `pairs`
    entry with both keys at `b` (keys whose effects multiply, e.g. layers x experts per layer). Each number is
    extrapolated as base + sum over keys of f_k x (its change from a to b) + sum over pairs of f_i x f_j x
    (the pair's change beyond the two single changes), f_k = (full value - a) / (b - a). Exact for
    parameters, FLOPs and bytes of weights, gradients and optimizer state; the activation and peak memory
    estimates assume XLA's plan grows so too."""
    from harness.train.reference import lookup

    def compiled(extra: list[str]) -> CompileReport:
        return (_compile_apart if COMPILE_APART else _compile_here)(config_path, overrides + extra, optimize, cfg)

    base = [f"{k}={a}" for k, (a, _) in sizes.items()]
    r0 = compiled(base)
    slopes: dict[str, list[tuple[float, Any]]] = {}
    seconds = dict(r0.compile_seconds)
    for key, (a, b) in sizes.items():
        rk = compiled([x for x in base if not x.startswith(key + "=")] + [f"{key}={b}"])
        seconds = {w: seconds[w] + rk.compile_seconds[w] for w in seconds}
        slopes[key] = [((lookup(cfg, key) - a) / (b - a), rk)]
    cross = []
    for ki, kj in pairs:
        rij = compiled([x for x in base if not x.startswith((ki + "=", kj + "="))]
                       + [f"{ki}={sizes[ki][1]}", f"{kj}={sizes[kj][1]}"])
        seconds = {w: seconds[w] + rij.compile_seconds[w] for w in seconds}
        cross.append((slopes[ki][0][0] * slopes[kj][0][0], slopes[ki][0][1], slopes[kj][0][1], rij))
    values = {}
    for name in _LINEAR_FIELDS:
        v0 = getattr(r0, name)
        if v0 is None:
            values[name] = None
            continue
        total = v0 + sum(f * (getattr(rk, name) - v0) for pts in slopes.values() for f, rk in pts)
        total += sum(f * (getattr(rij, name) - getattr(ri, name) - getattr(rj, name) + v0)
                     for f, ri, rj, rij in cross)
        values[name] = type(v0)(round(total)) if isinstance(v0, int) else float(total)
    built = ", ".join(f"{k}={a} and {b}" for k, (a, b) in sizes.items())
    full = ", ".join(f"{k}={lookup(cfg, k)}" for k in sizes)
    both = "".join(f", {i} and {j} together at {sizes[i][1]} and {sizes[j][1]}" for i, j in pairs)
    note = (f"model: too big to build on this host ({host_memory_bytes() / 2**30:.0f} GiB), so it was compiled "
            f"{len(sizes) + 1 + len(pairs)} times at {built}{both} (everything else full size) and each number "
            f"extrapolated to {full} ({'bi' if pairs else ''}linearly); activations and peaks assume XLA's plan "
            f"grows so too")
    return dataclasses.replace(
        r0, **values, config=config_path, compile_seconds={w: round(v, 2) for w, v in seconds.items()},
        useful_train_flops_per_replica_step=useful_train_flops(cfg, r0.per_replica_batch),
        stand_in=[note] + r0.stand_in)


def micro_batched_stand_in(config_path: str, overrides: list[str], optimize: bool, cfg: config_lib.Config,
                           sizes: dict[str, tuple[int, int]],
                           pairs: tuple[tuple[str, str], ...] = ()) -> CompileReport:
    """`linear_stand_in` for a step of many accumulated micro-batches, which the loop unrolls (one copy of the
    forward and backward pass per micro-batch: too long to compile at 64): compiled with 1 micro-batch (trace
    only: its FLOPs) and with 2, each of the real per-replica rows. A step's FLOPs are the optimizer's plus
    its micro-batches' (1 + (k - 1) x the difference); its memory is the 2-micro-batch step's (one
    micro-batch's activations live at a time beside the accumulated gradients, whatever k)."""
    schedule = cfg.schedule
    k = schedule.gradient_accumulation_steps
    rows = schedule.global_batch_size // k
    pinned = overrides + [f"schedule.eval_batch_size={schedule.eval_batch_size or schedule.global_batch_size}"]
    one = linear_stand_in(config_path, pinned + [f"schedule.global_batch_size={rows}",
                                                 "schedule.gradient_accumulation_steps=1"], False, cfg, sizes, pairs)
    two = linear_stand_in(config_path, pinned + [f"schedule.global_batch_size={2 * rows}",
                                                 "schedule.gradient_accumulation_steps=2"], optimize, cfg, sizes, pairs)
    per_replica = schedule.global_batch_size // two.replicas
    flops = one.train_flops_per_replica_step + (k - 1) * (two.train_flops_per_replica_step
                                                          - one.train_flops_per_replica_step)
    note = (f"train step: {k} accumulated micro-batches of {per_replica // k} row(s) per replica, compiled with 1 "
            f"(FLOPs only) and 2: FLOPs = the 1-micro-batch step's + {k - 1} x the second micro-batch's; memory "
            f"the 2-micro-batch step's")
    return dataclasses.replace(
        two, per_replica_batch=per_replica, global_batch=schedule.global_batch_size, train_flops_per_replica_step=flops,
        useful_train_flops_per_replica_step=useful_train_flops(cfg, per_replica),
        compile_seconds={w: round(one.compile_seconds[w] + two.compile_seconds[w], 2) for w in two.compile_seconds},
        stand_in=[note] + [n for n in two.stand_in if not n.startswith("train step: ")])


def compile_report(config_path: str, overrides: list[str], optimize: bool = True,
                   stand_in: bool = True, full: config_lib.Config | None = None) -> CompileReport:
    """Builds the full-size model of `config_path` on a stand-in replica and compiles its steps
    (`optimize=False`: trace and count only, no XLA HLO passes, so no peak memory; for quick checks). A model
    too big for this host is compiled smaller and extrapolated (`linear_stand_in`) where its workload allows;
    `full`: the config such a smaller compile stands in for (`Workload.stand_in_for`)."""
    from benchmarks import registry

    cfg = config_lib.load_config(config_path, overrides)
    workload_class = registry.get(cfg.workload)
    sizes = getattr(workload_class, "DRY_RUN_LINEAR", None)
    # The pre-log checks run on the config as given, also when the model is compiled at smaller sizes below:
    # a size that does not split over the layout is refused here as `run` would refuse it.
    checked, runtime, plan = standin_checked(cfg)
    if stand_in and sizes and _too_big_for_host(cfg):
        pairs = getattr(workload_class, "DRY_RUN_PAIRS", ())
        if cfg.schedule.gradient_accumulation_steps > 2:
            report = micro_batched_stand_in(config_path, overrides, optimize, cfg, sizes, pairs)
        else:
            report = linear_stand_in(config_path, overrides, optimize, cfg, sizes, pairs)
        report.stand_in += checked.workload.dry_run_notes()
        return report
    workload = checked.workload
    if full is not None:
        workload.stand_in_for(full)
    train_spec, eval_spec, data_notes = checked.dry_run_inputs
    own_experts = workload.experts_stay_put() and runtime.hold_own_experts()
    with runtime.scope():
        workload.build()
    steps = CompiledSteps(runtime, workload)

    gbs = cfg.schedule.global_batch_size
    ebs = cfg.schedule.eval_batch_size or gbs
    per_replica, eval_per_replica = gbs // plan.replicas, ebs // plan.replicas
    train_batch = _with_batch(train_spec, per_replica)
    eval_batch = _with_batch(dict(eval_spec, **{MASK: tf.TensorSpec([], tf.float32),
                                                INDEX: tf.TensorSpec([], tf.int64)}), eval_per_replica)
    train = compile_step(steps.train_step, train_batch, cfg.workload, "train", optimize)
    eval_fn, eval_note = eval_replica_fn(steps)
    evaluation = compile_step(eval_fn, eval_batch, cfg.workload, "eval", optimize)

    model_vars = [v for v in runtime.variables() if not v.path.startswith(f"{workload.optimizer.name}/")]
    opt_vars = [v for v in runtime.variables() if v.path.startswith(f"{workload.optimizer.name}/")]

    def per_device(infos: list, fsdp: bool | None = None) -> int:  # the model's variables as laid out
        return int(sum(math.prod(v.shape) * v.variable.dtype.size / runtime.layout_shards(v.dims, v.shape, fsdp)
                       for v in infos))

    def whole(infos: list) -> int:  # what this replica's program holds (its own experts only, where it holds so)
        return int(sum(v.variable.shape.num_elements() * v.variable.dtype.size for v in infos))

    trainable = runtime.variables(trainable=True)
    memory = memory_per_device(
        train.peak_bytes, evaluation.peak_bytes, plan.model_axis,
        state=(whole(model_vars) + whole(opt_vars), per_device(model_vars) + per_device(opt_vars)),
        eval_state=(whole(model_vars), per_device(model_vars)),
        gradients=(whole(trainable), per_device(trainable)))
    notes = list(plan.notes) + [
        "one CPU device compiled one replica's program at its per-replica batch; cross-replica sums "
        "(gradients, loss counts, batch-norm groups) are identities there, so no collective is compiled",
        "the warm-up's copy of the initial state is kept in host memory, not on the devices"]
    if own_experts:
        n = runtime.local_experts
        notes.append(f"expert parallelism {n}: the device holds its own 1/{n} of each layer's experts (weights, "
                     f"gradients, optimizer state) and runs them on the slots every device sends it; the "
                     f"all-to-all there and back is a local transpose of its own slots (same shapes and work, "
                     f"its own tokens standing in for the other devices'), so no traffic is compiled")
    if plan.model_axis > 1:
        notes.append(f"each replica spans {plan.model_axis} devices: FLOPs are the whole replica's (work the "
                     f"devices repeat is counted once); bytes of weights, optimizer state and gradients per "
                     f"device divide each variable by its layout; activations are an estimate (memory source)")
    fsdp: dict[str, int] = {}
    if runtime.fsdp:
        data = runtime.sizes[runtime.rules["batch"]]
        everything = model_vars + opt_vars + trainable  # state, then gradients (split as their variables)
        fsdp = dict(fsdp_data_axis=data,
                    fsdp_saved_bytes_per_device=per_device(everything, False) - per_device(everything),
                    fsdp_replicated_bytes=int(sum(
                        math.prod(v.shape) * v.variable.dtype.size for v in model_vars + opt_vars
                        if runtime.layout_shards(v.dims, v.shape, True)
                        == runtime.layout_shards(v.dims, None, False)
                        and runtime.rules["batch"] not in runtime.mesh_dims_used(v.dims))))
        kept = ("kept for the backward pass, or gathered again in a recomputed layer (model.remat)"
                if getattr(workload.cfg.model, "remat", False) else "kept for the backward pass")
        notes.append(f"FSDP: weights, optimizer state and gradients per device are split over data={data} as "
                     f"the mesh runtime lays them out; each weight is also gathered whole where it is used "
                     f"(an all-gather per weight per step, {kept}), which this compile of whole variables does "
                     f"not show apart")
    notes += data_notes + ([eval_note] if eval_note else []) + (workload.dry_run_notes() if full is None else [])
    if workload.cfg.schedule.gradient_accumulation_steps > 1:
        notes.append(f"train step: {workload.cfg.schedule.gradient_accumulation_steps} accumulated micro-batches")
    return CompileReport(
        workload=cfg.workload, config=config_path, replicas=plan.replicas, model_axis=plan.model_axis,
        per_replica_batch=per_replica, global_batch=gbs, eval_per_replica_batch=eval_per_replica,
        params=int(sum(math.prod(v.shape) for v in trainable)),
        replica_params=int(sum(v.variable.shape.num_elements() for v in trainable)),
        train_flops_per_replica_step=train.flops, eval_flops_per_replica_step=evaluation.flops,
        useful_train_flops_per_replica_step=useful_train_flops(cfg, per_replica),
        flops_source="counted (from the HLO module TensorFlow gives XLA: dot/convolution 2 per multiply-add, "
                     "elementwise 1 per element, while-loop bodies once; XLA's HloCostAnalysis is not exposed "
                     "by TensorFlow's Python API)",
        weight_bytes_per_device=per_device(model_vars), optimizer_bytes_per_device=per_device(opt_vars),
        gradient_bytes=whole(trainable), gradient_bytes_per_device=per_device(trainable),
        activation_bytes_per_device=memory.activations, peak_bytes_per_device=memory.peak,
        eval_peak_bytes_per_device=memory.eval_peak, memory_source=memory.source,
        compile_seconds={"train": round(train.seconds, 2), "eval": round(evaluation.seconds, 2)},
        runtime_kind=cfg.runtime.kind, precision=cfg.runtime.precision, stand_in=notes, **fsdp,
        traced={"train": train.traced, "eval": evaluation.traced})


@dataclasses.dataclass
class DeviceMemory:
    peak: int | None
    eval_peak: int | None
    activations: int | None
    source: str


def memory_per_device(peak: int | None, eval_peak: int | None, devices: int, state: tuple[int, int],
                      eval_state: tuple[int, int], gradients: tuple[int, int]) -> DeviceMemory:
    """Per-device memory of one replica's steps from XLA:CPU's plan of the whole (unpartitioned) replica.

    `state`, `eval_state` and `gradients` are (whole replica, per device) bytes, the per-device part from
    each variable's layout. The activation estimate is the plan's peak less the replica's whole state and
    gradients (activations and every other temporary), split evenly over the replica's `devices`. Where a
    replica is one device holding whole variables the plan's peak is the peak; otherwise (a model axis,
    spatial partitioning, variables split over the data axis) it is this device's state and gradients
    plus its activations. None without a plan (a trace-only dry run)."""
    if peak is None:
        return DeviceMemory(None, None, None, "no XLA memory plan (trace only)")
    activations = max(peak - state[0] - gradients[0], 0) // devices
    if devices == 1 and state[0] == state[1] and gradients[0] == gradients[1]:
        return DeviceMemory(peak, eval_peak, activations, (
            "XLA:CPU buffer assignment of the replica's step (TPU tiling and GPU fusion differ); activations "
            "= that peak less weights, optimizer state and gradients"))
    eval_activations = None if eval_peak is None else max(eval_peak - eval_state[0], 0) // devices
    return DeviceMemory(
        state[1] + gradients[1] + activations,
        None if eval_activations is None else eval_state[1] + eval_activations,
        activations,
        f"estimate: XLA:CPU buffer assignment of the whole, unpartitioned replica less its weights, optimizer "
        f"state and gradients, split evenly over its {devices} devices (a lower bound where the layout keeps "
        f"an activation whole on every device, e.g. the hidden stream on a model axis); plus this device's "
        f"shards of weights, optimizer state and gradients")


def main(config_path: str, overrides: list[str], json_path: str | None = None) -> int:
    """`run CONFIG --dry_run`: prints the report (and writes it as JSON); 0, or HarnessError -> 2."""
    report = compile_report(config_path, overrides)
    for line in report.lines():
        print(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        print(f"json: {json_path}")
    cfg = config_lib.load_config(config_path, overrides)
    check_device_memory(report, cfg.submission.platform, kept_activations(cfg, report))
    return 0


def kept_activations(cfg: config_lib.Config, report: CompileReport) -> int:
    """The workload's lower bound of what its train step keeps for the backward pass per device
    (`kept_activation_bytes(cfg, rows)` of its cost module, the decoder LMs: each layer's input), for the
    rows of one micro-batch of a replica; 0 where the workload states none."""
    from benchmarks import registry

    declared = registry.cost_model(cfg.workload)
    floor = declared.kept_activation_bytes if declared is not None else None
    if floor is None:
        return 0
    return int(floor(cfg, report.per_replica_batch // max(1, cfg.schedule.gradient_accumulation_steps)))


def check_device_memory(report: CompileReport, platform: str, kept: int = 0) -> None:
    """Refuses (HarnessError) a run whose weights, gradients and optimizer state per device (exact, from
    the layout), plus `kept` (activations no step can do without, a lower bound), exceed the memory of the
    device `platform` names (harness.platforms.device_memory; unknown devices are not checked); prints a
    warning where the train peak estimate (activations from XLA:CPU's plan, an upper bound) does."""
    known = device_memory(platform)
    if known is None:
        return
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    state = report.weight_bytes_per_device + report.gradient_bytes_per_device + report.optimizer_bytes_per_device
    if state > known[0]:
        raise HarnessError(
            f"{report.workload} needs {gib(state)} per device for weights ({gib(report.weight_bytes_per_device)}), "
            f"gradients ({gib(report.gradient_bytes_per_device)}) and optimizer state "
            f"({gib(report.optimizer_bytes_per_device)}) before any activation, but one {known[1]} holds "
            f"{gib(known[0])}; split them (runtime.fsdp=true on a mesh, or a model axis)")
    if state + kept > known[0]:
        raise HarnessError(
            f"{report.workload} needs at least {gib(state + kept)} per device: weights, gradients and optimizer "
            f"state ({gib(state)}) and the activations its backward pass cannot do without ({gib(kept)}: each "
            f"layer's input for {report.per_replica_batch} row(s) per replica), but one {known[1]} holds "
            f"{gib(known[0])}; split the weights further (runtime.fsdp=true, more devices) or the rows")
    peak = report.peak_bytes_per_device
    if peak is not None and peak > known[0]:
        print(f"warning: the train step's peak estimate is {gib(peak)} per device, above the {gib(known[0])} of "
              f"one {known[1]}: its activations ({gib(report.activation_bytes_per_device or 0)}, XLA:CPU's plan in "
              f"float32, an upper bound) need a smaller per-device batch or less kept for the backward pass")
