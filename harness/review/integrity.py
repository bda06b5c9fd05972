"""Log integrity checks that the official mlperf_logging compliance checker does not make.

The checker validates keys and values, not time: Google's public v0.7 SSD result_0.txt has
run_start ~15 h before init_stop (which makes that run the slowest, so olympic scoring drops it)
and passes. These checks look at ordering, pairing and eval cadence so a reviewer sees such things.

Severities: 'error' = the run's time to train or its status cannot be trusted as logged
(or the user-given eval cadence is broken); 'warning' = worth a look, the score itself stands.
Public v0.7 logs raise warnings routinely (async evals whose eval_start epoch differs from the
eval_accuracy epoch, submission_* lines with time_ms 0, no seed).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from harness import benchmark_rules as rules
from harness.review.logparse import BadLine, LogEvent, RunSummary, closed_target, eval_position

MAX_EXAMPLES = 3  # per problem kind, so a broken log does not drown the report
JITTER_MS = 1000.0  # steps back in time up to this are interleaving noise, not corruption


@dataclass
class Finding:
    severity: str  # 'error' | 'warning'
    code: str
    message: str


def _fmt_duration(ms: float) -> str:
    s = abs(ms) / 1000.0
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 60:
        return f"{s / 60:.2f} min"
    return f"{s:.3f} s"


def _first(events: list[LogEvent], key: str) -> LogEvent | None:
    return next((e for e in events if e.key == key), None)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def _check_time_order(events: list[LogEvent]) -> list[Finding]:
    """Timestamps must not go backwards between consecutive MLLOG lines.

    A step back of more than JITTER_MS is an error (first few listed with line numbers). Smaller
    steps are one warning: multi-process loggers interleave lines (every rank logging init_start)
    and public v0.7 logs are full of such millisecond jitter. Lines with time_ms == 0 are skipped:
    v0.7 submissions append the submission_* keys with time_ms 0; they are reported as a warning.
    """
    findings: list[Finding] = []
    untimed = [e for e in events if e.time_ms == 0]
    timed = [e for e in events if e.time_ms != 0]
    steps = [(prev, cur) for prev, cur in zip(timed, timed[1:]) if cur.time_ms < prev.time_ms]
    backwards = [(p, c) for p, c in steps if p.time_ms - c.time_ms > JITTER_MS]
    jitter = [(p, c) for p, c in steps if p.time_ms - c.time_ms <= JITTER_MS]
    for prev, cur in backwards[:MAX_EXAMPLES]:
        findings.append(Finding(
            "error", "time_backwards",
            f"line {cur.line_no} ({cur.key}) is {_fmt_duration(prev.time_ms - cur.time_ms)} earlier "
            f"than line {prev.line_no} ({prev.key})"))
    if len(backwards) > MAX_EXAMPLES:
        findings.append(Finding("error", "time_backwards",
                                f"... and {len(backwards) - MAX_EXAMPLES} more backwards timestamps"))
    if jitter:
        worst = max(p.time_ms - c.time_ms for p, c in jitter)
        findings.append(Finding(
            "warning", "time_jitter",
            f"{len(jitter)} small step(s) back in time (max {_fmt_duration(worst)}, first at line "
            f"{jitter[0][1].line_no}); typical of several processes writing one log"))
    if untimed:
        findings.append(Finding(
            "warning", "untimed_lines",
            f"{len(untimed)} line(s) have time_ms 0 (first: line {untimed[0].line_no}, "
            f"{untimed[0].key}); ignored for time ordering"))
    return findings


def check_unparsable(bad: list[BadLine]) -> list[Finding]:
    """Every `:::MLLOG` line that is not an event is an error: what it held is lost to every other check
    (a truncated run_stop or eval_accuracy changes the verdict), and the official checker cannot read it.
    An event followed by other text on its line is a warning: it was read, only the official checker fails it."""
    findings: list[Finding] = []
    for severity, code, lines, what in (
            ("error", "unparsable_line", [b for b in bad if not b.kept], "MLLOG lines that are not events"),
            ("warning", "text_after_event", [b for b in bad if b.kept], "events with text after them")):
        findings += [Finding(severity, code, b.describe()) for b in lines[:MAX_EXAMPLES]]
        if len(lines) > MAX_EXAMPLES:
            findings.append(Finding(severity, code, f"... and {len(lines) - MAX_EXAMPLES} more {what}"))
    return findings


def _check_run_markers(events: list[LogEvent]) -> list[Finding]:
    findings: list[Finding] = []
    run_start, run_stop = _first(events, "run_start"), _first(events, "run_stop")
    init_stop = _first(events, "init_stop")
    stops = [e for e in events if e.key == "run_stop"]
    if len(stops) > 1:
        # The official checker only warns; which stop (and status) counts would be a guess.
        findings.append(Finding("error", "run_stop_repeated",
                                f"{len(stops)} run_stop lines (lines {', '.join(str(e.line_no) for e in stops)}); "
                                "a run stops once, so its time to train and status are ambiguous"))
    if run_start is None:
        findings.append(Finding("error", "missing_run_start", "no run_start: time to train is unknown"))
    if run_stop is None:
        findings.append(Finding("error", "missing_run_stop",
                                "no run_stop: the run did not finish (counts as failed)"))
    elif "status" not in run_stop.metadata:
        findings.append(Finding("error", "run_stop_no_status",
                                f"run_stop (line {run_stop.line_no}) has no status metadata"))
    elif run_stop.metadata.get("status") != "success":
        findings.append(Finding("warning", "run_not_successful",
                                f"run_stop status is {run_stop.metadata.get('status')!r}"))
    if run_start and init_stop and run_start.time_ms < init_stop.time_ms:
        findings.append(Finding(
            "error", "run_start_before_init_stop",
            f"run_start (line {run_start.line_no}) is {_fmt_duration(init_stop.time_ms - run_start.time_ms)} "
            f"before init_stop (line {init_stop.line_no}); the timed region is inflated by that much"))
    if run_start and run_stop and run_stop.time_ms < run_start.time_ms:
        findings.append(Finding("error", "run_stop_before_run_start",
                                f"run_stop is {_fmt_duration(run_start.time_ms - run_stop.time_ms)} "
                                "before run_start"))
    return findings


def _check_cadence(events: list[LogEvent], eval_every: float | None) -> list[Finding]:
    """Consecutive eval_accuracy positions (epoch_num or samples_count) must step by the cadence.

    Cadence = eval_every when given (violations are errors), else the most common step (ties: the
    smaller), inferred only from >= 2 steps (violations are warnings). The first eval may sit at
    any offset. The last eval may come early (a smaller step) only if the run then stopped: no
    block_start / eval_start after it and a run_stop after it.
    """
    if eval_every is not None and eval_every <= 0:
        eval_every = None  # "no cadence given" (a config's 0 means "the workload default")
    accs = [e for e in events if e.key == "eval_accuracy" and eval_position(e) is not None]
    if len(accs) < 2:
        return []
    steps = [eval_position(b) - eval_position(a) for a, b in zip(accs, accs[1:])]
    if eval_every is not None:
        cadence, severity, how = float(eval_every), "error", "expected"
    else:
        if len(steps) < 2:
            return []
        counts = Counter(steps)
        best = max(counts.values())
        cadence = min(s for s, c in counts.items() if c == best)
        severity, how = "warning", "inferred"
    last = accs[-1]
    stopped_after_last = any(e.key == "run_stop" and e.line_no > last.line_no for e in events) and not any(
        e.key in ("block_start", "eval_start") and e.line_no > last.line_no for e in events)
    bad: list[Finding] = []
    for (prev, cur), step in zip(zip(accs, accs[1:]), steps):
        if _close(step, cadence):
            continue
        if cur is last and 0 < step < cadence and stopped_after_last:
            continue
        bad.append(Finding(
            severity, "eval_off_cadence",
            f"eval at {eval_position(cur):g} (line {cur.line_no}) is {step:g} after the previous one "
            f"at {eval_position(prev):g}; {how} cadence {cadence:g}"))
    if len(bad) > MAX_EXAMPLES:
        extra = len(bad) - MAX_EXAMPLES
        bad = bad[:MAX_EXAMPLES] + [Finding(severity, "eval_off_cadence", f"... and {extra} more off-cadence evals")]
    return bad


def _check_eval_pairs(events: list[LogEvent]) -> list[Finding]:
    """Every eval_accuracy needs an earlier eval_start and some eval_stop for the same position."""
    starts: dict[float | None, list[int]] = defaultdict(list)
    stops: set[float | None] = set()
    for e in events:
        if e.key == "eval_start":
            starts[eval_position(e)].append(e.line_no)
        elif e.key == "eval_stop":
            stops.add(eval_position(e))
    bad: list[Finding] = []
    for e in events:
        if e.key != "eval_accuracy":
            continue
        pos = eval_position(e)
        missing = []
        if not any(n < e.line_no for n in starts.get(pos, [])):
            missing.append("eval_start")
        if pos not in stops:
            missing.append("eval_stop")
        if missing:
            where = "no position" if pos is None else f"{pos:g}"
            bad.append(Finding("warning", "eval_unmatched",
                               f"eval_accuracy at {where} (line {e.line_no}) has no matching {' / '.join(missing)}"))
    if len(bad) > MAX_EXAMPLES:
        extra = len(bad) - MAX_EXAMPLES
        bad = bad[:MAX_EXAMPLES] + [Finding("warning", "eval_unmatched", f"... and {extra} more unmatched evals")]
    return bad


def _value(events: list[LogEvent], key: str) -> object:
    e = _first(events, key)
    return None if e is None else e.value


def _samples_before(events: list[LogEvent], acc: LogEvent) -> float | None:
    """Training samples done when `acc` was logged: the last block_stop's samples_count before it."""
    stops = [e for e in events if e.key == "block_stop" and e.line_no < acc.line_no
             and isinstance(e.metadata.get("samples_count"), (int, float))]
    return float(stops[-1].metadata["samples_count"]) if stops else None


def check_eval_schedule(events: list[LogEvent], ruleset: str) -> list[Finding]:
    """A closed log must evaluate on the rules' schedule for `ruleset` (its benchmark's recorded cadence).

    From 1.0 the rules require "the same frequency" as the reference, "rounded up to the nearest batch
    size" (training_rules.adoc); v0.7 asked for "at least as frequently", so there the cadence's positions
    are the latest allowed ones. Epoch cadences with a choice of first eval (ResNet: epoch 1-4) are held to
    their spacing, and every eval to come at or after the end of the epoch it is logged for (when block_stop
    carries samples_count); other epoch cadences (SSD) to the rules' list of epochs; sample cadences (BERT,
    the decoder LMs) to k * spacing, rounded up by less than a batch. An off-schedule final eval is an error
    when the run claims success there. A log that says it ran on synthetic data (`harness_data_source`) is a
    smoke test, never a result: warnings only. Benchmarks without a recorded cadence are not checked.
    """
    if _value(events, "submission_division") != "closed":
        return []
    benchmark = _value(events, "submission_benchmark")
    gbs = _value(events, "global_batch_size")
    batch = int(gbs) if isinstance(gbs, (int, float)) and not isinstance(gbs, bool) and gbs > 0 else 0
    accs = [e for e in events if e.key == "eval_accuracy" and eval_position(e) is not None]
    cadence = rules.cadence(str(benchmark), ruleset, batch or 1)
    if cadence is None or not accs:
        return []
    run_stop = _first(events, "run_stop")
    success = run_stop is not None and run_stop.metadata.get("status") == "success"
    bad: list[Finding] = []
    synthetic = _value(events, "harness_data_source") == "synthetic"

    def flag(acc: LogEvent, why: str) -> None:
        last_aborted = acc is accs[-1] and not success
        bad.append(Finding("warning" if last_aborted or synthetic else "error", "eval_schedule",
                           f"eval at {eval_position(acc):g} (line {acc.line_no}) {why} (closed {benchmark}, "
                           f"ruleset {ruleset})"))

    positions = [float(eval_position(a)) for a in accs]
    every = cadence.every
    if cadence.unit == rules.EPOCH and cadence.first_choices:
        lo, hi = min(cadence.first_choices), max(cadence.first_choices)
        if positions[0] > hi or positions[0] < lo:
            flag(accs[0], f"is the first eval; the first must come at epoch {lo:g}-{hi:g} (offset 0-{hi - 1:g})")
        for prev, cur, acc in zip(positions, positions[1:], accs[1:]):
            step = cur - prev
            if (step > every + 1e-6) if not cadence.exact else not _close(step, every):
                flag(acc, f"is {step:g} epochs after the previous one; the rules evaluate every {every:g}")
    elif cadence.unit == rules.EPOCH:
        if not cadence.exact:
            # "At least as frequently", held loosely: Google's accepted v0.7 SSD logs evaluate every ~5.2 real
            # epochs. The first eval by the rules' first, then never further apart than the rules' widest gap.
            for prev, cur, acc in zip([0.0] + positions, positions, accs):
                limit = cadence.first if prev == 0.0 else prev + cadence.largest_gap
                if cur > limit + 1e-6:
                    flag(acc, f"comes {cur - prev:g} epochs after the previous eval; v0.7 evaluates at least at "
                              f"epochs {cadence.text().removesuffix(' epochs')}")
        else:
            want_all = cadence.positions(max(positions))
            for k, (acc, pos) in enumerate(zip(accs, positions)):
                want = want_all[k] if k < len(want_all) else None
                if want is None or abs(pos - want) > 1e-6:
                    flag(acc, f"is eval {k + 1}; the rules put it at epoch {want if want is not None else '-'} "
                              f"({cadence.text()})")
    elif not cadence.exact:
        if positions[0] > cadence.first + batch:
            flag(accs[0], f"is the first eval; v0.7 evaluates from {cadence.first:,g} samples")
        for prev, cur, acc in zip(positions, positions[1:], accs[1:]):
            if cur - prev > every + batch:
                flag(acc, f"is {cur - prev:g} samples after the previous one; v0.7 evaluates at least "
                          f"every {every:,g}")
    elif batch:
        first = cadence.first
        if cadence.first_choices and any(abs(positions[0] - c) < 1e-6 for c in cadence.first_choices):
            first = positions[0]  # a first eval the rules let the run choose
        for k, (acc, pos) in enumerate(zip(accs, positions), start=1):
            want = first + (k - 1) * every
            if not (want - 1e-6 <= pos < want + batch):
                flag(acc, f"is eval {k}; the rules put it at {want:,g} samples (from {first:,g}, every "
                          f"{every:,g} at batch {batch}, rounded up to a batch)")
    if cadence.unit == rules.EPOCH and cadence.first_choices:
        train_samples = _value(events, "train_samples")
        if isinstance(train_samples, (int, float)):
            for acc, pos in zip(accs, positions):
                done = _samples_before(events, acc)
                if done is not None and done < pos * train_samples - 1e-6:
                    flag(acc, f"ran after {done:g} samples, before epoch {pos:g} ends "
                              f"({pos * train_samples:g} samples); evals may only be rounded up")
    if len(bad) > MAX_EXAMPLES:
        extra = len(bad) - MAX_EXAMPLES
        bad = bad[:MAX_EXAMPLES] + [Finding(bad[-1].severity, "eval_schedule",
                                            f"... and {extra} more evals off the rules' schedule")]
    return bad


MODEL_KEY = "harness_model"  # the harness's model disclosure (harness.train.reference)


def _model_text(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_model_text(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "missing" if value is None else str(value)


def _model_same(a: object, b: object) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_model_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def check_closed_model(events: list[LogEvent]) -> list[Finding]:
    """A closed log on real data must come from the reference model, as far as the log shows it.

    Errors: a logged key the rules fix for the closed division (the record's `closed_fixed`) with another value; a
    harness log (it names its `harness_data_source`) whose model disclosure (`harness_model`: the run's
    settings beside the reference's) differs, or that has none (written before the harness checked models,
    so nothing shows the model was the reference). Synthetic-data logs are smoke tests and are not judged;
    logs of other tools carry no disclosure and are judged by their fixed keys only.
    """
    if _value(events, "submission_division") != "closed":
        return []
    source = _value(events, "harness_data_source")
    if source == "synthetic":
        return []
    findings: list[Finding] = []
    benchmark = str(_value(events, "submission_benchmark"))
    record = rules.get(benchmark)
    for key, want in (record.closed_fixed if record else {}).items():
        e = _first(events, key)
        if e is not None and not _model_same(e.value, want):
            findings.append(Finding("error", "closed_fixed_key",
                                    f"{key}={_model_text(e.value)} (line {e.line_no}) but closed {benchmark} "
                                    f"fixes it at {want}"))
    if source is None:
        return findings
    model = _first(events, MODEL_KEY)
    value = model.value if model is not None else None
    if not isinstance(value, dict) or not isinstance(value.get("settings"), dict) \
            or not isinstance(value.get("reference"), dict):
        findings.append(Finding("error", "model_undisclosed",
                                f"closed {benchmark} log on {source} data discloses no model ({MODEL_KEY}); "
                                f"nothing shows it trained the reference model (rerun with this harness)"))
        return findings
    settings, reference = value["settings"], value["reference"]
    off = [f"{k}={_model_text(settings.get(k))} (reference {_model_text(v)})" for k, v in reference.items()
           if not _model_same(settings.get(k), v)]
    if off:
        findings.append(Finding("error", "model_not_reference",
                                f"closed log on {source} data from a model that is not the reference "
                                f"{value.get('reference_model', '')} (line {model.line_no}): {', '.join(off)}"))
    return findings


def status_target(events: list[LogEvent], ruleset: str) -> float | None:
    """The target a log's run_stop status is judged by: its benchmark's closed target under `ruleset` (at the
    logged global batch); None for an open-division log (its run sets its own) or no single closed target."""
    if _value(events, "submission_division") == "open":
        return None
    gbs = _value(events, "global_batch_size")
    batch = int(gbs) if isinstance(gbs, (int, float)) and not isinstance(gbs, bool) else None
    return closed_target(_value(events, "submission_benchmark"), ruleset, batch)


def check_status(events: list[LogEvent], target: float | None) -> list[Finding]:
    """run_stop's status must agree with the evals: 'success' needs the last eval_accuracy at the target, any
    other status needs no eval_accuracy at it (a run ends at the first eval that reaches it). The official
    checker passes a reached target logged as aborted, and words a missed one through its per-benchmark rules;
    this check holds both in its own words. No `target` (or no run_stop): nothing to judge."""
    run_stop = _first(events, "run_stop")
    if target is None or run_stop is None or "status" not in run_stop.metadata:
        return []
    benchmark = _value(events, "submission_benchmark")
    bound = f"{rules.relation(str(benchmark))} {target:g}"
    accs = [e for e in events if e.key == "eval_accuracy"
            and isinstance(e.value, (int, float)) and not isinstance(e.value, bool)]
    status = run_stop.metadata["status"]
    if status == "success":
        if not accs:
            return [Finding("error", "status_contradicts_evals",
                            f"run_stop (line {run_stop.line_no}) says success but no eval_accuracy is logged "
                            f"(target {bound})")]
        last = accs[-1]
        if not rules.reaches(str(benchmark), float(last.value), target):
            return [Finding("error", "status_contradicts_evals",
                            f"run_stop (line {run_stop.line_no}) says success but the last eval_accuracy "
                            f"{last.value:.4g} (line {last.line_no}) does not reach the target {bound}")]
        return []
    reached = next((e for e in accs if rules.reaches(str(benchmark), float(e.value), target)), None)
    if reached is not None:
        return [Finding("error", "status_contradicts_evals",
                        f"run_stop (line {run_stop.line_no}) says {status!r} but eval_accuracy {reached.value:.4g} "
                        f"(line {reached.line_no}) reached the target {bound}")]
    return []


def _check_interrupted(events: list[LogEvent]) -> list[Finding]:
    """A run stopped by a signal logs `harness_interrupted` (harness.mlperf.MLPerfLog.interrupted): its
    aborted run_stop is not the end of a run, whatever the official checker makes of it."""
    stop = _first(events, "harness_interrupted")
    if stop is None:
        return []
    return [Finding("error", "interrupted", f"the run was stopped by {stop.value} (line {stop.line_no}); "
                                            f"not a result")]


def check_integrity(events: list[LogEvent], eval_every: float | None = None,
                    ruleset: str | None = None, bad_lines: list[BadLine] | None = None) -> list[Finding]:
    """All single-log checks; an empty list means nothing suspicious was found.

    `bad_lines`: the log's MLLOG lines that are not events (logparse.parse_log collects them), each an error.
    With a `ruleset`, closed logs are also held to their benchmark's eval schedule under it (check_eval_schedule)
    and the run_stop status to the target under it (check_status).
    """
    findings = (check_unparsable(bad_lines or []) + _check_run_markers(events) + _check_time_order(events)
                + _check_cadence(events, eval_every) + _check_eval_pairs(events) + check_closed_model(events))
    findings += _check_interrupted(events)
    if ruleset is not None:
        findings += check_eval_schedule(events, ruleset) + check_status(events, status_target(events, ruleset))
    return findings


def check_seeds(summaries: list[RunSummary]) -> list[Finding]:
    """Runs of one result set must each log a distinct seed (MLPerf seed rule).

    Duplicate seeds are errors (the runs are not independent samples); a missing seed is a warning
    because distinctness cannot be verified (common in v0.7 public logs).
    """
    findings: list[Finding] = []
    by_seed: dict[int, list[str]] = defaultdict(list)
    for s in summaries:
        if s.seed is None:
            findings.append(Finding("warning", "missing_seed", f"{s.path}: no integer seed logged"))
        else:
            by_seed[s.seed].append(s.path)
    for seed, paths in sorted(by_seed.items()):
        if len(paths) > 1:
            findings.append(Finding("error", "duplicate_seed",
                                    f"seed {seed} is used by {len(paths)} runs: {', '.join(paths)}"))
    return findings
