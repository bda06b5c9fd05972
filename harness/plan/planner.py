"""`mlperf-harness plan`: the command. Loads the config, the system and the model cost, calibrates when
asked, projects one chip count (or sweeps them), prints the breakdown and, for a sweep, draws the PNG."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable

from harness.errors import HarnessError
from harness.plan import collectives, converge, cost as costs, layout as layouts
from harness.plan.calibrate import Measurement, measure
from harness.plan.project import (Calibration, FasterThanPeak, Projection, calibrate as calibrate_step,
                                  check_chips, project)
from harness.plan.system import System, load_system

MODEL_AXES = (2, 4, 8, 16)
PRECISIONS = ("bf16", "fp8")
# Said once, in every plan's header: what the harness itself computes in today
PRECISION_NOTE = ("--precision fp8 for the fp8 one; the harness itself computes in bfloat16, float16 or float32 "
                  "(runtime.precision), no fp8 yet: an fp8 plan projects a run it cannot make")
SMALL_PER_CHIP_BATCH = 16  # below this the step model is known to be optimistic (see format_projection)
# A calibration of a padded model above this share of peak is suspect: the highest of the families
# scripts/validate_plan.py calibrates is 0.81 (v1.0 Google TPU v4 BERT)
HIGH_EFFICIENCY = 0.85


@dataclasses.dataclass
class Plan:
    config_path: str
    cfg: Any
    system: System
    cost: costs.ModelCost
    module: costs.CostModel          # COST of benchmarks/<workload>/cost.py
    efficiency: float
    efficiency_note: str
    measurement: Measurement | None
    mesh_model_axis: int
    calibration: Calibration | None = None
    real_token_fraction: float | None = None
    cautions: list[str] = dataclasses.field(default_factory=list)
    precision: str = "bf16"
    useful_flops_per_sample: float | None = None  # the analytic count when the cost is a dry run's compiled one

    def converge_at(self, global_batch: int) -> converge.Convergence:
        conv = converge.to_converge(self.cfg.workload, self.cfg.ruleset, global_batch, self.module.converge_unit,
                                    self.module.convergence)
        return converge.at_evals(conv, self.module.eval_positions(self.cfg, conv.value, global_batch))

    def layout_at(self, chips: int, model_axis: int | None = None) -> layouts.Layout:
        return layouts.from_config(self.cfg, chips, self.mesh_model_axis if model_axis is None else model_axis)

    def memory_at(self, chips: int, global_batch: int, model_axis: int | None = None) -> layouts.Memory:
        """The layout's memory per chip; layouts.DoesNotFit (one line) when it exceeds the chip's."""
        check_chips(self.system, chips, self.mesh_model_axis if model_axis is None else model_axis)
        return layouts.check_fits(self.cfg, self.module, self.cost, self.system, self.layout_at(chips, model_axis),
                                  global_batch)

    def at(self, chips: int, global_batch: int, model_axis: int | None = None) -> Projection:
        """The projection at `chips`, after its layout's memory check (never a layout that does not fit)."""
        self.memory_at(chips, global_batch, model_axis)
        lay = self.layout_at(chips, model_axis)
        conv = self.converge_at(global_batch)
        init = self.measurement.init_seconds if self.measurement is not None else None
        return project(self.cost, self.system, conv, chips, global_batch, self.efficiency, lay.model_axis,
                       self.calibration, init, lay, layouts.alltoall_bytes(self.cfg, self.module, lay, global_batch),
                       layouts.expert_params(self.cfg) if lay.expert_axis > 1 else 0.0,
                       self.useful_flops_per_sample, self.precision)


def plural(unit: str) -> str:
    """'image' -> 'images', 'row of 8192 tokens' -> 'rows of 8192 tokens'."""
    head, sep, tail = unit.partition(" ")
    return f"{head}s{sep}{tail}"


def build(config_path: str, overrides: list[str], system_name: str, calibrate: list[str],
          calibrate_chips: int | None, model_cost: str | None,
          compile_model: Callable[[str, list[str]], Any] | None, real_token_fraction: float | None = None,
          precision: str = "bf16") -> Plan:
    """`compile_model`: the dry run's compile (`--compile`, handed in by the command line), else None."""
    from harness.config import load_config

    if not system_name:
        raise HarnessError("plan needs --system NAME (one of the files in harness/plan/systems/, or a YAML path)")
    system = load_system(system_name)
    # every step, calibration and MFU below divides by peak_flops: the chosen precision's
    system = dataclasses.replace(system, peak_flops=system.peak(precision))
    cfg = load_config(config_path, overrides)
    module = costs.workload_cost_model(cfg.workload)
    if model_cost:
        cost = costs.from_file(model_cost)
        if cost.workload != cfg.workload:
            raise HarnessError(f"--model_cost {model_cost} is for {cost.workload}, the config is {cfg.workload}")
        if not cost.train_samples:
            cost = dataclasses.replace(costs.analytic(cfg), **{k: v for k, v in cost.to_dict().items()
                                                               if k in ("train_flops_per_sample", "params",
                                                                        "eval_flops_per_sample", "gradient_bytes",
                                                                        "source")})
    elif compile_model:
        cost = costs.from_compile_report(config_path, overrides, cfg, compile_model)
    else:
        cost = costs.analytic(cfg)
    useful = None
    if real_token_fraction is not None:
        cost = real_tokens(cfg, module, cost, real_token_fraction, bool(model_cost or compile_model))
    if model_cost or compile_model:  # MFU counts the useful work: the analytic count, not XLA's
        useful = costs.with_real_tokens(cfg, module, real_token_fraction).train_flops_per_sample
    mesh_axis = cfg.runtime.mesh.get("model", 1) if cfg.runtime.kind == "mesh" else 1
    measurement, calibration, cautions = None, None, []
    if calibrate:
        measurement = measure(calibrate, module.converge_unit, cost.train_samples, system.chips_per_host,
                              system.cores_per_chip, calibrate_chips)
        if measurement.benchmark != cfg.workload:
            raise HarnessError(f"--calibrate: the logs are {measurement.benchmark}, the config is {cfg.workload}")
        try:
            calibration = calibrate_from(cost, system, measurement)
        except FasterThanPeak as e:
            raise HarnessError(faster_than_peak(e, cfg, module, system, measurement, real_token_fraction)) from None
        efficiency = calibration.efficiency
        note = (f"calibrated on {measurement.runs} log(s) at {measurement.chips} chips, global batch "
                f"{measurement.global_batch} (measured step {measurement.step_seconds * 1e3:.1f} ms, "
                f"platform {measurement.platform!r}); {calibration.describe()}")
        if efficiency > HIGH_EFFICIENCY and real_token_fraction is None and costs.skips_padding(module):
            cautions.append(high_efficiency(efficiency, cfg, module, system, measurement))
    else:
        efficiency = system.default_efficiency
        note = "the system's documented default, NOT calibrated (pass --calibrate LOGS for a measured one)"
    return Plan(config_path, cfg, system, cost, module, efficiency, note, measurement, mesh_axis, calibration,
                real_token_fraction, cautions, precision, useful)


def real_tokens(cfg: Any, module: costs.CostModel, cost: costs.ModelCost, fraction: float,
                measured: bool) -> costs.ModelCost:
    """`cost` at `fraction` real tokens a sample: the workload's count, or, for a cost from a file or the
    dry-run compile (which count every position), that cost scaled by the count's real/padded ratio."""
    real = costs.with_real_tokens(cfg, module, fraction)
    if not measured:
        return real
    full = costs.analytic(cfg)
    train, ev = real.train_flops_per_sample / full.train_flops_per_sample, \
        real.eval_flops_per_sample / max(1e-30, full.eval_flops_per_sample)
    return dataclasses.replace(cost, train_flops_per_sample=cost.train_flops_per_sample * train,
                               eval_flops_per_sample=cost.eval_flops_per_sample * ev,
                               mp_bytes_per_sample=cost.mp_bytes_per_sample * fraction,
                               source=f"{cost.source}; x {train:.4g} for {real.notes} (the analytic count's "
                                      "real/padded ratio)")


def calibrate_from(cost: costs.ModelCost, system: System, m: Measurement) -> Calibration:
    return calibrate_step(cost, system, m.chips, m.global_batch, m.step_seconds, m.eval_seconds, m.eval_mode,
                          m.evals, m.steps)


def suggested_fraction(cfg: Any, module: costs.CostModel) -> tuple[float, str] | None:
    """The workload's published real-token fraction for the config's sequence length, with its source."""
    if module.dataset_real_tokens is None:
        return None
    seq_length, fraction, source = module.dataset_real_tokens
    return (fraction, source) if seq_length == cfg.data.seq_length else None


def efficiency_at(fraction: float, cfg: Any, module: costs.CostModel, system: System, m: Measurement) -> float | None:
    try:
        return calibrate_from(costs.with_real_tokens(cfg, module, fraction), system, m).efficiency
    except FasterThanPeak:
        return None


def largest_fitting_fraction(cfg: Any, module: costs.CostModel, system: System, m: Measurement) -> float | None:
    """The largest real-token fraction at which the logs' step fits under 100% of peak (bisection)."""
    lo, hi = 1e-3, 1.0
    if efficiency_at(lo, cfg, module, system, m) is None:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if efficiency_at(mid, cfg, module, system, m) is not None else (lo, mid)
    return lo


def faster_than_peak(e: FasterThanPeak, cfg: Any, module: costs.CostModel, system: System, m: Measurement,
                     fraction: float | None) -> str:
    """The one-line refusal, naming skipped padding as the likely reason where the workload has padding."""
    if not costs.skips_padding(module):
        return str(e)
    tokens = cfg.data.seq_length
    head = (f"calibration: the measured step ({e.step_seconds * 1e3:.2f} ms) is shorter than the model's step at "
            f"100% of peak ({e.floor_seconds * 1e3:.2f} ms)")
    fits = largest_fitting_fraction(cfg, module, system, m)
    if fraction is not None:
        return (f"{head} even with {fraction:g} of the {tokens} tokens real (--real_token_fraction); "
                + (f"only a fraction up to {fits:.3f} fits these logs, else " if fits else "")
                + "the system figures or the model config do not fit these logs")
    suggestion = suggested_fraction(cfg, module)
    out = (f"{head} with every sequence padded to {tokens} tokens: these logs most likely come from an "
           f"implementation that skips the padding of variable-length sequences (NVIDIA's --unpad, packing), "
           f"which computes only the real tokens")
    if suggestion is not None:
        eff = efficiency_at(suggestion[0], cfg, module, system, m)
        out += (f"; pass --real_token_fraction {suggestion[0]:g} ({suggestion[1]})"
                + (f", which calibrates these logs to {eff:.2f} of peak" if eff is not None else ""))
    else:
        out += "; pass --real_token_fraction F, the mean share of real tokens in the data"
    return out + (f" (any fraction up to {fits:.3f} fits them)" if fits else "")


def high_efficiency(efficiency: float, cfg: Any, module: costs.CostModel, system: System, m: Measurement) -> str:
    suggestion = suggested_fraction(cfg, module)
    out = (f"caution: calibrated at {efficiency:.2f} of peak with every sequence padded to {cfg.data.seq_length} "
           f"tokens, above the {HIGH_EFFICIENCY:g} no validated calibration reaches; if these logs skip padding "
           f"(NVIDIA's --unpad, packing), pass --real_token_fraction")
    if suggestion is None:
        return out + " F (the mean share of real tokens)"
    eff = efficiency_at(suggestion[0], cfg, module, system, m)
    return out + f" {suggestion[0]:g} ({suggestion[1]})" + (f": {eff:.2f} of peak" if eff is not None else "")


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def format_projection(plan: Plan, p: Projection) -> list[str]:
    s, sysm, c = p.step, plan.system, p.converge
    useful = plan.useful_flops_per_sample or plan.cost.train_flops_per_sample
    unit = "samples" if c.unit == "samples" else "epochs"
    def fmt(v: float) -> str:
        return f"{v:,.0f}" if unit == "samples" else f"{v:.2f}"

    value = f"{fmt(c.value)}, stopping at the eval at {fmt(c.stop)}" if c.stop is not None else fmt(c.value)
    hosts = math.ceil(p.chips / sysm.chips_per_host)
    hidden = s.allreduce - s.allreduce_exposed
    lay, mem = plan.layout_at(p.chips, p.model_axis), plan.memory_at(p.chips, p.global_batch, p.model_axis)
    experts = layouts.expert_params(plan.cfg) if lay.expert_axis > 1 else 0
    dense = 1 - experts / plan.cost.params if plan.cost.params else 1.0
    gathered = ((plan.cost.fsdp_gather_bytes or plan.cost.gradient_bytes) * dense * lay.fsdp
                + (plan.cost.gradient_bytes * (1 - dense) if lay.expert_axis > 1 and not lay.alltoall else 0.0)
                ) / p.model_axis
    reduced = plan.cost.gradient_bytes * dense / p.model_axis
    lines = [
        f"{p.chips} chips ({hosts} host(s) x {min(p.chips, sysm.chips_per_host)}): {lay.describe()}",
        f"  memory per chip           {mem.describe()}",
        f"  per-chip batch            {p.global_batch / p.chips:g} (per replica {p.per_replica_batch:g}; global "
        f"batch {p.global_batch})",
        f"  steps per epoch           {p.steps_per_epoch:,.1f} ({plan.cost.train_samples:,} "
        f"{plural(plan.cost.sample_unit)})",
        f"  {unit + ' to converge':<26}{value}  [{c.source}]" + (f"  ** {c.note} **" if c.note else ""),
        f"  steps to converge         {p.steps:,}",
        f"  step time                 {_ms(s.total)} ms = compute {_ms(s.compute)} + gradient all-reduce "
        f"{_ms(s.allreduce_exposed)} + model-parallel collectives {_ms(s.model_parallel)} + other {_ms(s.other)} "
        f"+ fixed {_ms(s.fixed)}" + (f" + weight all-gathers {_ms(s.fsdp_gather)}" if s.fsdp_gather_total else "")
        + (f" + all-to-all {_ms(s.alltoall)}" if lay.expert_axis > 1 and lay.alltoall else "")
        + (f" + recompute {_ms(s.recompute)}" if s.recompute else ""),
        *([f"    {'all-gather (weights)':<24}{_ms(s.fsdp_gather_total)} ms: the weights "
           f"({gathered / 1e6:.1f} MB per chip{', experts aside' if lay.expert_axis > 1 and lay.alltoall else ''}) "
           "gathered "
           f"{plan.cost.fsdp_gathers_per_step}x a micro-batch (forward, backward) x {lay.micro_batches}, "
           f"{_ms(s.fsdp_gather_total - s.fsdp_gather)} ms hidden under compute"
           + ("; the experts' weights gathered over their axis where used" if not lay.alltoall and lay.expert_axis > 1
              else "")] if s.fsdp_gather_total else []),
        *([f"    {'all-to-all (experts)':<24}{_ms(s.alltoall)} ms: {s.alltoall_bytes / 1e6:,.1f} MB per chip a step "
           f"over the {lay.expert_axis}-chip expert axis (dispatch and combine, forward and backward"
           f"{', and the recomputed forward' if lay.remat else ''}), exposed"] if lay.expert_axis > 1 and lay.alltoall
          else []),
        *([f"    {'recompute (remat)':<24}{_ms(s.recompute)} ms: the forward pass again in the backward pass "
           "(not in the model FLOPs)"] if s.recompute else []),
        f"    {'reduce-scatter (FSDP)' if lay.fsdp else 'all-reduce':<24}"
        f"{_ms(s.allreduce)} ms of {reduced / 1e6:.1f} MB "
        f"per chip on {collectives.describe(sysm, p.replicas)}; {_ms(hidden)} ms hidden under the backward pass "
        f"(overlap {sysm.allreduce_overlap:g} of it)",
        f"    other                   optimizer update: {plan.cost.params / p.model_axis / 1e6:.1f} M params x "
        f"{plan.cost.optimizer_bytes_per_param:g} B over {sysm.hbm_bandwidth / 1e9:g} GB/s HBM",
        f"    fixed                   {sysm.name} step_overhead_seconds (launches, kernels too small to fill a "
        f"chip, the host loop)",
        f"  eval                      {p.evals} {p.eval.mode} eval(s) x {p.eval.one:.3f} s = device "
        f"{p.eval.device:.3f} s "
        f"(forward pass split over the {p.chips} chips) + host scoring {p.eval.host:.3f} s (one host, per eval "
        f"sample) + fixed {p.eval.fixed:.3f} s (per eval) [{p.eval.source}]"
        + ("; asynchronous: only the last eval's host and fixed parts are on the clock" if p.eval.mode == "async"
           else ""),
        "  init (not in the score)   " + (f"{p.init_seconds:.0f} s (calibration logs)" if p.init_seconds is not None
                                          else "not known (no calibration logs)"),
        f"  time to train             {p.total_seconds / 60:.2f} min = train {p.train_seconds / 60:.2f} + eval "
        f"{p.eval_total_seconds / 60:.2f} (eval {100 * p.eval_total_seconds / p.total_seconds:.1f}% of it)",
        f"  model FLOP/s              {p.model_flops_per_s / 1e12:,.1f} TFLOP/s over the training steps, useful "
        f"FLOPs only ({useful / 1e9:,.1f} GFLOP per {plan.cost.sample_unit} x {p.global_batch / s.total:,.1f} "
        f"samples/s); MFU {100 * p.mfu:.1f}% of {p.chips} x {sysm.peak_flops / 1e12:g} TFLOP/s ({p.precision} peak)",
        *([f"  compiled FLOP/s           {p.compiled_flops_per_s / 1e12:,.1f} TFLOP/s: the step as the cost counts it "
           f"({plan.cost.source}; {plan.cost.train_flops_per_sample / useful:.3g}x the useful FLOPs), not MFU"]
          if p.compiled_flops_per_s else []),
    ]
    upper = mem.activations_upper
    if upper is not None and mem.total - (mem.activations or 0.0) + upper > layouts.HEADROOM * mem.capacity:
        lines.append(f"  caution: the workload's count of the whole train step's activations ({upper / 1e9:.1f} GB per "
                     "chip: the harness's attention keeps its scores) does not fit beside the rest; only what the "
                     "backward pass cannot do without does, as the dry run checks")
    if p.global_batch / p.chips < SMALL_PER_CHIP_BATCH and not sysm.step_overhead_seconds:
        lines.append(f"  caution: {p.global_batch / p.chips:g} samples per chip and {sysm.name} states no "
                     "step_overhead_seconds: fixed per-step costs are left out, so this is optimistic")
    return lines


def header(plan: Plan) -> list[str]:
    c = plan.cost
    return [f"plan: {plan.cfg.workload} ({plan.config_path}) on {plan.system.name} "
            f"({plan.system.peak_flops / 1e12:g} TFLOP/s dense {plan.precision} peak per chip, {plan.system.topology}, "
            f"{plan.system.domain if plan.system.domain < 1 << 30 else 'any number of'} chips a scale-up domain)",
            f"  precision: the {plan.precision} peak ({PRECISION_NOTE})",
            f"  model cost: {c.train_flops_per_sample / 1e9:,.1f} GFLOP per training {c.sample_unit}, "
            f"{c.params / 1e6:.2f} M params, {c.gradient_bytes / 1e6:.1f} MB of gradients; {c.source}",
            f"  efficiency: {plan.efficiency:.3f} of peak: {plan.efficiency_note}",
            *[f"  {c}" for c in plan.cautions]]


def default_batch(plan: Plan, chips: int) -> tuple[int, str]:
    """A global batch for `chips` when the config's cannot fill them: the calibration logs' per-chip batch
    (else one sample per replica) held up to the convergence table's largest batch, as --sweep does;
    HarnessError when even one sample per replica is above that batch (--sweep leaves such points out)."""
    replicas = chips // plan.mesh_model_axis
    per_chip = plan.measurement.global_batch / plan.measurement.chips if plan.measurement else 1.0
    points = _table_points(plan)
    cap = max(b for b, _ in points) if points else replicas * per_chip
    if replicas > cap:
        # No batch both fills the replicas and stays in the table; projecting at `replicas` would break the cap.
        raise HarnessError(f"--chips {chips}: {replicas} data-parallel replicas need a global batch of at least "
                           f"{replicas}, above the convergence table's largest batch {cap:g} (the config's is "
                           f"{plan.cfg.schedule.global_batch_size}); use at most "
                           f"{int(cap) * plan.mesh_model_axis} chips, or --global_batch N (N >= {replicas}) to "
                           f"project beyond the table")
    batch = int(max(replicas, min(cap, round(per_chip * chips))))
    held = f"the calibration logs' {per_chip:g} per chip" if plan.measurement else "one sample per replica"
    return batch, f"{held}, capped at the convergence table's largest batch {cap:g}"


def sweep_points(plan: Plan, chips: int, global_batch: int) -> list[tuple[int, int]]:
    """(chips, global batch) over powers of two: the per-chip batch of the given point held inside the
    convergence table's batches (the RCP table's, the rule the single projection follows): below its smallest
    batch that batch, above its largest that batch held (more chips only split it further)."""
    per_chip = global_batch / chips
    table = [b for b, _ in _table_points(plan)]
    cap = max(table) if table else global_batch
    floor = min(table) if table else 1
    out, n = [], 1
    top = max(4096, chips)
    while n <= top:
        per_host = plan.system.chips_per_host
        if plan.system.topology != "hierarchical" or n <= per_host or n % per_host == 0:
            b = int(min(cap, max(floor, round(per_chip * n))))
            out.append((n, b))
        n *= 2
    if chips not in [p[0] for p in out]:
        out.append((chips, global_batch))
    return sorted(out)


def _table_points(plan: Plan) -> list[tuple[float, float]]:
    if converge.has_rcps(plan.cfg.workload, plan.cfg.ruleset):
        return converge.rcp_points(plan.cfg.workload, plan.cfg.ruleset)
    table = plan.module.convergence
    return [tuple(p) for p in table["points"]] if table else []


def knee(projections: list[Projection]) -> Projection | None:
    """Where data parallelism stops paying: the first point whose doubling buys < 10% or whose scaling
    efficiency against the smallest point falls under 50%."""
    base = projections[0]
    for a, b in zip(projections, projections[1:]):
        eff = base.total_seconds * base.chips / (b.total_seconds * b.chips)
        if b.total_seconds > 0.9 * a.total_seconds or eff < 0.5:
            return a
    return None


def run_sweep(plan: Plan, chips: int, global_batch: int, out_dir: str) -> tuple[list[str], dict]:
    points = sweep_points(plan, chips, global_batch)
    dp, unfit = [], {}
    for n, b in points:
        try:
            dp.append(plan.at(n, b, 1))
        except layouts.DoesNotFit as e:
            unfit[n] = (b, f"{e.memory.total / 1e9:.1f} GB per chip, above the "
                           f"{layouts.HEADROOM * e.memory.capacity / 1e9:.1f} GB usable")
        except HarnessError:  # fewer samples than replicas: data parallelism alone cannot use these chips
            pass
    if not dp:
        raise HarnessError("--sweep: no chip count of the sweep fits the global batch data-parallel"
                           + (f" and the chip's memory ({next(iter(unfit.values()))[1]} at the smallest)"
                              if unfit else ""))
    axis = plan.mesh_model_axis
    if axis == 1 and plan.cost.mp_bytes_per_sample <= 0:
        pass  # the workload's model-parallel traffic is not modelled (spatial halos): suggest nothing
    elif axis == 1:  # suggest one: the model axis with the shortest time at the largest point
        best = None
        for m in MODEL_AXES:
            n, b = points[-1]
            if n % m == 0 and b >= n // m:
                try:
                    t = plan.at(n, b, m).total_seconds
                except layouts.DoesNotFit:
                    continue
                if best is None or t < best[0]:
                    best = (t, m)
        axis = best[1] if best else 1
    mp = []
    for n, b in points:
        if n % axis == 0 and n >= axis and axis > 1 and b >= n // axis:
            try:
                mp.append(plan.at(n, b, axis))
            except HarnessError:
                pass
    k = knee(dp)
    base = dp[0]
    lines = [f"sweep over chips (per-chip batch {global_batch / chips:g} held up to the convergence table's "
             f"largest batch, then the global batch held):",
             f"  {'chips':>6} {'global':>7} {'per-chip':>8} {'conv':>10} {'steps':>8} {'step ms':>8} "
             f"{'comp':>7} {'a-r':>7} {'other':>6} {'TTT min':>8} {'scal.eff':>8} "
             f"{'model-axis ' + str(axis) + ' min':>16}"]
    mp_by = {p.chips: p for p in mp}
    for p in dp:
        eff = base.total_seconds * base.chips / (p.total_seconds * p.chips)
        conv = f"{p.converge.value:,.0f}" if p.converge.unit == "samples" else f"{p.converge.value:.1f}"
        conv += "" if p.converge.in_range else "*"
        alt = f"{mp_by[p.chips].total_seconds / 60:.2f}" if p.chips in mp_by else "-"
        mark = "  <- data parallelism stops paying" if k is not None and p.chips == k.chips else ""
        lines.append(f"  {p.chips:>6} {p.global_batch:>7} {p.global_batch / p.chips:>8.3g} {conv:>10} {p.steps:>8,} "
                     f"{p.step.total * 1e3:>8.2f} {p.step.compute * 1e3:>7.2f} {p.step.allreduce_exposed * 1e3:>7.2f} "
                     f"{p.step.other * 1e3:>6.2f} {p.total_seconds / 60:>8.2f} {eff:>8.2f} {alt:>16}{mark}")
    dp_chips = {p.chips for p in dp}
    for n, (b, why) in sorted(unfit.items()):
        at = 2 + sum(1 for p in dp if p.chips < n) + sum(1 for m in unfit if m < n)
        lines.insert(at, f"  {n:>6} {b:>7}  does not fit: {why}")
    for p in mp:
        if p.chips not in dp_chips:
            lines.append(f"  {p.chips:>6} {p.global_batch:>7}  fewer samples than chips: only the model-parallel "
                         f"layout runs here, {p.total_seconds / 60:.2f} min")
    lines.append("  (* outside the convergence table's batch range)")
    source = "the config's mesh" if plan.mesh_model_axis > 1 else "suggested"
    if axis == 1:
        lines.append(f"  no model axis suggested: {plan.cfg.workload}'s model-parallel traffic is not modelled "
                     f"({plan.cost.notes or 'no activation bytes per sample'})")
    if k is not None:
        at = [p for p in mp if p.chips > k.chips]
        if at:
            best = min(at, key=lambda p: p.total_seconds)
            lines.append(f"  data parallelism stops paying at {k.chips} chips ({k.total_seconds / 60:.2f} min); a "
                         f"model axis of {axis} ({source}) gives {best.total_seconds / 60:.2f} min at {best.chips} "
                         "chips")
        else:
            lines.append(f"  data parallelism stops paying at {k.chips} chips ({k.total_seconds / 60:.2f} min)")
    else:
        lines.append("  data parallelism keeps paying over the whole sweep")
    png = os.path.join(out_dir, f"plan-{plan.cfg.workload}-{plan.system.name}.png")
    draw(plan, dp, mp, axis, source, k, png)
    lines.append(f"  plot: {png}")
    return lines, {"sweep": [p.to_dict() for p in dp], "model_parallel": [p.to_dict() for p in mp],
                   "model_axis": axis, "knee_chips": k.chips if k else None, "png": png}


def draw(plan: Plan, dp: list[Projection], mp: list[Projection], axis: int, source: str,
         k: Projection | None, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    xs = [p.chips for p in dp]
    a.plot(xs, [p.total_seconds / 60 for p in dp], "o-", label="data parallel")
    if mp:
        a.plot([p.chips for p in mp], [p.total_seconds / 60 for p in mp], "s--", label=f"model axis {axis} ({source})")
    base = dp[0]

    def efficiency(p: Projection) -> float:
        return base.total_seconds * base.chips / (p.total_seconds * p.chips)

    b.plot(xs, [efficiency(p) for p in dp], "o-", label="data parallel")
    if mp:
        b.plot([p.chips for p in mp], [efficiency(p) for p in mp], "s--", label=f"model axis {axis}")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"chips ({plan.system.name})")
        ax.grid(True, which="both", alpha=0.3)
        if k is not None:
            ax.axvline(k.chips, color="red", alpha=0.5, ls=":")
    if not mp:
        a.text(0.02, 0.02, f"no model-parallel layout modelled for {plan.cfg.workload}", transform=a.transAxes,
               fontsize=8, color="gray")
    if k is not None:
        a.annotate("data parallelism\nstops paying", (k.chips, k.total_seconds / 60), color="red",
                   xytext=(10, 20), textcoords="offset points")
    a.set_yscale("log")
    a.set_ylabel("projected time to train (min)")
    b.set_ylabel(f"scaling efficiency vs {base.chips} chip(s)")
    b.set_ylim(0, 1.1)
    a.legend(loc="upper right")
    b.legend(loc="upper right")
    fig.suptitle(f"{plan.cfg.workload} on {plan.system.name}: efficiency {plan.efficiency:.2f} of peak "
                 f"({'calibrated' if plan.measurement else 'default, not calibrated'})")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(config_path: str, overrides: list[str], system_name: str, chips: int | None, global_batch: int | None,
         calibrate: list[str], calibrate_chips: int | None, sweep: bool, as_json: bool, model_cost: str | None,
         compile_model: Callable[[str, list[str]], Any] | None, out_dir: str | None,
         real_token_fraction: float | None = None, precision: str = "bf16") -> int:
    if chips is None:
        raise HarnessError("plan needs --chips N")
    if global_batch is not None and global_batch < 1:
        raise HarnessError(f"--global_batch {global_batch}: give a positive global batch (leave it out for the "
                           f"config's)")
    if not system_name:
        raise HarnessError("plan needs --system NAME (one of the files in harness/plan/systems/, or a YAML path)")
    if precision not in PRECISIONS:
        raise HarnessError(f"--precision {precision}: give one of {', '.join(PRECISIONS)}")
    system = load_system(system_name)
    check_chips(system, chips)  # before the config (and TensorFlow) loads
    system.peak(precision)
    plan = build(config_path, overrides, system_name, calibrate, calibrate_chips, model_cost, compile_model,
                 real_token_fraction, precision)
    check_chips(plan.system, chips, plan.mesh_model_axis)
    batch = plan.cfg.schedule.global_batch_size if global_batch is None else global_batch
    batch_note = []
    if global_batch is None and batch < chips // plan.mesh_model_axis:
        batch, why = default_batch(plan, chips)
        batch_note = [f"  global batch {batch}: the config's {plan.cfg.schedule.global_batch_size} is smaller than the "
                      f"{chips // plan.mesh_model_axis} replicas; {why} (--global_batch N to choose)"]
    p = plan.at(chips, batch)
    lines = header(plan) + batch_note + format_projection(plan, p)
    out: dict[str, Any] = {"config": config_path, "system": plan.system.name, "model_cost": plan.cost.to_dict(),
                           "precision": plan.precision, "layout": dataclasses.asdict(plan.layout_at(chips)),
                           "memory_per_chip": dataclasses.asdict(plan.memory_at(chips, batch)),
                           "efficiency": plan.efficiency, "efficiency_source": plan.efficiency_note,
                           "real_token_fraction": plan.real_token_fraction, "cautions": plan.cautions,
                           "calibration": dataclasses.asdict(plan.calibration) if plan.calibration else None,
                           "projection": p.to_dict()}
    if sweep:
        more, data = run_sweep(plan, chips, batch, out_dir or ".")
        lines += more
        out.update(data)
    lines.append(f"projected time to train: {p.total_seconds / 60:.2f} min on {chips} x {plan.system.name} "
                 f"(global batch {batch})")
    if as_json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print("\n".join(lines))
    return 0
