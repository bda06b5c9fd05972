"""The projection: step time from physics, steps from the convergence tables, evals from the cadence.

Per step of one chip (a replica spans `model_axis` chips):
  compute          = train FLOPs per sample x per-replica batch / model_axis / (peak x efficiency)
  all-reduce       = the gradient bytes / model_axis over the data-parallel group (collectives.py); the
                     part hidden under the backward pass (2/3 of compute, times the system's
                     allreduce_overlap) is subtracted, the rest is exposed
  model-parallel   = activation all-reduces inside the model group (the workload's mp bytes per sample)
  other            = the optimizer update's HBM traffic (params / model_axis x bytes per parameter / HBM
                     bandwidth), which does not shrink with the per-chip batch
  FSDP             = with cost.fsdp_gather_bytes (runtime.fsdp): the weights all-gathered over the data-parallel
                     group for the forward pass, again for the backward pass (cost.fsdp_gathers_per_step), and
                     the gradients reduce-scattered instead of all-reduced (collectives.py: each half a ring
                     all-reduce); the forward gather hides under the forward pass (1/3 of compute), the
                     backward gathers and the reduce-scatter under the backward pass (the reduce-scatter
                     first), each times allreduce_overlap; each chip updates its shard of the optimizer state
  fixed            = the system's step_overhead_seconds (launches, kernels too small to fill a chip, the host
                     loop): what keeps a step from shrinking to nothing at 1-8 samples per chip
With a layout (harness/plan/layout.py; the planner passes the config's, calibrations and scripts/validate_plan.py
project without one):
  micro-batches    = FSDP gathers the weights in every micro-batch (gathers per step x micro-batches)
  experts split    = the expert weights leave the FSDP gathers and the data-parallel reduction (their gradients
                     reduce over the replicas that share an expert, none when every chip owns its own); the
                     all-to-all's bytes (layout.alltoall_bytes) over the expert axis, all of it exposed (the
                     tokens wait for their experts); without the all-to-all dispatch the expert weights are
                     gathered over the expert axis where used and their gradients reduce-scattered, as FSDP
  remat            = the recomputed forward pass: the forward FLOPs a sample (eval_flops_per_sample) more,
                     at the same efficiency; not in the model FLOPs (MFU counts useful work only)
One eval is three parts, each scaled the way it runs (EvalTime):
  device           = the forward pass over the eval set split over the chips: eval FLOPs / (chips x peak x
                     efficiency), or the calibration's measured device part x calibration chips / chips
  host             = scoring on one host per eval sample (COCO mAP, BLEU): host seconds per sample x samples
  fixed            = the workload's fixed cost per eval, plus one fixed step cost per eval step (the eval set
                     in global batches: a count that does not shrink with the chips)
Synchronous evals add all three each time. Asynchronous ones (scored while training goes on) take the
chips for their device part each time, but only the last one's host and fixed parts are on the clock (the
run stops when its result is known).
Time to train = steps x step + the evals. Init is printed apart: MLPerf's clock starts at run_start.

Calibration (`calibrate`) solves the step model for the efficiency that reproduces a measured step, and
splits a measured eval by this rule: host and fixed are the workload's stated figures (not fitted; when
they exceed the measurement they are scaled down to it), the rest is device work at the calibration's chip
count. An asynchronous eval's device part ran on the training chips, so it is taken out of the measured
step before solving.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from harness.errors import HarnessError
from harness.plan import collectives
from harness.plan.converge import Convergence
from harness.plan.cost import ModelCost
from harness.plan.layout import Layout
from harness.plan.system import System

BACKWARD_SHARE = 2.0 / 3.0  # backward = 2 x forward of the 3 x forward a training step costs


@dataclasses.dataclass
class StepTime:
    compute: float
    allreduce: float          # the whole gradient reduction (FSDP: its reduce-scatter)
    allreduce_exposed: float  # what is left after the overlap with the backward pass
    model_parallel: float
    other: float
    fixed: float = 0.0        # the system's fixed per-step cost
    fsdp_gather: float = 0.0  # FSDP's weight all-gathers left exposed
    fsdp_gather_total: float = 0.0  # all of them (forward and backward), hidden or not
    alltoall: float = 0.0     # the experts' all-to-alls (exposed)
    recompute: float = 0.0    # remat's recomputed forward pass
    alltoall_bytes: float = 0.0  # what one chip sends in them a step

    @property
    def total(self) -> float:
        return (self.compute + self.allreduce_exposed + self.model_parallel + self.other + self.fixed
                + self.fsdp_gather + self.alltoall + self.recompute)


@dataclasses.dataclass
class EvalTime:
    device: float             # split over the chips (forward pass, its eval steps' fixed costs)
    host: float               # host scoring per eval sample, on one host
    fixed: float              # per eval, whatever the chips
    mode: str = "sync"        # "sync" | "async"
    source: str = "documented"  # "documented" | "calibrated"

    @property
    def one(self) -> float:
        return self.device + self.host + self.fixed

    def total(self, evals: int) -> float:
        """Seconds the evals add to the time to train."""
        if evals <= 0:
            return 0.0
        if self.mode == "async":
            return evals * self.device + self.host + self.fixed
        return evals * self.one


@dataclasses.dataclass
class Calibration:
    """What one scale's logs fix: the efficiency, and the device part of one eval at `chips`."""
    efficiency: float
    chips: int
    global_batch: int
    step_seconds: float                 # as measured (asynchronous evals' device part still inside)
    eval_mode: str = "sync"             # "sync" | "async" | "untimed" (no eval intervals in the logs)
    eval_seconds: float | None = None   # one measured eval (sync: its interval; async: its interval)
    eval_device_seconds: float | None = None  # its device part at `chips`; None: from FLOPs
    eval_host_seconds: float = 0.0
    eval_fixed_seconds: float = 0.0

    def describe(self) -> str:
        if self.eval_device_seconds is None:
            return f"evals {self.eval_mode} in the logs: device part from FLOPs, host and fixed parts documented"
        return (f"measured {self.eval_mode} eval {self.eval_seconds:.3f} s at {self.chips} chips = device "
                f"{self.eval_device_seconds:.3f} s (split over chips) + host {self.eval_host_seconds:.3f} s + "
                f"fixed {self.eval_fixed_seconds:.3f} s (host and fixed: the workload's stated figures)")


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
    eval: EvalTime            # one eval, by part
    init_seconds: float | None
    efficiency: float
    model_flops_per_s: float = 0.0  # useful train FLOPs x samples/s over the training steps (all chips)
    mfu: float = 0.0                # model_flops_per_s / (chips x peak)
    compiled_flops_per_s: float = 0.0  # the projected cost's own FLOPs x samples/s when it is not the useful count
    precision: str = "bf16"         # whose peak the compute and the MFU use

    @property
    def eval_seconds(self) -> float:
        return self.eval.one

    @property
    def train_seconds(self) -> float:
        return self.steps * self.step.total

    @property
    def eval_total_seconds(self) -> float:
        return self.eval.total(self.evals)

    @property
    def total_seconds(self) -> float:
        return self.train_seconds + self.eval_total_seconds

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["step"]["total"] = self.step.total
        d["eval"]["one"] = self.eval.one
        d.update(train_seconds=self.train_seconds, eval_total_seconds=self.eval_total_seconds,
                 total_seconds=self.total_seconds)
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
              model_axis: int = 1, layout: Layout | None = None, alltoall_bytes: float = 0.0,
              expert_params: float = 0.0) -> StepTime:
    """One step's parts. `layout` (with the all-to-all's bytes per chip and the expert parameters it splits):
    the rules for micro-batches, experts and remat in the module docstring; None: one micro-batch, no experts
    split, no remat (what calibrations assume)."""
    if layout is not None:
        return _laid_out_step(cost, system, global_batch, efficiency, layout, alltoall_bytes, expert_params)
    replicas = chips // model_axis
    per_replica = global_batch / replicas
    compute = cost.train_flops_per_sample * per_replica / model_axis / (system.peak_flops * efficiency)
    fsdp = cost.fsdp_gather_bytes > 0 and replicas > 1
    backward = system.allreduce_overlap * BACKWARD_SHARE * compute          # what the backward pass can hide
    forward = system.allreduce_overlap * (1 - BACKWARD_SHARE) * compute     # and the forward pass
    gather = gather_total = gather_hidden = 0.0
    if fsdp:
        allreduce = collectives.reduce_scatter_seconds(system, cost.gradient_bytes / model_axis, replicas, model_axis)
        gather = collectives.allgather_seconds(system, cost.fsdp_gather_bytes / model_axis, replicas, model_axis)
        gathers = max(1, cost.fsdp_gathers_per_step)
        gather_total = gathers * gather
        hidden = min(allreduce, backward)
        gather_hidden = min(gather, forward) + min((gathers - 1) * gather, backward - hidden)
    else:
        allreduce = collectives.allreduce_seconds(system, cost.gradient_bytes / model_axis, replicas, model_axis)
        hidden = min(allreduce, backward)
    mp = collectives.model_group_allreduce_seconds(system, cost.mp_bytes_per_sample * per_replica, model_axis)
    shards = model_axis * (replicas if fsdp else 1)
    other = cost.params / shards * cost.optimizer_bytes_per_param / system.hbm_bandwidth
    return StepTime(compute, allreduce, allreduce - hidden, mp, other, system.step_overhead_seconds,
                    gather_total - gather_hidden, gather_total)


def _laid_out_step(cost: ModelCost, system: System, global_batch: float, efficiency: float, layout: Layout,
                   alltoall_bytes: float, expert_params: float) -> StepTime:
    m, replicas = layout.model_axis, layout.replicas
    per_replica = global_batch / replicas
    speed = system.peak_flops * efficiency
    compute = cost.train_flops_per_sample * per_replica / m / speed
    recompute = cost.eval_flops_per_sample * per_replica / m / speed if layout.remat else 0.0
    share = expert_params / cost.params if cost.params and layout.expert_axis > 1 else 0.0
    fsdp = layout.fsdp and replicas > 1
    backward = system.allreduce_overlap * BACKWARD_SHARE * (compute + recompute)
    forward = system.allreduce_overlap * (1 - BACKWARD_SHARE) * compute
    dense_grad, expert_grad = cost.gradient_bytes * (1 - share) / m, cost.gradient_bytes * share / m
    sharers = max(1, replicas // layout.expert_axis)  # replicas holding the same experts
    expert_reduce = collectives.allreduce_seconds(system, expert_grad / layout.expert_axis, sharers,
                                                  m * layout.expert_axis) if expert_grad else 0.0
    gathers = max(1, cost.fsdp_gathers_per_step) * layout.micro_batches
    expert_gather = 0.0
    if share and not layout.alltoall:  # the expert weights gathered where used, their gradients reduce-scattered
        expert_gather = collectives.allgather_seconds(system, expert_grad, layout.expert_axis, m)
        expert_reduce += collectives.reduce_scatter_seconds(system, expert_grad, layout.expert_axis, m)
    gather = gather_total = gather_hidden = 0.0
    if fsdp or expert_gather:
        dense_reduce = (collectives.reduce_scatter_seconds(system, dense_grad, replicas, m) if fsdp else
                        collectives.allreduce_seconds(system, dense_grad, replicas, m))
        allreduce = dense_reduce + expert_reduce
        gathered = (cost.fsdp_gather_bytes or cost.gradient_bytes) * (1 - share) / m
        gather = (collectives.allgather_seconds(system, gathered, replicas, m) if fsdp else 0.0) + expert_gather
        gather_total = gathers * gather
        hidden = min(allreduce, backward)
        gather_hidden = (min(gather * layout.micro_batches, forward)
                         + min((gathers - layout.micro_batches) * gather, max(0.0, backward - hidden)))
    else:
        allreduce = collectives.allreduce_seconds(system, dense_grad, replicas, m) + expert_reduce
        hidden = min(allreduce, backward)
    mp = collectives.model_group_allreduce_seconds(system, cost.mp_bytes_per_sample * per_replica, m)
    dense_shards = m * (replicas if fsdp else 1)
    experts = expert_params if share else 0.0
    updated = (cost.params - experts) / dense_shards + experts / (m * layout.expert_axis * (sharers if fsdp else 1))
    other = updated * cost.optimizer_bytes_per_param / system.hbm_bandwidth
    a2a = collectives.alltoall_seconds(system, alltoall_bytes, layout.expert_axis, m) if alltoall_bytes else 0.0
    return StepTime(compute, allreduce, allreduce - hidden, mp, other, system.step_overhead_seconds,
                    gather_total - gather_hidden, gather_total, a2a, recompute, alltoall_bytes)


class FasterThanPeak(HarnessError):
    """A measured step shorter than the step model allows at 100% of peak: the logs did less work a sample
    than the model cost counts (skipped padding, a smaller model) or the system figures are off."""

    def __init__(self, step_seconds: float, floor_seconds: float):
        self.step_seconds, self.floor_seconds = step_seconds, floor_seconds
        super().__init__(f"calibration: the measured step ({step_seconds * 1e3:.2f} ms) is shorter than the "
                         f"model's step at 100% of peak ({floor_seconds * 1e3:.2f} ms); the model cost or the "
                         "system figures do not fit these logs")


def solve_efficiency(cost: ModelCost, system: System, chips: int, global_batch: float, step_seconds: float,
                     model_axis: int = 1) -> float:
    """The efficiency at which the step model gives `step_seconds` (bisection: the step time falls
    monotonically as efficiency rises). FasterThanPeak when the step at 100% of peak is longer."""
    def total(eff: float) -> float:
        return step_time(cost, system, chips, global_batch, eff, model_axis).total

    if total(1.0) > step_seconds:
        raise FasterThanPeak(step_seconds, total(1.0))
    lo, hi = 1e-6, 1.0
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if total(mid) > step_seconds:
            lo = mid
        else:
            hi = mid
    return hi


def eval_steps(cost: ModelCost, global_batch: float) -> int:
    """Steps of one eval: the eval set in global batches (an eval batch the size of the training one)."""
    return max(1, int(math.ceil(cost.eval_samples / max(1.0, global_batch) - 1e-9))) if cost.eval_samples else 0


def stated_eval_parts(cost: ModelCost, system: System, global_batch: float) -> tuple[float, float]:
    """(host, fixed) seconds of one eval as the workload states them; fixed includes one fixed step cost per
    eval step (those steps are the device's, but their count does not shrink with the chips)."""
    host = cost.eval_host_seconds_per_sample * cost.eval_samples
    fixed = cost.eval_fixed_seconds + cost.eval_host_seconds
    return host, fixed + eval_steps(cost, global_batch) * system.step_overhead_seconds


def eval_time(cost: ModelCost, system: System, chips: int, global_batch: float, efficiency: float,
              cal: Calibration | None = None) -> EvalTime:
    """One eval at `chips`, by part (the rule in the module docstring)."""
    host, fixed = stated_eval_parts(cost, system, global_batch)
    flops_device = cost.eval_flops_per_sample * cost.eval_samples / (chips * system.peak_flops * efficiency)
    if cal is None:
        return EvalTime(flops_device, host, fixed, "sync", "documented")
    if cal.eval_mode == "untimed":
        return EvalTime(flops_device, 0.0, 0.0, "sync", "untimed in the calibration logs: host and fixed parts "
                        "inside the measured step")
    # the stated host and fixed parts, scaled down as the calibration had to (1 when they fitted)
    share = (cal.eval_host_seconds + cal.eval_fixed_seconds) / max(1e-12, sum(
        stated_eval_parts(cost, system, cal.global_batch)))
    if cal.eval_mode == "async":
        return EvalTime(flops_device, host * share, fixed * share, "async",
                        "host and fixed bounded by the logs' asynchronous evals, device part from FLOPs")
    steps_fixed = eval_steps(cost, global_batch) * system.step_overhead_seconds
    return EvalTime(cal.eval_device_seconds * cal.chips / chips, host * share,
                    (fixed - steps_fixed) * share + steps_fixed, "sync", "calibrated")


def calibrate(cost: ModelCost, system: System, chips: int, global_batch: int, step_seconds: float,
              eval_seconds: float | None = None, eval_mode: str = "sync", evals: float = 0.0,
              steps: float = 0.0, model_axis: int = 1) -> Calibration:
    """The efficiency and the eval split one scale's measurements give (the rule in the module docstring).
    `evals` and `steps` (per run) matter for asynchronous evals only: their device part leaves the step."""
    host, fixed = stated_eval_parts(cost, system, global_batch)
    if eval_seconds is None or eval_mode not in ("sync", "async"):
        # untimed evals: whatever they cost is inside the measured step already, so only their device part
        # (from FLOPs) is added to a projection
        eff = solve_efficiency(cost, system, chips, global_batch, step_seconds, model_axis)
        return Calibration(eff, chips, global_batch, step_seconds, "untimed")
    if host + fixed > eval_seconds:
        share = eval_seconds / (host + fixed)
        host, fixed = host * share, fixed * share
    if eval_mode == "async":
        # training ran inside the interval, so it bounds the host scoring rather than measures the eval; the
        # device part (the forward pass, on the training chips) comes from FLOPs and leaves the measured step
        # (the device part is bounded by what the interval leaves after host and fixed)
        eff = solve_efficiency(cost, system, chips, global_batch, step_seconds, model_axis)
        room = max(0.0, eval_seconds - host - fixed)
        for _ in range(20):
            device = min(room, cost.eval_flops_per_sample * cost.eval_samples / (chips * system.peak_flops * eff))
            train_step = step_seconds - (evals * device / steps if evals and steps else 0.0)
            eff = solve_efficiency(cost, system, chips, global_batch, train_step, model_axis)
        return Calibration(eff, chips, global_batch, step_seconds, eval_mode, eval_seconds, None, host, fixed)
    device = eval_seconds - host - fixed
    eff = solve_efficiency(cost, system, chips, global_batch, step_seconds, model_axis)
    return Calibration(eff, chips, global_batch, step_seconds, eval_mode, eval_seconds, device, host, fixed)


def project(cost: ModelCost, system: System, converge: Convergence, chips: int, global_batch: int,
            efficiency: float, model_axis: int = 1, calibration: Calibration | None = None,
            init_seconds: float | None = None, layout: Layout | None = None, alltoall_bytes: float = 0.0,
            expert_params: float = 0.0, useful_flops_per_sample: float | None = None,
            precision: str = "bf16") -> Projection:
    """Time to train at `chips` (the module docstring). `system.peak_flops` is the peak of `precision`; MFU
    counts `useful_flops_per_sample` (default: the cost's own count), a cost from a dry run's compiled FLOPs
    giving its own figure beside it."""
    check_chips(system, chips, model_axis)
    replicas = chips // model_axis
    if global_batch < replicas:
        raise HarnessError(f"global batch {global_batch} is smaller than the {replicas} data-parallel replicas "
                           f"of {chips} chips (model axis {model_axis}); raise --global_batch or the model axis")
    step = step_time(cost, system, chips, global_batch, efficiency, model_axis, layout, alltoall_bytes, expert_params)
    steps_per_epoch = cost.train_samples / global_batch
    stop = converge.value if converge.stop is None else converge.stop
    samples = stop * cost.train_samples if converge.unit == "epochs" else stop
    ev = eval_time(cost, system, chips, global_batch, efficiency, calibration)
    useful = cost.train_flops_per_sample if useful_flops_per_sample is None else useful_flops_per_sample
    model_flops = useful * global_batch / step.total
    compiled = (cost.train_flops_per_sample * global_batch / step.total
                if abs(cost.train_flops_per_sample - useful) > 1e-9 * useful else 0.0)
    return Projection(chips, model_axis, replicas, global_batch, global_batch / replicas, steps_per_epoch, converge,
                      int(math.ceil(samples / global_batch - 1e-9)), step, converge.evals, ev, init_seconds,
                      efficiency, model_flops, model_flops / (chips * system.peak_flops), compiled, precision)
