"""`mlperf-harness package`: lay out an MLPerf training submission tree and run the official checkers.

Tree (the layout mlperf_logging.package_checker reads):
    <out>/<org>/systems/<system>.json
    <out>/<org>/benchmarks/<benchmark>/implementations/<impl>/{README.md, run_and_time.sh, config.yaml}
    <out>/<org>/results/<system>/<benchmark>/result_<i>.txt
    <out>/checker_logs/...  <out>/package_report.json   (outside <org>: the checkers must not see them)

Before writing anything it refuses, with one message each (HarnessError, exit 2), what no reviewer
should be handed: synthetic-data runs, logs the official checker rejects (beyond the one failed run
olympic scoring tolerates), mixed benchmarks / batch sizes / configs, duplicate seeds, and the wrong
run count. Then it runs the official package, system description, RCP and result summarizer tools
and reports each verdict separately. The package checker includes the RCP check for closed rulesets
>= 1.0.0; small smoke runs converge in far fewer epochs than any reference curve and fail it, so when
RCP is the package checker's only complaint the tree is re-checked with `--rcp-bypass` (the checker's
own advice) and the RCP failure stays in the report, stated plainly.
"""
from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import yaml
from absl import logging

from harness import benchmark_rules as rules
from harness.review import integrity, logparse, scoring
from harness import sysinfo
from harness.errors import HarnessError
from harness.mlperf import Verdict, run_compliance_checker

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Config keys that legitimately differ between the runs of one result set.
PER_RUN_KEYS = ("seed", "run_id", "output_dir", "check_rulesets", "data.data_dir")
STATUS_STRINGS_4 = {"onprem": "Available on-premise", "cloud": "Available cloud",
                    "research": "Research, Development, or Internal (RDI)", "preview": "Preview"}
STATUS_STRINGS_OLD = {"onprem": "available", "cloud": "available", "research": "research",
                      "preview": "preview"}
PACKAGE_SUCCESS = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS"
SMOKE_RCP_NOTE = ("small smoke runs converge in far fewer epochs than any MLPerf reference convergence "
                  "point (RCP) allows, so they fail the RCP check; real closed-division runs must pass it")


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
    def ruleset(self) -> str | None:
        """The run's own ruleset, else its benchmark's default for this log (as `check` picks it)."""
        return logparse.log_ruleset(self.log, self.events, (self.run_json, self.config))


@dataclasses.dataclass
class Check:
    name: str
    verdict: str  # PASS | FAIL | ACCEPTED (bypass) | n/a | ran | error
    detail: str = ""
    log: str | None = None


# ------------------------------------------------------------------------------------------- inputs

def _load_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def find_logs(inputs: list[str]) -> tuple[list[str], list[str]]:
    """Result logs named by campaign dirs, run dirs or files; plus notes on what was skipped.

    A result_*.txt beside a harness config.yaml but without summary.json belongs to a run that never
    finished (killed before its summary was written): skipped with a note, never packaged.
    """
    logs: list[str] = []
    notes: list[str] = []
    for item in inputs:
        if os.path.isfile(item):
            logs.append(item)
            continue
        if not os.path.isdir(item):
            raise HarnessError(f"package input {item} does not exist")
        campaign = _load_json(os.path.join(item, "campaign.json"))
        if campaign and campaign.get("runs"):
            logs.extend(_campaign_logs(item, campaign, notes))
            continue
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
    return unique, notes


def _campaign_logs(folder: str, campaign: dict, notes: list[str]) -> list[str]:
    """Exactly the campaign's finished runs (its directory may have moved since campaign.json was written)."""
    logs = []
    for r in campaign["runs"]:
        if r.get("status") in ("pending", "crashed", "bad_input"):
            notes.append(f"{folder}: run {r.get('index')} (seed {r.get('seed')}) is {r.get('status')}; "
                         f"finish it with `mlperf-harness campaign` first")
            continue
        log = os.path.join(folder, str(campaign.get("workload")), str(r.get("run_id")), f"result_{r.get('seed')}.txt")
        if not os.path.exists(log):
            raise HarnessError(f"{folder}/campaign.json lists run {r.get('run_id')}, but {log} is missing")
        logs.append(log)
    return logs


def load_run(log: str) -> Run:
    events = logparse.parse_log(log)
    run_json, config = logparse.read_run_files(log)
    data_source = next((str(e.value) for e in events if e.key == "harness_data_source"), None)
    return Run(log=log, events=events, summary=logparse.summarize(events, log), run_json=run_json,
               config=config, data_source=data_source)


# ------------------------------------------------------------------------------------------ refusals

def _names(runs: list[Run]) -> str:
    shown = ", ".join(r.log for r in runs[:3])
    return shown + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")


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
        listing = "; ".join(f"{v!r}: {len(rs)} run(s) ({_names(rs)})" for v, rs in values.items())
        raise HarnessError(f"refusing to package: runs mix {what} ({listing}). {hint}")
    return next(iter(values))


def check_runs(runs: list[Run], system: str | None) -> tuple[str, str]:
    """The refusals that need no checker process; returns (benchmark, ruleset)."""
    synthetic = [r for r in runs if r.synthetic]
    if synthetic:
        raise HarnessError(
            f"refusing to package: {len(synthetic)} of {len(runs)} run(s) trained on SYNTHETIC data "
            f"({_names(synthetic)}); synthetic runs are smoke tests, not MLPerf results. Rerun on real "
            f"data (data.source=tfrecord, e.g. configs/resnet/smoke-tfrecord.yaml)")
    missing = [r for r in runs if not r.summary.benchmark]
    if missing:
        raise HarnessError(f"refusing to package: {_names(missing)} log(s) no submission_benchmark")
    benchmark = _one_value(runs, "benchmarks", lambda r: r.summary.benchmark,
                           "A result set is one benchmark: package each benchmark separately.")
    n_required = rules.runs_required(benchmark)
    if n_required is not None and len(runs) != n_required:
        raise HarnessError(f"refusing to package: {len(runs)} {benchmark} run(s) given; MLPerf training "
                           f"requires exactly {n_required} (run `mlperf-harness campaign CONFIG --runs "
                           f"{n_required}`)")
    no_seed = [r for r in runs if r.summary.seed is None]
    if no_seed:
        raise HarnessError(f"refusing to package: {_names(no_seed)} log(s) no integer seed; the seed "
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
    ruleset = _one_value(runs, "rulesets", lambda r: r.ruleset,
                         "Runs checked under different rulesets cannot form one package.")
    rules.check_accepts(benchmark, ruleset, runs[0].summary.division)
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
                           f"({_names(failed)}); olympic scoring accepts at most one failed run")
    for r in runs:
        errors = [f for f in integrity.check_integrity(r.events, ruleset=ruleset) if f.severity == "error"]
        if errors:
            raise HarnessError(f"refusing to package: {r.log} fails the harness integrity checks: "
                               f"{errors[0].message}")
    return verdicts


# --------------------------------------------------------------------------------------------- tree

def _safe_name(value: str, what: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", value or ""):
        raise HarnessError(f"{what} {value!r} cannot be a directory name in the submission tree; "
                           f"use letters, digits, '.', '_', '+' or '-'")
    return value


def parse_system_fields(items: list[str]) -> dict[str, str]:
    fields = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise HarnessError(f"--system_field {item!r}: expected key=value, e.g. "
                               f"accelerator_model_name='NVIDIA A100-SXM4-80GB'")
        if key not in sysinfo.REQUIRED_FIELDS:
            import difflib
            close = difflib.get_close_matches(key, sysinfo.REQUIRED_FIELDS, n=2)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise HarnessError(f"--system_field {key!r} is not a system description field{hint}")
        fields[key] = value
    return fields


def _runtime_facts(runs: list[Run]) -> tuple[str, int, int, str]:
    """(device type, replicas, hosts, description) from summary.json, else the config's runtime kind."""
    for r in runs:
        desc = (r.run_json or {}).get("runtime") or ""
        m = re.search(r"(\d+) replica\(s\) on (\w+), (\d+) host\(s\)", desc)
        if m:
            return m.group(2), int(m.group(1)), int(m.group(3)), desc
    kind = ((runs[0].config or {}).get("runtime") or {}).get("kind", "")
    device = {"tpu": "TPU"}.get(kind, "unknown")
    return device, 0, 1, f"runtime kind {kind or 'unknown'}"


def system_description(runs: list[Run], system: str, ruleset: str, overrides: dict[str, str],
                       out_dir: str) -> tuple[dict[str, str], list[str]]:
    """The system JSON: host facts detected here, accelerators from the runs, user overrides last.

    Returns the description and the fields still 'unknown' that a reviewer would want filled in.
    """
    s = runs[0].summary
    device, replicas, hosts, runtime_desc = _runtime_facts(runs)
    status_key = next((str(e.value) for e in runs[0].events if e.key == "submission_status"), "research")
    major = int(ruleset.split(".")[0])
    table = STATUS_STRINGS_4 if major >= 4 else STATUS_STRINGS_OLD
    desc: dict[str, str] = {"submitter": s.org or "unknown", "division": s.division or "closed",
                            "status": table.get(status_key, status_key), "system_name": system,
                            "number_of_nodes": str(hosts)}
    desc.update(sysinfo.host_fields(out_dir))
    tf_versions = {(r.run_json or {}).get("host", {}).get("tensorflow") for r in runs} - {None}
    if len(tf_versions) == 1:  # the version that produced the results, not necessarily the one here
        desc["framework"] = f"TensorFlow {tf_versions.pop()}"
    if hosts == 1:
        desc.update(host_networking="N/A (single node)", host_networking_topology="N/A (single node)")
    if device == "CPU":
        desc.update({"accelerators_per_node": "0", "accelerator_model_name": "N/A (CPU only)"})
        for key in ("accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
                    "accelerator_memory_configuration", "accelerator_memory_capacity",
                    "accelerator_interconnect", "accelerator_interconnect_topology"):
            desc[key] = "N/A"
    else:
        desc["accelerators_per_node"] = str(replicas // max(hosts, 1)) if replicas else sysinfo.UNKNOWN
        desc["accelerator_model_name"] = f"unknown {device}"
    desc.update({"cooling": "unknown", "hw_notes": "",
                 "sw_notes": f"mlperf-harness ({runtime_desc}); host facts detected by `mlperf-harness "
                             f"package` on the packaging machine"})
    for key in sysinfo.REQUIRED_FIELDS:
        desc.setdefault(key, sysinfo.UNKNOWN)
    desc.update(overrides)
    ordered = {k: desc[k] for k in sysinfo.REQUIRED_FIELDS}
    ordered.update({k: v for k, v in desc.items() if k not in ordered})
    unknown = [k for k, v in ordered.items() if str(v).startswith("unknown")]
    return ordered, unknown


RUN_AND_TIME = """#!/usr/bin/env bash
# Reproduces one {benchmark} result of this package with mlperf-harness (packaged at commit {commit}).
# usage: ./run_and_time.sh SEED [DATA_DIR] [OUTPUT_DIR]
#   SEED        the run's seed (this package's results used {seeds})
#   DATA_DIR    the dataset folder (default: the one the results were trained on)
#   OUTPUT_DIR  where the run writes logs/<workload>/<run_id>/ (default: logs)
# Needs the harness importable: `pip install -e .[cpu|gpu|tpu]` in a checkout, or HARNESS_ROOT=<checkout>.
set -uo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
SEED="${{1:?usage: run_and_time.sh SEED [DATA_DIR] [OUTPUT_DIR]}}"
DATA_DIR="${{2:-{data_dir}}}"
OUTPUT_DIR="${{3:-logs}}"
PYTHON="${{PYTHON:-python3}}"
if [ -n "${{HARNESS_ROOT:-}}" ]; then export PYTHONPATH="$HARNESS_ROOT${{PYTHONPATH:+:$PYTHONPATH}}"; fi
start=$(date +%s)
echo "STARTING TIMING RUN AT $(date)"
"$PYTHON" -m harness run "$HERE/config.yaml" --set seed="$SEED" {data_flag}\\
    --set run_id="seed${{SEED}}-$(date +%Y%m%d-%H%M%S)" --output_dir "$OUTPUT_DIR"
rc=$?
end=$(date +%s)
echo "ENDING TIMING RUN AT $(date)"
echo "RESULT,{benchmark},$SEED,$((end - start)),${{USER:-unknown}},$(date)"
exit $rc
"""


def _readme(benchmark: str, impl: str, runs: list[Run], ruleset: str, commit: str) -> str:
    s = runs[0].summary
    lines = [
        f"# {benchmark}: {impl}",
        "",
        f"Trained with mlperf-harness (TensorFlow 2); packaged at harness commit {commit}.",
        f"Ruleset {ruleset}, {s.division} division, global batch size {s.global_batch_size}, "
        f"{len(runs)} runs with seeds {', '.join(str(r.summary.seed) for r in sorted(runs, key=_seed))}.",
        "",
        "## Files",
        "- `config.yaml`: the resolved run config (every run used it; only `seed`, `run_id` and paths differ).",
        "- `run_and_time.sh SEED [DATA_DIR] [OUTPUT_DIR]`: reproduces one run with the harness and prints",
        "  a `RESULT,...` line; the MLPerf log lands in `OUTPUT_DIR/<workload>/<run_id>/result_<seed>.txt`.",
        "",
        "## Reproduce the whole result set",
        "```",
        f"mlperf-harness campaign config.yaml --runs {len(runs)} --first_seed {_seed(min(runs, key=_seed))} "
        "--campaign_dir my-campaign --set data.data_dir=DATA_DIR",
        "mlperf-harness package my-campaign --out my-package",
        "```",
    ]
    data_sources = {r.data_source for r in runs if r.data_source}
    if data_sources:
        lines += ["", f"Data source logged by the runs: {', '.join(sorted(data_sources))}."]
    return "\n".join(lines) + "\n"


def _seed(r: Run) -> int:
    return r.summary.seed if r.summary.seed is not None else -1


def write_tree(runs: list[Run], out_dir: str, org: str, system: str, benchmark: str, impl: str,
               ruleset: str, system_desc: dict[str, str]) -> dict[str, str]:
    """Writes the submission tree; returns {packaged result file: source log}."""
    org_dir = os.path.join(out_dir, org)
    systems = os.path.join(org_dir, "systems")
    impl_dir = os.path.join(org_dir, "benchmarks", benchmark, "implementations", impl)
    results = os.path.join(org_dir, "results", system, benchmark)
    for d in (systems, impl_dir, results):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(systems, f"{system}.json"), "w") as f:
        json.dump(system_desc, f, indent=4)
        f.write("\n")

    mapping = {}
    for i, r in enumerate(sorted(runs, key=_seed)):
        target = os.path.join(results, f"result_{i}.txt")
        shutil.copyfile(r.log, target)
        mapping[target] = os.path.abspath(r.log)

    commit = sysinfo.harness_commit_label()
    config = dict(next((r.config for r in sorted(runs, key=_seed) if r.config), None) or {})
    data_dir = ""
    if config:
        config.update(run_id="", output_dir="logs")
        data_dir = str((config.get("data") or {}).get("data_dir") or "")
        with open(os.path.join(impl_dir, "config.yaml"), "w") as f:
            f.write(f"# Resolved config of this result set (packaged at mlperf-harness {commit}); "
                    f"run_and_time.sh sets seed and run_id per run.\n")
            yaml.safe_dump(config, f, sort_keys=False)
    has_data_dir = "data_dir" in (config.get("data") or {})
    script = RUN_AND_TIME.format(
        benchmark=benchmark, commit=commit, seeds=", ".join(str(_seed(r)) for r in sorted(runs, key=_seed)),
        data_dir=data_dir.replace('"', ""),
        data_flag='--set data.data_dir="$DATA_DIR" ' if has_data_dir else "")
    script_path = os.path.join(impl_dir, "run_and_time.sh")
    with open(script_path, "w") as f:
        f.write(script)
    os.chmod(script_path, 0o755)
    with open(os.path.join(impl_dir, "README.md"), "w") as f:
        f.write(_readme(benchmark, impl, runs, ruleset, commit))
    return mapping


# ---------------------------------------------------------------------------------- official tools

def _tool(args: list[str], log_path: str, timeout: int = 600) -> tuple[int, str]:
    """Runs `python -m mlperf_logging.<tool> ...` in a scratch directory (they write logs into cwd)."""
    cmd = [sys.executable, "-m"] + args
    logging.info("running %s", " ".join(cmd))
    with tempfile.TemporaryDirectory() as cwd:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            rc, output = -1, f"timed out after {timeout} s"
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + output)
    return rc, output


def _error_lines(output: str) -> list[str]:
    return [ln.strip() for ln in output.splitlines() if ln.startswith("ERROR")]


def run_package_checker(org_dir: str, ruleset: str, logs_dir: str) -> tuple[Check, Check | None, bool]:
    """The package checker; re-run with --rcp-bypass only when RCP is its sole complaint.

    Returns (plain verdict, bypass verdict or None, accepted).
    """
    base = ["mlperf_logging.package_checker", org_dir, "training", ruleset]
    log = os.path.join(logs_dir, "package_checker.log")
    rc, out = _tool(base + ["--log_output", os.path.join(logs_dir, "package_checker.detail.log")], log)
    errors = _error_lines(out)
    if PACKAGE_SUCCESS in out:
        return Check(f"package_checker {ruleset}", "PASS", PACKAGE_SUCCESS, log), None, True
    rcp_only = bool(errors) and all("RCP" in e or "FOUND ERRORS" in e for e in errors)
    plain = Check(f"package_checker {ruleset}", "FAIL",
                  "only the RCP check failed" if rcp_only else "; ".join(errors[:3]) or out.strip()[-300:], log)
    if not rcp_only:
        return plain, None, False
    log_b = os.path.join(logs_dir, "package_checker.rcp_bypass.log")
    rc, out = _tool(base + ["--rcp-bypass", "--log_output",
                            os.path.join(logs_dir, "package_checker.rcp_bypass.detail.log")], log_b)
    ok = PACKAGE_SUCCESS in out
    bypass = Check(f"package_checker {ruleset} --rcp-bypass", "PASS" if ok else "FAIL",
                   (PACKAGE_SUCCESS + " (RCP failure bypassed; a real submission needs the submission "
                    "committee's review of that)") if ok else "; ".join(_error_lines(out)[:3]), log_b)
    return plain, bypass, ok


def run_system_desc_checker(path: str, ruleset: str, logs_dir: str) -> Check:
    log = os.path.join(logs_dir, "system_desc_checker.log")
    rc, out = _tool(["mlperf_logging.system_desc_checker", path, "training", ruleset, "--log_output",
                     os.path.join(logs_dir, "system_desc_checker.detail.log")], log)
    ok = "System description checker passed" in out
    detail = next((ln.split(" - ", 1)[-1].strip() for ln in out.splitlines() if "checker" in ln.lower()
                   and ("passed" in ln or "failed" in ln)), out.strip()[-300:])
    return Check("system_desc_checker", "PASS" if ok else "FAIL", detail, log)


def run_rcp_checker(bench_dir: str, benchmark: str, ruleset: str, logs_dir: str) -> Check:
    if not rules.has_rcp(benchmark, ruleset):
        return Check("rcp_checker", "n/a", f"MLPerf has no reference convergence points for {benchmark} under "
                     f"ruleset {ruleset}")
    log = os.path.join(logs_dir, "rcp_checker.log")
    rc, out = _tool(["mlperf_logging.rcp_checker", bench_dir, "--rcp_usage", "training", "--rcp_version",
                     ruleset, "--log_output", os.path.join(logs_dir, "rcp_checker.detail.log")], log)
    verdict_line = next((ln.split(" - ", 1)[-1].strip() for ln in out.splitlines() if "RCP test" in ln), "")
    verdict_line = verdict_line.split(", consider adding")[0]
    mean = re.search(r"Submission mean epochs: ([\d.]+)", out)
    record = re.search(r"RCP Record: (\{.*\})", out)
    detail = verdict_line or out.strip()[-300:]
    if mean and record:
        rcp_mean = re.search(r"'RCP Mean': (?:np\.float64\()?([\d.]+)", record.group(1))
        speedup = re.search(r"'Max Speedup': (?:np\.float64\()?([\d.]+)", record.group(1))
        bs = re.search(r"'BS': (\d+)", record.group(1))
        if rcp_mean and speedup:
            floor = float(rcp_mean.group(1)) / float(speedup.group(1))
            detail += (f"; runs converged in {float(mean.group(1)):.2f} epochs (olympic mean) vs the reference "
                       f"{float(rcp_mean.group(1)):.2f} at batch {bs.group(1) if bs else '?'} "
                       f"(fastest allowed {floor:.2f})")
    if rc != 0:
        detail += f". Not fatal here: {SMOKE_RCP_NOTE}"
    return Check("rcp_checker", "PASS" if rc == 0 else "FAIL", detail, log)


def run_result_summarizer(org_dir: str, benchmark: str, ruleset: str, logs_dir: str) -> tuple[Check, float | None]:
    """On a scratch copy: the summarizer's own RCP pass may write scaling files into the results."""
    log = os.path.join(logs_dir, "result_summarizer.log")
    csv_path = os.path.join(logs_dir, "result_summary.csv")
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, os.path.basename(org_dir))
        shutil.copytree(org_dir, copy)
        rc, out = _tool(["mlperf_logging.result_summarizer", copy, "training", ruleset, "--csv", csv_path], log)
    if rc != 0:
        last = out.strip().splitlines()[-1][:300] if out.strip() else ""
        return Check("result_summarizer", "error", f"exit {rc}: {last}", log), None
    score = _summarizer_score(csv_path, benchmark)
    note = (f"{benchmark} score {score:.4f} min" if score is not None
            else f"no {benchmark} score in its table (ruleset {ruleset} has none)")
    return Check("result_summarizer", "ran", note + "; table in checker_logs/result_summary.csv", log), score


def _summarizer_score(csv_path: str, benchmark: str) -> float | None:
    try:
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    for row in rows:
        try:
            return float(row.get(benchmark) or "")
        except ValueError:
            continue
    return None


# ------------------------------------------------------------------------------------------ main

def _print_table(checks: list[Check]) -> None:
    width = max(len(c.name) for c in checks)
    print(f"{'check'.ljust(width)}  {'verdict':<8}  detail")
    print(f"{'-' * width}  {'-' * 8}  {'-' * 40}")
    for c in checks:
        print(f"{c.name.ljust(width)}  {c.verdict:<8}  {c.detail}")


INCOMPLETE = "PACKAGE_INCOMPLETE.txt"


def main(inputs: list[str], out_dir: str, system: str | None = None, system_fields: list[str] | None = None,
         implementation: str = "tf2-mlperf-harness") -> int:
    """Packages one result set; 0 when the package checker accepts the tree, 1 when it does not."""
    overrides = parse_system_fields(list(system_fields or []))
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise HarnessError(f"--out {out_dir} exists and is not empty; choose a new directory (the checkers "
                           f"read everything under it)")
    logs, notes = find_logs(inputs)
    for note in notes:
        print(f"note: {note}")
    runs = [load_run(log) for log in logs]
    benchmark, ruleset = check_runs(runs, system)
    org = _safe_name(runs[0].summary.org or "", "submission_org")
    system = _safe_name(system or runs[0].summary.platform or "", "system name")
    impl = _safe_name(implementation, "--implementation")
    print(f"packaging {len(runs)} {benchmark} run(s) for {org}/{system} under ruleset {ruleset}; "
          f"running the official compliance checker on each log ...", flush=True)
    verdicts = check_compliance(runs, ruleset)

    os.makedirs(out_dir, exist_ok=True)
    # Until package_report.json is written the tree is not a finished package: a run stopped halfway (a
    # signal, a failed checker) leaves this file saying so beside the tree (outside <org>: the checkers
    # never see it)
    incomplete = os.path.join(out_dir, INCOMPLETE)
    with open(incomplete, "w") as f:
        f.write("packaging did not finish: this tree is incomplete (no package_report.json); package again into "
                "a new --out\n")
    logs_dir = os.path.join(out_dir, "checker_logs")
    os.makedirs(logs_dir, exist_ok=True)
    desc, unknown = system_description(runs, system, ruleset, overrides, out_dir)
    mapping = write_tree(runs, out_dir, org, system, benchmark, impl, ruleset, desc)
    org_dir = os.path.abspath(os.path.join(out_dir, org))
    bench_dir = os.path.join(org_dir, "results", system, benchmark)
    print(f"wrote {org_dir}; running the official checkers ...", flush=True)

    n_pass = sum(v.passed for v in verdicts)
    checks = [Check(f"compliance_checker {ruleset} (per log)", "PASS" if n_pass == len(verdicts) else "FAIL",
                    f"{n_pass}/{len(verdicts)} logs pass" + ("" if n_pass == len(verdicts) else
                    "; one run missed the quality target (olympic scoring counts it as the slowest)"))]
    plain, bypass, accepted = run_package_checker(org_dir, ruleset, logs_dir)
    checks.append(plain)
    if bypass:
        checks.append(bypass)
    checks.append(run_system_desc_checker(os.path.join(org_dir, "systems", f"{system}.json"), ruleset, logs_dir))
    checks.append(run_rcp_checker(bench_dir, benchmark, ruleset, logs_dir))
    summarizer, official_score = run_result_summarizer(org_dir, benchmark, ruleset, logs_dir)
    checks.append(summarizer)
    score = scoring.olympic_score([r.summary for r in runs], benchmark=benchmark)
    score_text = (f"{score.score_min:.4f} min (mean of {len(score.used)}, fastest and slowest dropped)"
                  if score.score_min is not None else f"none: {score.reason}")
    if score.score_min is not None and official_score is not None:
        agree = abs(score.score_min - official_score) <= 1e-3 * max(official_score, 1e-9)
        score_text += "; agrees with result_summarizer" if agree else (
            f"; result_summarizer says {official_score:.4f} min (it scales scores by RCP normalization)")
    checks.append(Check("olympic score (harness)", "ran", score_text))

    print()
    _print_table(checks)
    if unknown:
        print(f"note: system fields not detected (set them with --system_field key=value): {', '.join(unknown)}")
    verdict = ("ACCEPTED by the official package checker" + (" with --rcp-bypass (RCP failed)" if bypass else "")
               if accepted else "REJECTED by the official package checker")
    print(f"\npackage {verdict}: {org_dir}")

    report = {
        "accepted": accepted, "verdict": verdict, "benchmark": benchmark, "ruleset": ruleset, "org": org,
        "system": system, "implementation": impl, "tree": org_dir,
        "results": {os.path.relpath(k, out_dir): v for k, v in mapping.items()},
        "seeds": sorted(_seed(r) for r in runs),
        "global_batch_size": runs[0].summary.global_batch_size,
        "checks": [dataclasses.asdict(c) for c in checks],
        "rcp_passed": next(c.verdict == "PASS" for c in checks if c.name == "rcp_checker"),
        "olympic_score_min": score.score_min, "result_summarizer_score_min": official_score,
        "system_fields_unknown": unknown, "notes": notes,
    }
    with open(os.path.join(out_dir, "package_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"report: {os.path.join(out_dir, 'package_report.json')}")
    os.remove(incomplete)
    return 0 if accepted else 1
