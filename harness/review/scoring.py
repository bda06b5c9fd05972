"""Olympic scoring of one result set (one benchmark on one system), computed by the harness.

mlperf_logging's result_summarizer prints an empty table for ruleset 0.7.0, so the harness scores
runs itself: sort the time-to-train values, drop the fastest and the slowest, average the rest.
A run that did not end with run_stop status 'success' (or has no run_start/run_stop) counts as
the slowest (infinite time); with more than one such run there is no score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness import benchmark_rules as rules
from harness.review.logparse import RunSummary


@dataclass
class ScoredRun:
    path: str
    minutes: float  # math.inf for a failed run
    failed: bool
    status: str | None


@dataclass
class OlympicScore:
    benchmark: str | None
    score_min: float | None
    used: list[ScoredRun] = field(default_factory=list)
    dropped: list[tuple[ScoredRun, str]] = field(default_factory=list)  # (run, why)
    n_runs: int = 0
    n_required: int | None = None
    note: str | None = None  # run count differs from the requirement
    reason: str | None = None  # why score_min is None


def olympic_score(runs: list[RunSummary], benchmark: str | None = None) -> OlympicScore:
    """Score one result set; score_min is None (with ``reason``) when the rules give no score."""
    if benchmark is None:
        benchmark = next((r.benchmark for r in runs if r.benchmark), None)
    n_required = rules.runs_required(benchmark)
    result = OlympicScore(benchmark=benchmark, score_min=None, n_runs=len(runs), n_required=n_required)
    if n_required is not None and len(runs) != n_required:
        result.note = f"{len(runs)} run(s) given; {benchmark} requires {n_required}"

    scored = [ScoredRun(r.path, r.time_to_train_min if r.succeeded else math.inf, not r.succeeded, r.status)
              for r in runs]
    failed = [s for s in scored if s.failed]
    if len(failed) > 1:
        result.reason = f"{len(failed)} runs failed (only one may fail): no score"
        result.dropped = [(s, "failed") for s in failed]
        return result
    if len(scored) < 3:
        result.reason = f"{len(scored)} run(s): at least 3 are needed to drop fastest and slowest"
        return result

    # Stable sort: among equal times the earlier-listed run is treated as the faster one.
    ordered = sorted(scored, key=lambda s: s.minutes)
    fastest, slowest, middle = ordered[0], ordered[-1], ordered[1:-1]
    slow_why = (f"failed run (status {slowest.status!r}) counts as slowest" if slowest.failed
                else "slowest")
    result.dropped = [(fastest, "fastest"), (slowest, slow_why)]
    result.used = middle
    result.score_min = sum(s.minutes for s in middle) / len(middle)
    return result
