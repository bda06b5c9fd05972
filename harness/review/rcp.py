"""Reference convergence points (RCPs): where a set of result logs sits against the RCP mean for its batch.

MLPerf (rules >= 1.0) compares a submission's olympic mean of epochs to converge (samples for BERT) with
the RCP runs at the same global batch size (interpolated between batch sizes, otherwise). The RCP files
and the verdict come from the installed mlperf-logging package (`mlperf_logging.rcp_checker`): its JSON
files, its log reader and its `check_directory`, the same call the package checker makes. This module
adds the per-run positions, the margin to the fastest allowed mean, and the hyperparameters of the
matching RCP entry next to the ones the logs (or a config) use.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from typing import Any

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.review.rcp_reading import Reading, choose_reading

USAGE = "training"


def rcp_path(benchmark: str, ruleset: str) -> str:
    """The RCP JSON that mlperf-logging ships for `benchmark` under `ruleset`."""
    from mlperf_logging import rcp_checker as pkg

    return os.path.join(os.path.dirname(pkg.__file__), f"{USAGE}_{ruleset}", f"rcps_{benchmark}.json")


def load_rcps(benchmark: str, ruleset: str) -> dict[str, dict[str, Any]]:
    """Every RCP entry of `benchmark` for `ruleset`; HarnessError when mlperf-logging has none."""
    if int(ruleset.split(".")[0]) < 1:
        raise HarnessError(f"ruleset {ruleset} has no reference convergence points (RCPs start at 1.0.0)")
    path = rcp_path(benchmark, ruleset)
    if not os.path.isfile(path):
        raise HarnessError(f"mlperf-logging has no RCPs for {benchmark} under ruleset {ruleset} ({path})")
    with open(path) as f:
        return json.load(f)


def rcp_entry(benchmark: str, ruleset: str, batch: int) -> tuple[str, dict[str, Any]] | None:
    """The RCP entry measured at exactly `batch`, as (name, entry), or None."""
    for name, entry in load_rcps(benchmark, ruleset).items():
        if entry.get("BS") == batch:
            return name, entry
    return None


# RCP hyperparameter names that differ from the log keys holding them (llama2_70b_lora's RCP files name the
# reference's training arguments; its closed checker names the log keys)
RCP_KEY_ALIASES = {"opt_max_grad_norm": "opt_gradient_clip_norm", "lora_r": "lora_rank",
                   "max_steps": "opt_learning_rate_training_steps"}


def logged_key(rcp_key: str, logged: dict[str, Any]) -> str | None:
    """The MLPerf log key holding RCP hyperparameter `rcp_key` (RCPs drop the lars_/sgd_ prefixes, and name
    some by the reference's arguments: RCP_KEY_ALIASES)."""
    if rcp_key == "optimizer":
        candidates = ["opt_name"]
    else:
        candidates = [rcp_key, f"lars_{rcp_key}", f"sgd_{rcp_key}"] + [RCP_KEY_ALIASES.get(rcp_key, rcp_key)]
    return next((k for k in candidates if k in logged), None)


def _same(got: Any, want: Any) -> bool:
    """Logged and RCP values agree: numbers to 1e-9 relative, lists (SSD's decay boundaries) item by item."""
    if isinstance(got, list) or isinstance(want, list):
        return (isinstance(got, list) and isinstance(want, list) and len(got) == len(want)
                and all(_same(g, w) for g, w in zip(got, want)))
    if isinstance(want, str) or isinstance(got, str):
        return got == want
    return abs(float(got) - float(want)) <= 1e-9 * max(1.0, abs(float(want)))


def hparam_mismatches(entry: dict[str, Any], logged: dict[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    """Hyperparameters of an RCP entry that the logged values do not match (missing ones included)."""
    out = []
    for key, want in entry.get("Hyperparams", {}).items():
        if key in skip:
            continue
        name = logged_key(key, logged)
        if name is None:
            out.append(f"{key}: RCP {want!r}, not logged")
            continue
        got = logged[name]
        if not _same(got, want):
            out.append(f"{key}: RCP {want!r}, logged {name}={got!r}")
    return out


# ----------------------------------------------------------------------------------- check --rcp

@dataclasses.dataclass
class RunPoint:
    path: str
    converged: bool
    value: float | None  # epochs (samples for BERT) to converge


@dataclasses.dataclass
class RcpReport:
    benchmark: str
    ruleset: str
    batch: int
    runs: list[RunPoint]
    record: str  # 'resnet_ref_3264', or how the RCP was found ('interpolated between ...')
    rcp_mean: float | None
    fastest_allowed: float | None
    olympic_mean: float | None
    verdict: str  # 'PASS' | 'FAIL' | 'n/a'
    detail: str
    mismatches: list[str]  # against the entry the checker judges by, when one holds this batch
    reading: Reading | None = None
    neighbours: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # interpolated: name -> mismatches

    @property
    def unit(self) -> str:
        return "samples" if rules.record(self.benchmark).unit == rules.SAMPLE else "epochs"


def result_logs(paths: list[str]) -> list[str]:
    """Result logs named by `paths`: files as given, directories searched for result_*.txt. One log reached
    twice (the same file, a link to it, a file and its directory, or a copy of its bytes) is refused: counted
    twice it would weigh double in a set and in a spread."""
    found: list[str] = []
    for p in paths:
        if os.path.isfile(p):
            found.append(p)
        elif os.path.isdir(p):
            for root, _, files in sorted(os.walk(p)):
                found += [os.path.join(root, f) for f in sorted(files)
                          if f.startswith("result_") and f.endswith(".txt")]
        else:
            raise HarnessError(f"{p}: no such file or directory")
    if not found:
        raise HarnessError(f"no result_*.txt logs under {', '.join(paths)}")
    seen: dict[str, str] = {}
    contents: dict[str, str] = {}
    for path in found:
        real = os.path.realpath(path)
        if real in seen:
            raise HarnessError(f"{path}: the same log as {seen[real]}; give each run once")
        seen[real] = path
        digest = _digest(path)
        if digest in contents:
            raise HarnessError(f"{path}: a copy of {contents[digest]} (the same bytes); two runs never log the "
                               "same lines, give each run once")
        contents[digest] = path
    return found


def _digest(path: str) -> str:
    """SHA-256 of a log's bytes (copies of one run under other names weigh double as links do)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise HarnessError(f"{path}: cannot read ({e.strerror})") from None
    return h.hexdigest()


def read_run(path: str, ruleset: str, train_samples: bool = False) -> tuple[bool, float | None, int, str | None]:
    """(converged, epochs or samples to converge, global batch, benchmark) from mlperf-logging's RCP reader
    (`train_samples`: its --bert_train_samples reading).
    One HarnessError line naming the file for a log the reader cannot read (a truncated line, an eval
    without the key it counts, no passing eval before a successful run_stop) or a converged run at <= 0,
    which no RCP can judge (the spread and olympic mean need positive counts)."""
    from mlperf_logging.rcp_checker import rcp_checker as official

    try:
        with _quiet_logging():
            not_converged, value, bs, bench = official.read_submission_file(path, ruleset, train_samples)
    except (KeyError, ValueError, TypeError, IndexError, NameError) as e:  # JSONDecodeError is a ValueError
        what = (f"missing key {e}" if isinstance(e, KeyError) else
                "a successful run_stop with no eval line before it" if isinstance(e, UnboundLocalError) else
                f"{type(e).__name__}: {e}")
        raise HarnessError(f"{path}: mlperf-logging's RCP reader cannot read this log ({what})") from None
    except OSError as e:
        raise HarnessError(f"{path}: cannot read ({e.strerror})") from None
    if not_converged:
        return False, None, bs, bench
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise HarnessError(f"{path}: converged at {value!r} {_unit_name(bench)}; a run needs a positive count "
                           "to converge")
    return True, float(value), bs, bench


def _unit_name(benchmark: str | None) -> str:
    try:
        return "samples" if rules.record(benchmark).unit == rules.SAMPLE else "epochs"
    except HarnessError:
        return "epochs/samples"


def require_rcps(path: str, benchmark: str | None, ruleset: str) -> None:
    """HarnessError (one line) unless mlperf-logging judges `benchmark` under `ruleset` against RCPs."""
    rec = rules.record(benchmark)
    if not rules.has_rcp(benchmark, ruleset):
        with_rcps = ", ".join(rec.rcp) or "none"
        raise HarnessError(f"{path}: MLPerf has no reference convergence points for {benchmark} under ruleset "
                           f"{ruleset} (rulesets with {benchmark} RCPs: {with_rcps}); pass one with --ruleset")
    load_rcps(benchmark, ruleset)


PRUNED = "pruned_rcps"  # the RCP set the package checker tests against


def checker_record(checker: Any, batch: int) -> tuple[str, dict[str, Any] | None]:
    """The record `check_directory` judges a set at `batch` by, from the checker's own lookups, and how it
    was found: the entry at that batch, an interpolation between its neighbours, or (below the smallest
    RCP batch) the smallest-batch entry, which passes only a set slower than it. ("", None) above the
    largest RCP batch, where the checker asks for a new RCP."""
    record = checker._find_rcp(batch, PRUNED)
    if record is not None:
        return next(n for n, r in checker.pruned_rcp_data.items() if r is record), record
    low = checker._find_top_min_rcp(batch, PRUNED)
    high = checker._find_bottom_max_rcp(batch, PRUNED)
    if low is not None and high is not None:
        _, record = checker._create_interp_rcp(batch, low, high)
        return f"interpolated between batch {low['BS']} and {high['BS']}", record
    if low is None and high is not None:
        record = checker._find_min_rcp(PRUNED)
        return f"smallest-batch RCP (batch {record['BS']}; a smaller batch passes only if slower)", record
    return "", None


def _olympic(values: list[float]) -> float:
    values = sorted(values)
    return sum(values[1:-1]) / (len(values) - 2)


def rcp_report(paths: list[str], ruleset: str | None = None) -> RcpReport:
    """Reads the logs with mlperf-logging's RCP reader and runs its RCP test on them (pruned RCPs, as the
    package checker does) under `ruleset` (default: the logs' own, `rcp_reading.choose_ruleset`), with the
    checker's options the logs call for (`rcp_reading.choose_reading`). The test needs at least 3 runs
    (MLPerf asks for the benchmark's result count); with fewer, only the positions are reported."""
    from mlperf_logging.rcp_checker import rcp_checker as official

    logs, benchmark, reading, parsed = read_set(paths, ruleset)
    rec = rules.record(benchmark)
    ruleset = reading.ruleset
    runs, batches = [], set()
    for path in logs:
        converged, value, bs, bench = read_run(path, ruleset, reading.train_samples)
        if bench != benchmark:
            raise HarnessError(f"{path}: benchmark {bench!r}, but {logs[0]} is {benchmark!r}; "
                               "give the logs of one benchmark")
        batches.add(bs)
        runs.append(RunPoint(path, converged, value))
    if len(batches) != 1 or -1 in batches:
        raise HarnessError(f"the logs must share one global_batch_size (found {sorted(batches)})")
    batch = batches.pop()
    logged = {e.key: e.value for e in parsed[0] if e.event_type == "POINT_IN_TIME"}

    with _quiet_logging():
        checker = official.RCP_Checker(USAGE, ruleset, benchmark, False)
        name, record = checker_record(checker, batch)
    mismatches, neighbours = [], {}
    if record is not None and checker._find_rcp(batch, PRUNED) is record:
        mismatches = hparam_mismatches(record, logged)
    elif record is not None and name.startswith("interpolated"):
        neighbours = {n: hparam_mismatches(r, logged) for n, r in interpolation_neighbours(checker, batch)}
    rcp_mean = float(record["RCP Mean"]) if record else None
    fastest = float(record["RCP Mean"] / record["Max Speedup"]) if record else None
    values = [r.value for r in runs if r.converged]
    olympic = _olympic(values) if len(values) >= 3 else None
    if len(runs) < 3:
        verdict = "n/a"
        detail = f"the RCP test needs at least 3 runs (MLPerf: {rec.runs}); positions only"
    else:
        verdict, detail = _official_verdict(logs, ruleset, reading.train_samples)
    return RcpReport(benchmark, ruleset, batch, runs, name or "none at this batch", rcp_mean, fastest, olympic,
                     verdict, detail, mismatches, reading, neighbours)


def read_set(paths: list[str], ruleset: str | None) -> tuple[list[str], str, Reading, list[list[Any]]]:
    """(logs, benchmark, how to read them, parsed events per log) for the logs named by `paths`; one
    HarnessError line for a benchmark or ruleset without RCPs."""
    from harness.review import logparse

    logs = result_logs(paths)
    parsed = [logparse.parse_log(p) for p in logs]
    benchmark = next((e.value for e in parsed[0] if e.key == "submission_benchmark"), None)
    rules.record(benchmark)
    reading = choose_reading(logs, parsed, benchmark, ruleset)
    require_rcps(logs[0], benchmark, reading.ruleset)
    return logs, benchmark, reading, parsed


def interpolation_neighbours(checker: Any, batch: int) -> list[tuple[str, dict[str, Any]]]:
    """The two pruned RCP entries the checker interpolates between at `batch`, as (name, entry)."""
    low = checker._find_top_min_rcp(batch, PRUNED)
    high = checker._find_bottom_max_rcp(batch, PRUNED)
    by_id = {id(r): n for n, r in checker.pruned_rcp_data.items()}
    return [(by_id.get(id(r), f"batch {r['BS']}"), r) for r in (low, high) if r is not None]


def _official_verdict(logs: list[str], ruleset: str, train_samples: bool = False) -> tuple[str, str]:
    """`check_directory` on a scratch folder holding the logs as result_<i>.txt (the name it globs)."""
    from mlperf_logging.rcp_checker import rcp_checker as official

    with tempfile.TemporaryDirectory() as tmp, _quiet_logging():
        for i, path in enumerate(logs):
            os.symlink(os.path.abspath(path), os.path.join(tmp, f"result_{i}.txt"))
        passed, message, _ = official.check_directory(tmp, USAGE, ruleset, False, train_samples, rcp_pass=PRUNED)
    return ("PASS" if passed else "FAIL"), message


class _quiet_logging:
    """The official checker reports through the root logger; its lines would interleave with ours."""

    def __enter__(self) -> None:
        logging.disable(logging.CRITICAL)

    def __exit__(self, *exc: Any) -> None:
        logging.disable(logging.NOTSET)


def format_report(r: RcpReport) -> list[str]:
    unit = r.unit

    def num(x: float) -> str:
        return f"{x:,.0f}" if unit == "samples" else f"{x:.2f}"

    lines = [f"RCP check: {r.benchmark}, ruleset {r.ruleset}, global batch {r.batch}, {len(r.runs)} log(s)"]
    if r.reading is not None:
        lines += r.reading.lines()
    if r.rcp_mean is None:
        lines.append(f"  no RCP at or around batch {r.batch} in mlperf-logging's {r.benchmark} RCPs")
    else:
        lines.append(f"  RCP {r.record}: mean {num(r.rcp_mean)} {unit} to converge, fastest allowed olympic "
                     f"mean {num(r.fastest_allowed)}")
    for run in r.runs:
        if not run.converged:
            lines.append(f"  {run.path}: did not converge")
            continue
        rel = f" ({100 * (run.value / r.rcp_mean - 1):+.1f}% vs the RCP mean)" if r.rcp_mean else ""
        lines.append(f"  {run.path}: {num(run.value)} {unit}{rel}")
    if r.olympic_mean is not None and r.rcp_mean:
        where = ("faster than allowed" if r.olympic_mean < r.fastest_allowed else
                 "faster than the RCP mean, within the allowed speedup (score normalized)"
                 if r.olympic_mean < r.rcp_mean else "at or slower than the RCP mean")
        lines.append(f"  olympic mean {num(r.olympic_mean)} {unit} = {r.olympic_mean / r.rcp_mean:.3f} x the RCP "
                     f"mean: {where}")
    lines.append(f"  official rcp_checker: {r.verdict} ({r.detail})")
    if r.mismatches:
        lines.append("  hyperparameters differ from the RCP entry at this batch (the first log's values):")
        lines += [f"      {m}" for m in r.mismatches]
    if r.neighbours:
        lines.append("  the checker interpolates at this batch (no entry of its pruned RCPs holds it), so no RCP "
                     "hyperparameters are this batch's; the first log's against both neighbours:")
        for name, diffs in r.neighbours.items():
            lines.append(f"    {name}: " + ("the same" if not diffs else "; ".join(diffs)))
    return lines


def main(paths: list[str], rulesets: list[str]) -> int:
    """`check --rcp`: exit 0 unless the official RCP test fails (1)."""
    if not paths:
        raise HarnessError("check --rcp takes result logs or directories of one benchmark")
    if len(rulesets) > 1:
        raise HarnessError("check --rcp takes at most one --ruleset")
    report = rcp_report(paths, rulesets[0] if rulesets else None)
    print("\n".join(format_report(report)))
    return 1 if report.verdict == "FAIL" else 0
