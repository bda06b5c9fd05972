"""`mlperf-harness campaign`: N runs of one config with distinct seeds, one fresh process and log each.

Each run is its own `python -m harness run` subprocess because TensorFlow's device setup (logical
devices, strategies, TPU connections) is fixed once per process. The campaign directory is the unit of
resumption: a run counts as finished when its summary.json exists, whatever its status (redoing a
failed run would be cherry-picking seeds). A run directory without summary.json holds an incomplete
log; it is left as evidence and the run is redone under a fresh run_id, never appended to (mllog
appends).

Layout: <campaign_dir>/campaign.json, <campaign_dir>/<workload>/<run_id>/ (written by `harness run`),
<campaign_dir>/console/<run_id>.log (each run's stdout and stderr).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

from absl import logging

from harness import benchmark_rules as rules
from harness import config as config_lib
from harness.review import logparse, scoring
from harness.errors import HarnessError, check_output_dir

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAMPAIGN_FILE = "campaign.json"
EXIT_BAD_INPUT = 2
# Keys the campaign sets itself for every run.
RESERVED_OVERRIDES = ("seed", "run_id", "output_dir")


@dataclasses.dataclass
class RunRecord:
    index: int
    seed: int
    run_id: str
    run_dir: str
    status: str  # success | aborted | ... (from summary.json), or crashed / pending / bad_input / interrupted
    exit_code: int | None = None
    compliant: bool | None = None
    time_to_train_min: float | None = None
    attempts: list[str] = dataclasses.field(default_factory=list)  # earlier incomplete run_ids


def _raw_config(config_path: str, overrides: list[str]) -> dict:
    """The merged YAML (no TensorFlow import: the runs validate it strictly in their own processes)."""
    data = config_lib.apply_overrides(config_lib.read_yaml_with_bases(config_path), list(overrides))
    if not isinstance(data.get("workload"), str):
        raise HarnessError(f"config {config_path}: 'workload' must name a workload")
    return data


def _check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in RESERVED_OVERRIDES:
            raise HarnessError(f"campaign sets {key} for each run itself; drop --set {item} "
                               f"(use --first_seed / --campaign_dir instead)")


def default_runs(workload: str) -> int:
    """The benchmark's MLPerf result count (workload names are their MLPerf keys)."""
    n = rules.runs_required(workload)
    if n is None:
        raise HarnessError(f"no MLPerf run count known for workload {workload!r}; pass --runs N")
    return n


def _load_campaign(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise HarnessError(f"cannot read {path}: {e}; fix or remove it, or use another --campaign_dir")


def _attempts(workload_dir: str, index: int, seed: int) -> list[str]:
    """Existing run directories for run `index` (first attempt and retries), oldest first."""
    if not os.path.isdir(workload_dir):
        return []
    pattern = re.compile(rf"^run_{index}_seed{seed}(_attempt(\d+))?$")
    found = []
    for name in os.listdir(workload_dir):
        m = pattern.match(name)
        if m and os.path.isdir(os.path.join(workload_dir, name)):
            found.append((int(m.group(2) or 1), name))
    return [name for _, name in sorted(found)]


def _read_summary(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        logging.warning("unreadable %s (%s): treating the run as incomplete", path, e)
        return None


def _record_from_summary(rec: RunRecord, summary: dict) -> None:
    if summary.get("seed") != rec.seed:
        raise HarnessError(f"{rec.run_dir}/summary.json records seed {summary.get('seed')}, but the "
                           f"campaign expects seed {rec.seed} for run {rec.index}")
    rec.status = str(summary.get("status"))
    rec.compliant = summary.get("compliant")
    rec.time_to_train_min = summary.get("time_to_train_min")


def _write_campaign(path: str, state: dict[str, Any], records: list[RunRecord]) -> None:
    state = dict(state, runs=[dataclasses.asdict(r) for r in records],
                 updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, path)


def _last_error_line(console_path: str) -> str:
    try:
        with open(console_path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "(no output)"
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


def _run_one(config_path: str, overrides: list[str], rec: RunRecord, campaign_dir: str,
             console_path: str) -> int:
    cmd = [sys.executable, "-m", "harness", "run", config_path]
    for item in overrides:
        cmd += ["--set", item]
    cmd += ["--set", f"seed={rec.seed}", "--set", f"run_id={rec.run_id}", "--output_dir", campaign_dir]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    logging.info("campaign run %d: %s", rec.index, " ".join(cmd))
    # Appended to: a retry under the same run_id (one that never made its directory) keeps the earlier output.
    with open(console_path, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        return wait_passing_interrupts(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                        preexec_fn=end_with_parent))


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent() -> None:
    """In the forked run, before it starts: SIGTERM to it when the campaign dies, even by SIGKILL (which the
    campaign cannot pass on), so no run trains on unwatched; it then ends its log as stopped by SIGTERM.
    Linux's prctl(PR_SET_PDEATHSIG); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def wait_passing_interrupts(proc: subprocess.Popen, grace_s: float = 8.0) -> int:
    """`proc.wait()`; a signal that stops the campaign (SIGINT, SIGTERM, SIGHUP: raised as KeyboardInterrupt
    by the CLI, harness/train/interrupt.py) is passed on to the run, which then ends its own log as
    interrupted, and the run is waited for up to `grace_s` (inside the campaign's own 10 s) before the
    interrupt goes on. (subprocess.run would SIGKILL it, leaving a log that does not say it was stopped.)"""
    try:
        return proc.wait()
    except KeyboardInterrupt as e:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(getattr(e, "signum", signal.SIGINT))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        raise


def _print_run(rec: RunRecord, n: int, note: str = "") -> None:
    ttt = f"{rec.time_to_train_min:.4f} min" if rec.time_to_train_min is not None else "-"
    comp = {True: "compliant", False: "NON-COMPLIANT", None: "-"}[rec.compliant]
    print(f"run {rec.index + 1}/{n} seed {rec.seed}: {rec.status:<9} {ttt:>14}  {comp:<13} "
          f"{rec.run_dir}{note}", flush=True)


def main(config_path: str, overrides: list[str], runs: int = 0, campaign_dir: str | None = None,
         first_seed: int = 1) -> int:
    """Runs (or continues) a campaign; 0 when every run succeeded with a compliant log, else 1."""
    overrides = list(overrides or [])
    _check_overrides(overrides)
    config_path = os.path.abspath(config_path)
    data = _raw_config(config_path, overrides)
    workload = data["workload"]
    if runs < 0:
        raise HarnessError(f"--runs must be positive, got {runs}")
    n = runs or default_runs(workload)
    if first_seed < 0:
        raise HarnessError(f"--first_seed must be >= 0, got {first_seed}")
    named = "--campaign_dir" if campaign_dir else "campaign directory"
    if not campaign_dir:
        stem = os.path.splitext(os.path.basename(config_path))[0]
        campaign_dir = os.path.join(str(data.get("output_dir") or "logs"), workload, f"campaign-{stem}")
    campaign_dir = check_output_dir(campaign_dir, named)
    os.makedirs(os.path.join(campaign_dir, "console"), exist_ok=True)
    state_path = os.path.join(campaign_dir, CAMPAIGN_FILE)

    previous = _load_campaign(state_path)
    if previous is not None:
        if previous.get("config") != config_path or previous.get("overrides") != overrides:
            raise HarnessError(
                f"{campaign_dir} holds a campaign of {previous.get('config')} with overrides "
                f"{previous.get('overrides')}; this call gives {config_path} with {overrides}. Runs of one "
                f"campaign must share a config: use another --campaign_dir")
        if previous.get("first_seed") != first_seed:
            print(f"note: continuing with the campaign's first seed {previous.get('first_seed')} "
                  f"(not {first_seed})")
            first_seed = int(previous["first_seed"])
    seeds = [first_seed + i for i in range(n)]
    state = {"config": config_path, "overrides": overrides, "workload": workload, "first_seed": first_seed,
             "n_runs": n, "seeds": seeds, "campaign_dir": campaign_dir,
             "started": (previous or {}).get("started", time.strftime("%Y-%m-%dT%H:%M:%S"))}

    workload_dir = os.path.join(campaign_dir, workload)
    records: list[RunRecord] = []
    for i, seed in enumerate(seeds):
        attempts = _attempts(workload_dir, i, seed)
        rec = RunRecord(index=i, seed=seed, run_id="", run_dir="", status="pending")
        for name in attempts:
            summary = _read_summary(os.path.join(workload_dir, name))
            if summary is not None:
                rec.run_id, rec.run_dir = name, os.path.join(workload_dir, name)
                _record_from_summary(rec, summary)
                break
        else:
            rec.attempts = attempts
            rec.run_id = f"run_{i}_seed{seed}" + (f"_attempt{len(attempts) + 1}" if attempts else "")
            rec.run_dir = os.path.join(workload_dir, rec.run_id)
        records.append(rec)

    done = sum(r.status != "pending" for r in records)
    print(f"campaign {campaign_dir}: {n} run(s) of {os.path.relpath(config_path)}, seeds {seeds[0]}..{seeds[-1]}"
          + (f"; {done} already finished, continuing" if done else ""), flush=True)
    _write_campaign(state_path, state, records)

    for rec in records:
        if rec.status != "pending":
            _print_run(rec, n, "  (finished earlier)")
            continue
        if rec.attempts:
            print(f"run {rec.index + 1}/{n} seed {rec.seed}: {', '.join(rec.attempts)} left an incomplete "
                  f"log; redoing as {rec.run_id}", flush=True)
        console = os.path.join(campaign_dir, "console", f"{rec.run_id}.log")
        try:
            rec.exit_code = _run_one(config_path, overrides, rec, campaign_dir, console)
        except KeyboardInterrupt:
            rec.status = "interrupted"  # its directory, if any, is redone under a fresh run_id on resume
            _write_campaign(state_path, state, records)
            raise
        summary = _read_summary(rec.run_dir)
        if summary is not None:
            _record_from_summary(rec, summary)
        elif rec.exit_code == EXIT_BAD_INPUT:
            rec.status = "bad_input"
        else:
            rec.status = "crashed"
        _write_campaign(state_path, state, records)
        _print_run(rec, n, "" if summary is not None else f"  (exit {rec.exit_code}; see {console})")
        if rec.exit_code == EXIT_BAD_INPUT and summary is None:
            raise HarnessError(f"campaign stopped: run {rec.index + 1} (seed {rec.seed}) rejected its input: "
                               f"{_last_error_line(console).removeprefix('error: ')} (full output: {console})")

    print_score(records, workload)
    ok = all(r.status == "success" and r.compliant for r in records)
    return 0 if ok else 1


def print_score(records: list[RunRecord], workload: str) -> None:
    """The harness's own olympic score over the campaign's finished runs (from their MLPerf logs)."""
    summaries = []
    for rec in records:
        # The log beside summary.json, not summary["log"]: run directories may have been moved.
        log = os.path.join(rec.run_dir, f"result_{rec.seed}.txt")
        if rec.status not in ("pending", "crashed", "bad_input") and os.path.exists(log):
            summaries.append(logparse.summarize(logparse.parse_log(log), log))
        elif rec.status == "crashed":
            # A crashed run is a failed run for olympic scoring (it counts as the slowest).
            crashed = logparse.RunSummary(path=rec.run_dir, benchmark=workload)
            crashed.status = "crashed"
            summaries.append(crashed)
    score = scoring.olympic_score(summaries, benchmark=workload)
    if score.score_min is None:
        print(f"olympic score (harness): none: {score.reason}")
    else:
        print(f"olympic score (harness): {score.score_min:.4f} min over {len(score.used)} run(s); dropped "
              + ", ".join(f"{os.path.basename(os.path.dirname(r.path))} ({why})" for r, why in score.dropped))
    if score.note:
        print(f"note: {score.note}")
