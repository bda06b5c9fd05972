"""The official mlperf-logging tools a package is judged by, each run as its own process in a scratch directory
(they write logs into their cwd), their output kept under <out>/checker_logs/.

The package checker includes the RCP check for closed rulesets >= 1.0.0. When RCP is its only complaint the
tree is re-checked with `--rcp-bypass` (the checker's own advice), but a bypass counts as a pass only when the
submitter asked for it (`package --rcp_bypass`), and it is printed as a bypass either way.
"""
from __future__ import annotations

import csv
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile

from absl import logging

from harness import benchmark_rules as rules

PACKAGE_SUCCESS = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS"
SMOKE_RCP_NOTE = ("small smoke runs converge in far fewer epochs than any MLPerf reference convergence "
                  "point (RCP) allows, so they fail the RCP check; real closed-division runs must pass it")


@dataclasses.dataclass
class Check:
    name: str
    verdict: str  # PASS | FAIL | BYPASSED | n/a | ran | error
    detail: str = ""
    log: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict in ("PASS", "n/a", "ran")


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


def run_package_checker(org_dir: str, ruleset: str, logs_dir: str,
                        bypass_asked: bool) -> tuple[Check, Check | None]:
    """The package checker; re-run with --rcp-bypass only when RCP is its sole complaint. The bypass run's
    verdict is BYPASSED (a pass) when `bypass_asked`, else FAIL: an unasked bypass is no acceptance.

    Returns (plain verdict, bypass verdict or None)."""
    base = ["mlperf_logging.package_checker", org_dir, "training", ruleset]
    log = os.path.join(logs_dir, "package_checker.log")
    rc, out = _tool(base + ["--log_output", os.path.join(logs_dir, "package_checker.detail.log")], log)
    errors = _error_lines(out)
    if PACKAGE_SUCCESS in out:
        return Check(f"package_checker {ruleset}", "PASS", PACKAGE_SUCCESS, log), None
    rcp_only = bool(errors) and all("RCP" in e or "FOUND ERRORS" in e for e in errors)
    plain = Check(f"package_checker {ruleset}", "FAIL",
                  "only the RCP check failed" if rcp_only else "; ".join(errors[:3]) or out.strip()[-300:], log)
    if not rcp_only:
        return plain, None
    log_b = os.path.join(logs_dir, "package_checker.rcp_bypass.log")
    rc, out = _tool(base + ["--rcp-bypass", "--log_output",
                            os.path.join(logs_dir, "package_checker.rcp_bypass.detail.log")], log_b)
    if PACKAGE_SUCCESS not in out:
        return plain, Check(f"package_checker {ruleset} --rcp-bypass", "FAIL",
                            "; ".join(_error_lines(out)[:3]), log_b)
    if bypass_asked:
        return plain, Check(f"package_checker {ruleset} --rcp-bypass", "BYPASSED",
                            "passes only with the RCP failure bypassed, as asked by --rcp_bypass; a real "
                            "submission needs the submission committee's review of that", log_b)
    return plain, Check(f"package_checker {ruleset} --rcp-bypass", "FAIL",
                        "would pass only with the RCP failure bypassed, which was not asked for (--rcp_bypass)",
                        log_b)


def run_system_desc_checker(path: str, ruleset: str, logs_dir: str) -> Check:
    log = os.path.join(logs_dir, "system_desc_checker.log")
    rc, out = _tool(["mlperf_logging.system_desc_checker", path, "training", ruleset, "--log_output",
                     os.path.join(logs_dir, "system_desc_checker.detail.log")], log)
    ok = "System description checker passed" in out
    detail = next((ln.split(" - ", 1)[-1].strip() for ln in out.splitlines() if "checker" in ln.lower()
                   and ("passed" in ln or "failed" in ln)), out.strip()[-300:])
    return Check("system_desc_checker", "PASS" if ok else "FAIL", detail, log)


def run_rcp_checker(bench_dir: str, benchmark: str, ruleset: str, division: str | None, logs_dir: str,
                    bypass_asked: bool) -> Check:
    """The RCP checker on the results; n/a for the open division, which the RCP rules do not cover (the
    package checker runs it for closed only), and for benchmarks with no RCPs in the round."""
    if division == "open":
        return Check("rcp_checker", "n/a", "open division: the RCP rules judge closed-division results only")
    if not rules.has_rcp(benchmark, ruleset):
        return Check("rcp_checker", "n/a", f"MLPerf has no reference convergence points for {benchmark} under "
                     f"ruleset {ruleset}")
    unit = "samples" if rules.record(benchmark).unit == rules.SAMPLE else "epochs"
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
            detail += (f"; runs converged in {_amount(float(mean.group(1)), unit)} {unit} (olympic mean) vs the "
                       f"reference {_amount(float(rcp_mean.group(1)), unit)} at batch {bs.group(1) if bs else '?'} "
                       f"(fastest allowed {_amount(floor, unit)})")
    if rc == 0:
        return Check("rcp_checker", "PASS", detail, log)
    if bypass_asked:
        return Check("rcp_checker", "BYPASSED", f"{detail}. Bypassed as asked (--rcp_bypass): {SMOKE_RCP_NOTE}", log)
    return Check("rcp_checker", "FAIL", detail, log)


def _amount(value: float, unit: str) -> str:
    """Samples are counted (the checker's 'epochs' are samples for these benchmarks), epochs have decimals."""
    return f"{value:,.0f}" if unit == "samples" else f"{value:.2f}"


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


