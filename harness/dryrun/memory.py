"""Memory: the host's (is the model too big to build here?) and the devices' (per-device bytes of one
replica's steps from XLA:CPU's plan, and the check against the memory of the device the config names)."""
from __future__ import annotations

import dataclasses
import os

from harness import config as config_lib
from harness.dryrun.report import CompileReport
from harness.errors import HarnessError
from harness.platforms import device_memory

# A model whose float32 weights and two optimizer slots would take more than this share of the host's memory
# is compiled at the smaller sizes its workload names (Workload.DRY_RUN_LINEAR) and extrapolated.
HOST_MEMORY_SHARE = 0.5


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_big_for_host(cfg: config_lib.Config) -> bool:
    """Whether the config's model (float32 weights and two optimizer slots, a frozen base as held) would take
    more than HOST_MEMORY_SHARE of this host's memory, from its declared cost (False where it has none)."""
    declared = cfg.cost_model
    if declared is None:
        return False
    cost = declared.model_cost(cfg)
    # a frozen base (not in `params`: no gradients, no optimizer state) counts as the bytes it is held in
    return cost.params * 12 + cost.frozen_bytes > HOST_MEMORY_SHARE * host_memory_bytes()


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


def kept_activations(cfg: config_lib.Config, report: CompileReport) -> int:
    """The workload's lower bound of what its train step keeps for the backward pass per device
    (`kept_activation_bytes(cfg, rows)` of its declared cost, the decoder LMs: each layer's input), for the
    rows of one micro-batch of a replica; 0 where the workload states none."""
    declared = cfg.cost_model
    floor = declared.kept_activation_bytes if declared is not None else None
    if floor is None:
        return 0
    return int(floor(cfg, report.per_replica_batch // max(1, cfg.schedule.gradient_accumulation_steps)))


def floor_activations(report: CompileReport, kept: int) -> CompileReport:
    """The report with train activations that are not below zero. A plan extrapolated from small stand-in
    compiles can fall below zero (flux1 on 64 devices: -1.3 GiB at 32 rows a replica, where each block's
    input alone is 5.3 GiB); the estimate then takes `kept` (`kept_activations`, what the backward pass
    keeps at least), and says so. A positive estimate stays as XLA planned it (the figures of docs/figures.yaml
    are such estimates), even where it is under `kept`: the memory check adds `kept` to the state itself."""
    act = report.activation_bytes_per_device
    if act is None or act >= 0:
        return report
    gib = lambda n: f"{n / 2**30:.3f} GiB"  # noqa: E731
    note = (f"activations: XLA:CPU's plan{' extrapolated' if act < 0 else ''} gave {gib(act)} per device, under "
            f"the {gib(kept)} the backward pass keeps at least (the workload's cost model: each block's input); "
            f"the estimate takes that floor")
    peak = report.peak_bytes_per_device
    return dataclasses.replace(report, activation_bytes_per_device=kept,
                               peak_bytes_per_device=None if peak is None else peak + kept - act,
                               stand_in=report.stand_in + [note])


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
