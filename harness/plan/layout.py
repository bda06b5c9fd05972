"""The layout a plan projects (how the harness spreads one step over the chips) and what it holds per chip.

A layout, read from the config the way the mesh runtime reads it (docs/accelerators.md):
- data parallel: `replicas` = chips / model axis, each with its share of the global batch;
- FSDP (`runtime.fsdp`): the trained weights, their gradients and optimizer state split over the data axis;
  the weights gathered layer by layer for the forward and again for the backward pass, in every micro-batch;
- model axis (`runtime.mesh` model): heads, feed-forward and vocabulary split over it;
- experts over an axis (`runtime.layout` experts -> an axis): each chip owns experts / axis of every MoE
  layer. With `model.moe_dispatch: alltoall` tokens travel to their experts and back by an all-to-all (twice
  forward, twice backward; again in the recomputed forward with remat) and the expert weights are never
  gathered; with another dispatch the expert weights are gathered where used, as FSDP gathers (the
  all-to-all's place taken by weight traffic);
- frozen weights (a LoRA fine-tune's base, the cost's `frozen_bytes`): held (split like the weights) but
  never given gradients or optimizer state, never reduced;
- micro-batches (`schedule.gradient_accumulation_steps`): activations of one micro-batch at a time;
- remat (`model.remat`): each layer's forward recomputed in the backward pass (compute + one forward).

Memory per chip (bytes), checked against the chip's HBM less HEADROOM: the trained weights, their gradients
(both at the cost's gradient width, the float32 variables) and the optimizer state (its slots, derived from the
cost's update traffic: AdamW reads weight, gradient and 2 slots and writes weight and 2 slots, 28 B), frozen
weights, the FSDP working set (the gathered weights of the layer in use and the next one, prefetched), and the
activations of one micro-batch (split over the model axis) counted as the dry run counts them
(harness/dryrun/memory.py): what the backward pass cannot do without (`kept_activation_bytes`: each layer's
input) decides whether a layout fits, the workload's count of the whole train step (`train_activation_bytes`:
the harness's attention keeps its scores) is printed beside it as an upper estimate. A layout that does not
fit is refused in one line naming the smallest change that fits.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from harness.errors import HarnessError
from harness.plan.cost import ModelCost
from harness.plan.system import System

# Share of a chip's HBM a layout may fill: the rest is the runtime's (workspace, fragmentation, the compiled
# program). Assumption, stated with every memory line.
HEADROOM = 0.90
ACTIVATION_BYTES = 2.0  # bf16 activations in the all-to-all
MAX_CHIPS = 65536


@dataclasses.dataclass(frozen=True)
class Layout:
    chips: int
    model_axis: int
    fsdp: bool
    expert_axis: int = 1        # chips the experts are split over (1: every chip holds every expert)
    micro_batches: int = 1
    remat: bool = False
    alltoall: bool = True       # split experts: tokens move by all-to-all (else the expert weights are gathered)

    @property
    def replicas(self) -> int:
        return self.chips // self.model_axis

    def describe(self) -> str:
        parts = [f"{self.replicas} data-parallel", f"model axis {self.model_axis}"]
        if self.fsdp:
            parts.append("FSDP over the data axis")
        if self.expert_axis > 1:
            parts.append(f"experts split over {self.expert_axis} chips "
                         f"({'all-to-all' if self.alltoall else 'weights gathered where used'})")
        if self.micro_batches > 1:
            parts.append(f"{self.micro_batches} micro-batches")
        if self.remat:
            parts.append("remat")
        return ", ".join(parts)


@dataclasses.dataclass
class Memory:
    weights: float
    gradients: float
    optimizer: float
    frozen: float
    gathered: float
    activations: float | None   # kept for the backward pass (a lower bound); None: not stated
    capacity: float
    activations_upper: float | None = None  # the whole train step's, as the workload counts it

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.frozen + self.gathered
                + (self.activations or 0.0))

    @property
    def fits(self) -> bool:
        return self.total <= HEADROOM * self.capacity

    def describe(self) -> str:
        act = "not stated by the workload" if self.activations is None else f"{self.activations / 1e9:.1f}"
        return (f"{self.total / 1e9:.1f} GB of the chip's {self.capacity / 1e9:.1f} GB ({HEADROOM:.0%} usable): "
                f"weights {self.weights / 1e9:.1f} + gradients {self.gradients / 1e9:.1f} + optimizer state "
                f"{self.optimizer / 1e9:.1f}" + (f" + frozen weights {self.frozen / 1e9:.1f}" if self.frozen else "")
                + (f" + gathered weights {self.gathered / 1e9:.1f}" if self.gathered else "")
                + f" + activations {act}" + ("" if self.activations_upper is None else
                                             f" (up to {self.activations_upper / 1e9:.1f} counting the whole step)"))


def _model(cfg: Any) -> Any:
    return getattr(cfg, "model", None)


def has_experts(cfg: Any) -> bool:
    return getattr(_model(cfg), "num_experts", 0) > 1 and getattr(_model(cfg), "expert_hidden", 0) > 0


def moe_layers(cfg: Any) -> int:
    m = _model(cfg)
    return m.num_layers - getattr(m, "first_dense_layers", 0) + getattr(m, "mtp_layers", 0)


def expert_params(cfg: Any) -> int:
    """The routed experts' parameters (a SwiGLU of expert_hidden units each, in every MoE layer)."""
    if not has_experts(cfg):
        return 0
    m = _model(cfg)
    return moe_layers(cfg) * m.num_experts * 3 * m.hidden_size * m.expert_hidden


def from_config(cfg: Any, chips: int, model_axis: int, fsdp: bool | None = None,
                experts_split: bool | None = None, micro_batches: int | None = None,
                remat: bool | None = None) -> Layout:
    """The config's layout at `chips` (its data axis scaled to fill them); each keyword overrides one choice."""
    rt = cfg.runtime
    mesh = rt.kind == "mesh"
    fsdp = bool(mesh and rt.fsdp) if fsdp is None else fsdp
    alltoall = getattr(_model(cfg), "moe_dispatch", "") == "alltoall"
    if experts_split is None:
        axis = rt.layout.get("experts") if mesh else None
        experts_split = bool(axis)
    else:
        axis = (rt.layout.get("experts") if mesh else None) or "data"
        alltoall = alltoall or not (mesh and rt.layout.get("experts"))
    expert_axis = 1
    if experts_split and has_experts(cfg):
        size = model_axis if axis == "model" else chips // model_axis
        expert_axis = math.gcd(_model(cfg).num_experts, size)
    micro = max(1, cfg.schedule.gradient_accumulation_steps) if micro_batches is None else micro_batches
    remat = bool(getattr(_model(cfg), "remat", False)) if remat is None else remat
    return Layout(chips, model_axis, fsdp, expert_axis, micro, remat, alltoall)


def optimizer_slots(cost: ModelCost) -> float:
    """Optimizer state arrays per parameter from the update's traffic: read weight, gradient and s slots,
    write weight and s slots, each at 4 bytes (AdamW 28 B: 2 slots; momentum 20 B: 1)."""
    return max(0.0, (cost.optimizer_bytes_per_param / 4.0 - 3.0) / 2.0)


def memory(cfg: Any, module: Any, cost: ModelCost, system: System, layout: Layout, global_batch: float) -> Memory:
    """Bytes per chip of `layout` (the rule in the module docstring)."""
    width = cost.gradient_bytes / cost.params if cost.params else 4.0
    experts = expert_params(cfg) if layout.expert_axis > 1 else 0
    dense = max(0, cost.params - experts)
    data_shards = layout.replicas if layout.fsdp else 1
    dense_share = dense / (layout.model_axis * data_shards)
    expert_share = experts / (layout.expert_axis * layout.model_axis
                              * (max(1, layout.replicas // layout.expert_axis) if layout.fsdp else 1))
    if experts and _expert_axis_is_model(cfg):
        expert_share = experts / (layout.expert_axis * (max(1, layout.replicas) if layout.fsdp else 1))
    trained = dense_share + expert_share
    frozen = cost.frozen_bytes / (layout.model_axis * data_shards)
    gathered = 0.0
    if layout.fsdp and layout.replicas > 1:
        layers = max(1, getattr(_model(cfg), "num_layers", 1))
        whole = (cost.fsdp_gather_bytes or width * cost.params) * (dense / cost.params if cost.params else 1.0)
        gathered = whole / layout.model_axis * min(1.0, 2.0 / layers)
    if experts and not layout.alltoall:  # one MoE layer's experts gathered where used, and the next one's
        gathered += experts * width / layout.model_axis * min(1.0, 2.0 / max(1, moe_layers(cfg)))
    rows = max(1, math.ceil(global_batch / layout.replicas / layout.micro_batches))
    kept, whole = module.kept_activation_bytes, module.train_activation_bytes
    lay_cfg = _with_remat(cfg, layout.remat)
    return Memory(trained * width, trained * width, trained * 4.0 * optimizer_slots(cost), frozen, gathered,
                  None if kept is None else kept(lay_cfg, rows) / layout.model_axis, system.hbm_bytes,
                  None if whole is None else whole(lay_cfg, rows) / layout.model_axis)


def _expert_axis_is_model(cfg: Any) -> bool:
    return cfg.runtime.kind == "mesh" and cfg.runtime.layout.get("experts") == "model"


def _with_remat(cfg: Any, remat: bool) -> Any:
    """`cfg` with model.remat set to `remat` (the activation count reads it)."""
    m = _model(cfg)
    if m is None or getattr(m, "remat", remat) == remat:
        return cfg
    model = dataclasses.replace(m, remat=remat)
    return _Overlay(cfg, model)


class _Overlay:
    """A config with one section swapped (configs are frozen dataclasses with their sections in a dict)."""

    def __init__(self, cfg: Any, model: Any):
        self._cfg, self.model = cfg, model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


def alltoall_bytes(cfg: Any, module: Any, layout: Layout, global_batch: float) -> float:
    """Bytes one chip sends in a step's all-to-alls: per MoE layer and token it owns, its routed slots
    (the declared cost's `routed_slots`, else the k experts it picks) x hidden in bf16, dispatched and
    combined, forward and backward (and the recomputed forward with remat)."""
    if layout.expert_axis <= 1 or not layout.alltoall:
        return 0.0
    m = _model(cfg)
    slots = module.routed_slots(cfg) if module.routed_slots is not None else float(m.experts_per_token)
    tokens = global_batch / layout.replicas * cfg.data.seq_length / layout.model_axis
    passes = 6 if layout.remat else 4
    return passes * moe_layers(cfg) * tokens * slots * m.hidden_size * ACTIVATION_BYTES


class DoesNotFit(HarnessError):
    """A layout whose memory per chip exceeds the chip's: never projected."""

    def __init__(self, message: str, memory: "Memory"):
        super().__init__(message)
        self.memory = memory


def check_fits(cfg: Any, module: Any, cost: ModelCost, system: System, layout: Layout, global_batch: int) -> Memory:
    """The layout's memory; HarnessError (one line) naming the smallest change that fits when it does not."""
    mem = memory(cfg, module, cost, system, layout, global_batch)
    if mem.fits:
        return mem
    fix = smallest_fit(cfg, module, cost, system, layout, global_batch)
    raise DoesNotFit(f"{cfg.workload} does not fit {layout.chips} x {system.name} as laid out "
                       f"({layout.describe()}): {mem.describe()}; not projected. " + fix, mem)


def smallest_fit(cfg: Any, module: Any, cost: ModelCost, system: System, layout: Layout, global_batch: int) -> str:
    """The first change that fits, smallest first: at the same chips, more micro-batches, remat, FSDP,
    experts split over the data axis (and FSDP with it); else the fewest chips (powers of two, the batch
    still filling the replicas), with the config's layout or with FSDP and experts split."""
    def fits(lay: Layout) -> Memory | None:
        mem = memory(cfg, module, cost, system, lay, global_batch)
        return mem if mem.fits else None

    per_replica = max(1, int(global_batch // layout.replicas))
    micros = [layout.micro_batches]
    while micros[-1] * 2 <= per_replica:
        micros.append(micros[-1] * 2)
    split = from_config(cfg, layout.chips, layout.model_axis, experts_split=True).expert_axis
    tries: list[tuple[int, int, str, Layout]] = []  # (changes, micro-batches, what, layout)
    for micro in micros:
        for remat in sorted({layout.remat, hasattr(_model(cfg), "remat")}):
            for fsdp in sorted({layout.fsdp, cfg.runtime.kind == "mesh"}):
                for experts in sorted({layout.expert_axis, split if has_experts(cfg) else 1}):
                    lay = dataclasses.replace(layout, micro_batches=micro, remat=remat, fsdp=fsdp, expert_axis=experts,
                                              alltoall=layout.alltoall or experts != layout.expert_axis)
                    what = [f"--set schedule.gradient_accumulation_steps={micro}"] if micro != layout.micro_batches \
                        else []
                    what += ["--set model.remat=true"] if remat != layout.remat else []
                    what += ["--set runtime.fsdp=true"] if fsdp != layout.fsdp else []
                    what += ["experts split over the data axis (runtime.layout experts: data, model.moe_dispatch: "
                             "alltoall)"] if experts != layout.expert_axis else []
                    if what:
                        tries.append((len(what), micro, " and ".join(what), lay))
    for _, _, what, lay in sorted(tries, key=lambda t: (t[0], t[1])):
        mem = fits(lay)
        if mem is not None:
            return f"The smallest change that fits: {what} ({mem.total / 1e9:.1f} GB per chip)."
    for best in (False, True):
        chips = layout.chips * 2
        while chips <= MAX_CHIPS and chips // layout.model_axis <= global_batch:
            lay = from_config(cfg, chips, layout.model_axis, micro_batches=layout.micro_batches,
                              remat=layout.remat, **({"fsdp": True, "experts_split": has_experts(cfg)} if best
                                                     else {"fsdp": layout.fsdp,
                                                           "experts_split": layout.expert_axis > 1}))
            mem = fits(lay)
            if mem is not None:
                how = "" if lay == dataclasses.replace(layout, chips=chips, expert_axis=lay.expert_axis) \
                    else f" with {lay.describe()}"
                return f"The smallest change that fits: --chips {chips}{how} ({mem.total / 1e9:.1f} GB per chip)."
            chips *= 2
    return (f"No layout of up to {min(MAX_CHIPS, global_batch * layout.model_axis)} chips fits at global batch "
            f"{global_batch}: a larger model axis, or a chip with more memory.")
