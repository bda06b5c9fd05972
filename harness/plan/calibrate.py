"""Calibration: the per-chip efficiency that makes the step model reproduce step times MLPerf logs show.

`measure(paths, ...)` reads result logs (the harness's own or public ones) of one benchmark at one scale and
returns the mean step time over the scored runs: (run_stop - run_start - synchronous evals) divided by the
steps to the last eval. That includes whatever the loop spends between steps, so a projection from it
predicts run time, not a kernel benchmark. It also returns the mean synchronous eval time (an eval with
training events inside its interval is asynchronous, and evals without intervals are untimed: both count
0, their cost is inside the measured step) and the init time; these replace the documented defaults. `planner` then solves the step model for the efficiency.
"""
from __future__ import annotations

import dataclasses
import re
import statistics

from harness.errors import HarnessError


# Training events: an eval interval with one of these inside ran alongside training (asynchronous).
TRAIN_MARKS = ("block_start", "block_stop", "epoch_start", "epoch_stop")


@dataclasses.dataclass
class Measurement:
    benchmark: str
    platform: str
    chips: int
    global_batch: int
    step_seconds: float
    runs: int
    eval_seconds: float           # mean synchronous eval; 0 when the logs' evals overlap training or are
                                  # not timed (then whatever they cost is inside the measured step)
    init_seconds: float | None
    paths: list[str]


def chips_from_platform(platform: str, chips_per_host: int, cores_per_chip: int) -> int | None:
    """Chips from a submission_platform string: '8xNVIDIA DGX A100' (hosts), 'tpu-v3-8192' (cores)."""
    m = re.match(r"\s*(\d+)\s*x", platform or "")
    if m:
        return int(m.group(1)) * chips_per_host
    m = re.search(r"tpu-v\d+[a-z]*-(\d+)", platform or "", re.I)
    if m:
        return max(1, int(m.group(1)) // cores_per_chip)
    return None


def samples_trained(events, summary, unit: str, epoch_size: int) -> float | None:
    """Samples trained up to the last eval: epochs x epoch size, or samples (BERT's unit) as logged."""
    pos = summary.epochs_or_samples_to_converge
    if pos is None:
        return None
    if unit == "epochs":
        logged = next((e.value for e in events if e.key == "train_samples"), None)
        size = logged if isinstance(logged, (int, float)) and logged > 0 else epoch_size
        return pos * size
    if pos >= 100_000:
        return pos
    last_eval = max((e.time_ms for e in events if e.key == "eval_accuracy"), default=None)
    after = [e.value for e in events if e.key == "train_samples" and last_eval is not None
             and e.time_ms >= last_eval and isinstance(e.value, (int, float))]
    if after:
        return float(after[-1])
    return pos * summary.global_batch_size if summary.global_batch_size else None


def measure(paths: list[str], unit: str, epoch_size: int, chips_per_host: int, cores_per_chip: int,
            chips: int | None = None) -> Measurement:
    from harness.review import logparse, rcp

    logs = rcp.result_logs(paths)
    steps, evals, inits, benchmark, batch, platform, used = [], [], [], None, None, None, []
    for path in logs:
        events = logparse.parse_log(path)
        s = logparse.summarize(events, path)
        if not s.succeeded:
            continue
        if benchmark is None:
            benchmark, batch, platform = s.benchmark, s.global_batch_size, s.platform or ""
        if s.benchmark != benchmark or s.global_batch_size != batch:
            raise HarnessError(f"--calibrate: {path} is {s.benchmark} at global batch {s.global_batch_size}, but "
                               f"{used[0]} is {benchmark} at {batch}; give the logs of one benchmark at one scale")
        if not batch:
            raise HarnessError(f"--calibrate: {path} logs no global_batch_size")
        samples = samples_trained(events, s, unit, epoch_size)
        if not samples:
            raise HarnessError(f"--calibrate: {path}: cannot tell how many samples were trained")
        train_marks = [e.time_ms for e in events if e.key in TRAIN_MARKS]
        sync = [(b.time_ms - a.time_ms) / 1000.0 for a, b in
                logparse.match_intervals(events, "eval_start", "eval_stop", ("epoch_num", "samples_count"))
                if not any(a.time_ms < t < b.time_ms for t in train_marks)]
        run = (s.run_stop_ms - s.run_start_ms) / 1000.0
        steps.append((run - sum(sync)) / (samples / batch))
        evals += sync
        if s.init_time_s is not None:
            inits.append(s.init_time_s)
        used.append(path)
    if not used:
        raise HarnessError(f"--calibrate: no successful run among {len(logs)} log(s)")
    n = chips or chips_from_platform(platform, chips_per_host, cores_per_chip)
    if not n:
        raise HarnessError(f"--calibrate: cannot tell the chip count from submission_platform {platform!r}; "
                           "give --calibrate_chips N")
    return Measurement(benchmark, platform, n, batch, statistics.median(steps), len(used),
                       statistics.mean(evals) if evals else 0.0, statistics.median(inits) if inits else None,
                       used)
