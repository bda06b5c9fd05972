"""The real run's devices, from the config alone, and the one CPU device that stands in for one replica.

`device_plan` reads the replica count and devices per replica the run would have; `StandInRuntime` compiles one
replica's program on this host's CPU while answering every size question (layouts, the mesh's batch-norm
groups, experts held per device) as the real runtime would; `standin_checked` runs the run's own pre-log
checks on it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import tensorflow as tf

from harness import config as config_lib
from harness.errors import HarnessError
from harness.platforms import GPU_COUNT, tpu_devices
from harness.runtime.base import check_spatial_partition
from harness.runtime.distribute import StrategyRuntime
from harness.train.preflight import Checked, preflight


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


def standin_checked(cfg: config_lib.Config) -> tuple[Checked, StandInRuntime, DevicePlan]:
    """The config's workload on the stand-in runtime after the run's pre-log checks (`preflight`), with
    its inputs described from the config."""
    plan = device_plan(cfg)
    runtime = StandInRuntime(cfg, plan)
    return preflight(cfg, runtime, dry_run=True), runtime, plan
