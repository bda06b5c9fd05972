"""Calibration: the per-chip efficiency that makes the step model reproduce step times MLPerf logs show.

`measure(paths, ...)` reads result logs (the harness's own or public ones) of one benchmark at one scale and
returns the mean step time over the scored runs: (run_stop - run_start - synchronous evals - the last
asynchronous eval's tail) divided by the steps to the last eval. That includes whatever the loop spends
between steps, so a projection from it predicts run time, not a kernel benchmark. It also returns how the
logs evaluate: synchronously (no training events inside an eval interval), asynchronously (training goes on
inside it: the run waits only for the last one) or untimed (no intervals), the mean eval interval, the
evals and steps per run, and the init time. `project.calibrate` then solves the step model for the
efficiency and splits the eval into its device, host and fixed parts.
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
    eval_seconds: float | None    # mean eval interval (None: the logs time no eval)
    init_seconds: float | None
    paths: list[str]
    eval_mode: str = "sync"       # "sync" | "async" | "untimed"
    evals: float = 0.0            # per run
    steps: float = 0.0            # per run


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
    asyncs, counts, run_steps = [], [], []
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
        pairs = logparse.match_intervals(events, "eval_start", "eval_stop", ("epoch_num", "samples_count"))
        sync = [(b.time_ms - a.time_ms) / 1000.0 for a, b in pairs
                if not any(a.time_ms < t < b.time_ms for t in train_marks)]
        late = [(a.time_ms, b.time_ms) for a, b in pairs if any(a.time_ms < t < b.time_ms for t in train_marks)]
        run = (s.run_stop_ms - s.run_start_ms) / 1000.0
        # the run waited for the last asynchronous eval only after training's last event
        tail = 0.0
        if late:
            last_train = max((t for t in train_marks if t <= s.run_stop_ms), default=late[-1][0])
            tail = max(0.0, (max(b for _, b in late) - max(last_train, late[-1][0])) / 1000.0)
        steps.append((run - sum(sync) - tail) / (samples / batch))
        run_steps.append(samples / batch)
        counts.append(len(pairs) or sum(1 for e in events if e.key == "eval_accuracy"))
        evals += sync
        asyncs += [(b - a) / 1000.0 for a, b in late]
        if s.init_time_s is not None:
            inits.append(s.init_time_s)
        used.append(path)
    if not used:
        raise HarnessError(f"--calibrate: no successful run among {len(logs)} log(s)")
    n = chips or chips_from_platform(platform, chips_per_host, cores_per_chip)
    if not n:
        raise HarnessError(f"--calibrate: cannot tell the chip count from submission_platform {platform!r}; "
                           "give --calibrate_chips N")
    mode = "async" if asyncs and len(asyncs) >= len(evals) else "sync" if evals else "untimed"
    timed = asyncs if mode == "async" else evals
    return Measurement(benchmark, platform, n, batch, statistics.median(steps), len(used),
                       statistics.mean(timed) if timed else None, statistics.median(inits) if inits else None,
                       used, mode, statistics.mean(counts), statistics.mean(run_steps))
