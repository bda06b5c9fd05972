"""The projection: step time from physics, steps from the convergence tables, evals from the cadence.

Per step of one chip (a replica spans `model_axis` chips):
  compute          = train FLOPs per sample x per-replica batch / model_axis / (peak x efficiency)
  all-reduce       = the gradient bytes / model_axis over the data-parallel group (collectives.py); the
                     part hidden under the backward pass (2/3 of compute, times the system's
                     allreduce_overlap) is subtracted, the rest is exposed
  model-parallel   = activation all-reduces inside the model group (the workload's mp bytes per sample)
  other            = the optimizer update's HBM traffic (params / model_axis x bytes per parameter / HBM
                     bandwidth), which does not shrink with the per-chip batch
Time to train = steps x step + evals x (eval FLOPs / (chips x peak x efficiency) + host scoring).
Init is printed apart: MLPerf's clock starts at run_start, after init.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from harness.errors import HarnessError
from harness.plan import collectives
from harness.plan.converge import Convergence
from harness.plan.cost import ModelCost
from harness.plan.system import System

BACKWARD_SHARE = 2.0 / 3.0  # backward = 2 x forward of the 3 x forward a training step costs


@dataclasses.dataclass
class StepTime:
    compute: float
    allreduce: float          # the whole gradient all-reduce
    allreduce_exposed: float  # what is left after the overlap with the backward pass
    model_parallel: float
    other: float

    @property
    def total(self) -> float:
        return self.compute + self.allreduce_exposed + self.model_parallel + self.other


@dataclasses.dataclass
class Projection:
    chips: int
    model_axis: int
    replicas: int
    global_batch: int
    per_replica_batch: float
    steps_per_epoch: float
    converge: Convergence
    steps: int
    step: StepTime
    evals: int
    eval_seconds: float       # one eval
    eval_compute_seconds: float
    host_eval_seconds: float
    init_seconds: float | None
    efficiency: float

    @property
    def train_seconds(self) -> float:
        return self.steps * self.step.total

    @property
    def total_seconds(self) -> float:
        return self.train_seconds + self.evals * self.eval_seconds

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["step"]["total"] = self.step.total
        d.update(train_seconds=self.train_seconds, total_seconds=self.total_seconds)
        return d


def check_chips(system: System, chips: int, model_axis: int = 1) -> None:
    if chips < 1:
        raise HarnessError(f"--chips {chips}: give a positive number of chips")
    if model_axis < 1 or chips % model_axis:
        raise HarnessError(f"--chips {chips} is not a multiple of the model axis {model_axis}")
    if system.topology == "hierarchical" and chips > system.chips_per_host and chips % system.chips_per_host:
        raise HarnessError(f"--chips {chips}: {system.name} has {system.chips_per_host} GPUs per host; use a "
                           f"multiple of {system.chips_per_host} above one host")


def step_time(cost: ModelCost, system: System, chips: int, global_batch: float, efficiency: float,
              model_axis: int = 1) -> StepTime:
    replicas = chips // model_axis
    per_replica = global_batch / replicas
    compute = cost.train_flops_per_sample * per_replica / model_axis / (system.peak_flops * efficiency)
    allreduce = collectives.allreduce_seconds(system, cost.gradient_bytes / model_axis, replicas, model_axis)
    hidden = min(allreduce, system.allreduce_overlap * BACKWARD_SHARE * compute)
    mp = collectives.model_group_allreduce_seconds(system, cost.mp_bytes_per_sample * per_replica, model_axis)
    other = cost.params / model_axis * cost.optimizer_bytes_per_param / system.hbm_bandwidth
    return StepTime(compute, allreduce, allreduce - hidden, mp, other)


def solve_efficiency(cost: ModelCost, system: System, chips: int, global_batch: float, step_seconds: float,
                     model_axis: int = 1) -> float:
    """The efficiency at which the step model gives `step_seconds` (bisection: the step time falls
    monotonically as efficiency rises). HarnessError when the non-compute terms alone exceed the step."""
    def total(eff: float) -> float:
        return step_time(cost, system, chips, global_batch, eff, model_axis).total

    if total(1.0) > step_seconds:
        raise HarnessError(f"calibration: the measured step ({step_seconds * 1e3:.2f} ms) is shorter than the "
                           f"model's step at 100% of peak ({total(1.0) * 1e3:.2f} ms); the model cost or the "
                           "system figures do not fit these logs")
    lo, hi = 1e-6, 1.0
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if total(mid) > step_seconds:
            lo = mid
        else:
            hi = mid
    return hi


def project(cost: ModelCost, system: System, converge: Convergence, chips: int, global_batch: int,
            efficiency: float, model_axis: int = 1, host_eval_seconds: float | None = None,
            init_seconds: float | None = None) -> Projection:
    check_chips(system, chips, model_axis)
    replicas = chips // model_axis
    if global_batch < replicas:
        raise HarnessError(f"global batch {global_batch} is smaller than the {replicas} data-parallel replicas "
                           f"of {chips} chips (model axis {model_axis}); raise --global_batch or the model axis")
    step = step_time(cost, system, chips, global_batch, efficiency, model_axis)
    steps_per_epoch = cost.train_samples / global_batch
    stop = converge.value if converge.stop is None else converge.stop
    samples = stop * cost.train_samples if converge.unit == "epochs" else stop
    host = cost.eval_host_seconds if host_eval_seconds is None else host_eval_seconds
    eval_compute = cost.eval_flops_per_sample * cost.eval_samples / (chips * system.peak_flops * efficiency)
    return Projection(chips, model_axis, replicas, global_batch, global_batch / replicas, steps_per_epoch, converge,
                      int(math.ceil(samples / global_batch - 1e-9)), step, converge.evals, eval_compute + host,
                      eval_compute, host, init_seconds, efficiency)
