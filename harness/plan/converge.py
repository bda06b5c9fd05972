"""Epochs (samples for BERT) to converge at a global batch: the checker's RCP tables where they exist,
otherwise the workload's documented table (`COST.convergence` in benchmarks/<name>/cost.py). For runs whose
target no RCP table measures (MLPerf v0.7 BERT: 0.712, the RCPs' 0.720) `by_schedule` scales what the
calibration runs needed by the learning-rate schedule each run sets itself (see there).

Between two table batches the value is interpolated linearly in the batch, as the RCP checker
interpolates RCPs. Below the smallest batch the smallest batch's value applies; above the largest the
last two points are extrapolated linearly. Both are flagged: the table says nothing there.
"""
from __future__ import annotations

import dataclasses

from harness import benchmark_rules as rules
from harness.errors import HarnessError


@dataclasses.dataclass
class Convergence:
    value: float        # epochs, or samples
    unit: str           # "epochs" | "samples"
    source: str
    in_range: bool
    note: str = ""
    stop: float | None = None  # the eval position the run stops at: the first at or past `value`
    evals: int = 0             # evals up to and including it


def at_evals(conv: Convergence, positions: list[float]) -> Convergence:
    """`conv` stopped at the eval cadence: a run can only notice convergence at an eval."""
    return dataclasses.replace(conv, stop=positions[-1] if positions else conv.value, evals=len(positions))


def interpolate(points: list[tuple[float, float]], batch: float) -> tuple[float, bool, str]:
    """(value, inside the table's batch range, how it was found) from (batch, value) points."""
    pts = sorted(points)
    if not pts:
        raise HarnessError("empty convergence table")
    if len(pts) == 1:
        return pts[0][1], batch == pts[0][0], f"only batch {pts[0][0]:g}"
    if batch < pts[0][0]:
        return pts[0][1], False, f"below the table (smallest batch {pts[0][0]:g}): its value held"
    for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
        if b0 <= batch <= b1:
            if batch == b0:
                return v0, True, f"at batch {b0:g}"
            if batch == b1:
                return v1, True, f"at batch {b1:g}"
            return v0 + (v1 - v0) * (batch - b0) / (b1 - b0), True, f"interpolated between {b0:g} and {b1:g}"
    (b0, v0), (b1, v1) = pts[-2], pts[-1]
    return (v1 + (v1 - v0) * (batch - b1) / (b1 - b0), False,
            f"above the table (largest batch {b1:g}): extrapolated from {b0:g} and {b1:g}")


def rcp_points(benchmark: str, ruleset: str) -> list[tuple[float, float]]:
    """(batch, mean epochs or samples to converge) of every RCP entry; the mean of the reference runs."""
    from harness.review import rcp

    by_batch: dict[float, list[float]] = {}
    for entry in rcp.load_rcps(benchmark, ruleset).values():
        runs = entry.get("Epochs to converge") or entry.get("samples to converge") or []  # llama2_70b_lora: samples
        if runs:
            by_batch.setdefault(float(entry["BS"]), []).append(sum(runs) / len(runs))
    return [(b, sum(v) / len(v)) for b, v in by_batch.items()]


def has_rcps(benchmark: str, ruleset: str) -> bool:
    """Whether the benchmark's record lists RCPs for `ruleset` (a workload's name is its MLPerf key)."""
    return rules.has_rcp(benchmark, ruleset)


def to_converge(workload: str, ruleset: str, global_batch: float, unit: str, table: dict | None) -> Convergence:
    """Epochs or samples to converge at `global_batch` (in the workload's own batch unit)."""
    if has_rcps(workload, ruleset):
        points = rcp_points(workload, ruleset)
        value, inside, how = interpolate(points, global_batch)
        source = f"RCP table {workload} {ruleset} (mlperf-logging), {how}"
        largest = max(b for b, _ in points)
        if global_batch > largest:  # the RCP checker has nothing to compare such a result with
            return Convergence(value, unit, source, False, f"outside the table's range: no RCP above batch "
                               f"{largest:g}, a result at batch {global_batch:g} needs new RCPs (the RCP "
                               f"checker reports them missing)")
    elif table:
        value, inside, how = interpolate([tuple(p) for p in table["points"]], global_batch)
        source = f"documented table ({table['source']}), {how}"
    else:
        raise HarnessError(f"no RCP table for {workload} under ruleset {ruleset} and no documented table")
    return Convergence(value, unit, source, inside, "" if inside else "outside the table's range")


def by_schedule(calibrated: float, calibrated_horizon: float, horizon: float, unit: str) -> Convergence:
    """Samples (or epochs) to converge for a run whose learning rate decays to its end at `horizon`, when
    runs of the same code and target decaying at `calibrated_horizon` needed `calibrated`: the same share
    of its schedule. A submitter sizes the schedule (MLPerf's `opt_learning_rate_training_steps` x global
    batch) to end just past convergence at its batch, so the share carries across batches where an RCP
    table of another target does not. Both horizons in the unit of `calibrated`."""
    if calibrated <= 0 or calibrated_horizon <= 0 or horizon <= 0:
        raise HarnessError("convergence by schedule: calibrated samples and both schedule lengths must be > 0")
    share = calibrated / calibrated_horizon
    return Convergence(share * horizon, unit, f"the calibration runs' {calibrated:,.4g} {unit} = {share:.3f} of "
                       f"their learning-rate schedule ({calibrated_horizon:,.4g}), scaled to this run's "
                       f"({horizon:,.4g})", True)
