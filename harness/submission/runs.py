"""The runs a package is made of: finding them (campaigns, run directories, logs) and the refusals that
need no checker process (synthetic data, mixed benchmarks, batch sizes or configs, duplicate seeds, the
wrong count, logs the official compliance checker rejects).

A campaign directory yields every launched run in launch order, failed ones included (they count in the
scoring rules' window, harness/submission/window.py); loose run directories and logs yield what they hold.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
from typing import Any

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.mlperf import Verdict, run_compliance_checker
from harness.review import integrity, logparse

# Config keys that legitimately differ between the runs of one result set.
PER_RUN_KEYS = ("seed", "run_id", "output_dir", "check_rulesets", "data.data_dir")


@dataclasses.dataclass
class Run:
    """One result log to package, with what the harness wrote beside it (if anything)."""
    log: str
    events: list[logparse.LogEvent]
    summary: logparse.RunSummary
    run_json: dict | None  # summary.json beside the log
    config: dict | None  # config.yaml beside the log
    data_source: str | None  # the log's harness_data_source event

    @property
    def synthetic(self) -> bool:
        return self.data_source == "synthetic" or bool(self.run_json and self.run_json.get("synthetic_data"))

    @property
    def launched_ms(self) -> float:
        """When the run was launched: its log's first timestamp (init_start)."""
        return min((e.time_ms for e in self.events if e.time_ms is not None), default=0.0)

    @property
    def ruleset(self) -> str | None:
        """The run's own ruleset, else its benchmark's default for this log (as `check` picks it)."""
        return logparse.log_ruleset(self.log, self.events, (self.run_json, self.config))


# ------------------------------------------------------------------------------------------- inputs

def _load_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@dataclasses.dataclass
class Launched:
    """One launched run, in launch order: `run` is None for a run that left no result log (it crashed or
    refused its input), which the scoring rules still count, as a failed run."""
    label: str
    status: str
    run: Run | None = None
    campaign: str | None = None  # the campaign directory it belongs to
    index: int | None = None  # its launch index in that campaign

    @property
    def failed(self) -> bool:
        return self.run is None or not self.run.summary.succeeded


def find_runs(inputs: list[str]) -> tuple[list[Launched], list[str]]:
    """The runs named by one campaign directory, or by run directories and logs; plus notes on what was skipped.

    A campaign yields every run it launched, in launch order (its run index: runs are launched one after
    another), failed ones included. Loose logs are put in launch order by their first logged timestamp
    (init_start), the "objective and deterministic" order the scoring rules ask for. A result_*.txt beside a
    harness config.yaml but without summary.json belongs to a run killed before its summary: skipped, with a note.
    """
    campaigns = [item for item in inputs if os.path.isdir(item) and _load_json(os.path.join(item, "campaign.json"))]
    if campaigns and len(inputs) > 1:
        raise HarnessError(f"package takes one campaign directory alone ({campaigns[0]} was given with "
                           f"{len(inputs) - 1} more input(s)): its window of runs is chosen by the scoring rules")
    if campaigns:
        return campaign_runs(campaigns[0]), []
    logs: list[str] = []
    notes: list[str] = []
    for item in inputs:
        if os.path.isfile(item):
            logs.append(item)
            continue
        if not os.path.isdir(item):
            raise HarnessError(f"package input {item} does not exist")
        found = []
        for root, dirs, files in os.walk(item):
            dirs[:] = sorted(d for d in dirs if d not in ("console", "checker_logs"))
            for name in sorted(files):
                if not re.fullmatch(r"result_.*\.txt", name):
                    continue
                if os.path.exists(os.path.join(root, "config.yaml")) and \
                        not os.path.exists(os.path.join(root, "summary.json")):
                    notes.append(f"{root}: no summary.json (the run did not finish); skipped")
                    continue
                found.append(os.path.join(root, name))
        if not found:
            raise HarnessError(f"no result logs (result_*.txt) found under {item}")
        logs.extend(found)
    unique, seen = [], set()
    for log in logs:
        real = os.path.realpath(log)
        if real not in seen:
            seen.add(real)
            unique.append(log)
    runs = sorted((load_run(log) for log in unique), key=lambda r: (r.launched_ms, r.log))
    launched = [Launched(os.path.relpath(r.log), r.summary.status or "no run_stop", r) for r in runs]
    for entry in launched:
        entry.campaign, entry.index = _campaign_of(entry.run.log)
    if len({e.campaign for e in launched}) == 1 and launched[0].campaign is not None:
        launched.sort(key=lambda e: e.index)  # one campaign's runs: its own launch order
    return launched, notes


def _campaign_of(log: str) -> tuple[str | None, int | None]:
    """(campaign directory, launch index) of a log inside a campaign's <dir>/<workload>/<run_id>/, else Nones."""
    run_dir = os.path.dirname(os.path.abspath(log))
    folder = os.path.dirname(os.path.dirname(run_dir))
    campaign = _load_json(os.path.join(folder, "campaign.json"))
    for r in (campaign or {}).get("runs") or []:
        if r.get("run_id") == os.path.basename(run_dir):
            return folder, int(r.get("index", 0))
    return None, None


def campaign_runs(folder: str) -> list[Launched]:
    """Every run the campaign launched, in launch order (its directory may have moved since campaign.json)."""
    campaign = _load_json(os.path.join(folder, "campaign.json")) or {}
    launched = []
    for r in sorted(campaign.get("runs") or [], key=lambda r: int(r.get("index", 0))):
        label = f"run {int(r.get('index', 0)) + 1} (seed {r.get('seed')})"
        status = str(r.get("status"))
        if status in ("pending", "interrupted"):
            raise HarnessError(f"{folder}: {label} is {status}; finish the campaign with `mlperf-harness "
                               f"campaign` first (every launched run counts in the window the rules submit)")
        log = os.path.join(folder, str(campaign.get("workload")), str(r.get("run_id")), f"result_{r.get('seed')}.txt")
        if status in ("crashed", "bad_input"):
            launched.append(Launched(label, status, None, folder, int(r.get("index", 0))))
            continue
        if not os.path.exists(log):
            raise HarnessError(f"{folder}/campaign.json lists run {r.get('run_id')}, but {log} is missing")
        launched.append(Launched(label, status, load_run(log), folder, int(r.get("index", 0))))
    return launched


def load_run(log: str) -> Run:
    events = logparse.parse_log(log)
    run_json, config = logparse.read_run_files(log)
    data_source = next((str(e.value) for e in events if e.key == "harness_data_source"), None)
    return Run(log=log, events=events, summary=logparse.summarize(events, log), run_json=run_json,
               config=config, data_source=data_source)


# ------------------------------------------------------------------------------------------ refusals

def names(runs: list[Run], most: int = 3) -> str:
    """The first `most` runs' logs, for a refusal line."""
    shown = ", ".join(r.log for r in runs[:most])
    return shown + (f" and {len(runs) - most} more" if len(runs) > most else "")


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _one_value(runs: list[Run], what: str, get: Any, hint: str) -> Any:
    values = {}
    for r in runs:
        values.setdefault(get(r), []).append(r)
    if len(values) > 1:
        listing = "; ".join(f"{v!r}: {len(rs)} run(s) ({names(rs)})" for v, rs in values.items())
        raise HarnessError(f"refusing to package: runs mix {what} ({listing}). {hint}")
    return next(iter(values))


def benchmark_of(runs: list[Run]) -> str:
    """The one benchmark `runs` trained, refusing synthetic data and logs of mixed or unnamed benchmarks."""
    synthetic = [r for r in runs if r.synthetic]
    if synthetic:
        raise HarnessError(
            f"refusing to package: {len(synthetic)} of {len(runs)} run(s) trained on SYNTHETIC data "
            f"({names(synthetic)}); synthetic runs are smoke tests, not MLPerf results. Rerun on real "
            f"data (data.source=tfrecord, e.g. configs/resnet/smoke-tfrecord.yaml)")
    missing = [r for r in runs if not r.summary.benchmark]
    if missing:
        raise HarnessError(f"refusing to package: {names(missing)} log(s) no submission_benchmark")
    return _one_value(runs, "benchmarks", lambda r: r.summary.benchmark,
                      "A result set is one benchmark: package each benchmark separately.")


def package_ruleset(runs: list[Run], benchmark: str, asked: list[str]) -> str:
    """The round to package for: `--ruleset` when given, else the runs' own when it is the newest round that
    takes the benchmark in their division. Packaging for an old round by default is the classic wrong-ruleset
    submission (github.com/mlcommons/logging/issues/130 and /382), so that is refused."""
    own = _one_value(runs, "rulesets", lambda r: r.ruleset,
                     "Runs configured for different rulesets cannot form one package.")
    division = runs[0].summary.division
    if len(asked) > 1:
        raise HarnessError(f"package builds for one round: give one --ruleset, not {', '.join(asked)}")
    if asked:
        rules.check_accepts(benchmark, asked[0], division)
        return asked[0]
    rec = rules.record(benchmark)
    accepted = rec.open if division == "open" else rec.closed
    newest = accepted[-1] if accepted else rec.newest
    if own != newest:
        raise HarnessError(f"the runs' config names ruleset {own or 'none'}, not the newest round with {division} "
                           f"{benchmark} ({newest}): name the round to package for with --ruleset (e.g. "
                           f"--ruleset {newest})")
    return newest


def check_runs(runs: list[Run], system: str | None, asked: list[str]) -> tuple[str, str]:
    """The refusals that need no checker process, for the `runs` of one result set; returns (benchmark,
    ruleset to package for)."""
    benchmark = benchmark_of(runs)
    n_required = rules.runs_required(benchmark)
    if n_required is not None and len(runs) != n_required:
        raise HarnessError(f"refusing to package: {len(runs)} {benchmark} run(s) given; MLPerf training "
                           f"requires exactly {n_required} (run `mlperf-harness campaign CONFIG --runs "
                           f"{n_required}`)")
    no_seed = [r for r in runs if r.summary.seed is None]
    if no_seed:
        raise HarnessError(f"refusing to package: {names(no_seed)} log(s) no integer seed; the seed "
                           f"checker needs one per run")
    duplicates = [f for f in integrity.check_seeds([r.summary for r in runs]) if f.code == "duplicate_seed"]
    if duplicates:
        raise HarnessError(f"refusing to package: duplicate seeds: {duplicates[0].message}. Every run of a "
                           f"result set needs its own seed")
    _one_value(runs, "global batch sizes", lambda r: r.summary.global_batch_size,
               "All runs of a result set must use one global batch size (RCPs are per batch size).")
    for what, get in (("submission orgs", lambda r: r.summary.org),
                      ("divisions", lambda r: r.summary.division)):
        _one_value(runs, what, get, "Package one org and division at a time.")
    if system is None:
        _one_value(runs, "submission platforms", lambda r: r.summary.platform,
                   "Name the system with --system if they are the same machine.")
    ruleset = package_ruleset(runs, benchmark, asked)
    _check_same_config(runs)
    return benchmark, ruleset


def _check_same_config(runs: list[Run]) -> None:
    """Runs of one result set share every hyperparameter; only seeds, ids and paths may differ."""
    with_config = [r for r in runs if r.config]
    if len(with_config) < 2:
        return
    flat = [{k: v for k, v in _flatten(r.config).items() if k not in PER_RUN_KEYS} for r in with_config]
    ref = flat[0]
    for r, other in zip(with_config[1:], flat[1:]):
        diff = sorted(k for k in set(ref) | set(other) if ref.get(k) != other.get(k))
        if diff:
            shown = ", ".join(f"{k}: {ref.get(k)!r} vs {other.get(k)!r}" for k in diff[:4])
            raise HarnessError(f"refusing to package: {r.log} was run with another config than "
                               f"{with_config[0].log} ({shown}); a result set is N seeds of one config")


def check_compliance(runs: list[Run], ruleset: str) -> list[Verdict]:
    """The official compliance checker on every log (in parallel); refuses what MLPerf would not accept.

    Mirrors the package checker: at most one result file of a set may fail. The harness is stricter
    about which one: only a run that stopped without reaching the target (closed checker fails it on
    the quality target alone) may be that one; a log that breaks any other rule is refused.
    """
    workers = max(1, min(len(runs), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        verdicts = list(pool.map(lambda r: run_compliance_checker(r.log, ruleset), runs))
    broken = [(r, v) for r, v in zip(runs, verdicts) if not v.passed and not v.only_target_missed]
    if broken:
        r, v = broken[0]
        raise HarnessError(f"refusing to package: {len(broken)} log(s) fail the official compliance checker "
                           f"(ruleset {ruleset}); first: {r.log}: {'; '.join(v.errors[:2]) or 'FAILED'}")
    failed = [r for r, v in zip(runs, verdicts) if not v.passed]
    if len(failed) > 1:
        raise HarnessError(f"refusing to package: {len(failed)} runs did not reach the quality target "
                           f"({names(failed)}); olympic scoring accepts at most one failed run")
    for r in runs:
        errors = [f for f in integrity.check_integrity(r.events, ruleset=ruleset) if f.severity == "error"]
        if errors:
            raise HarnessError(f"refusing to package: {r.log} fails the harness integrity checks: "
                               f"{errors[0].message}")
    return verdicts


