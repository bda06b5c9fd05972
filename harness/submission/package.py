"""`mlperf-harness package`: one result set laid out as an MLPerf training submission tree, judged by the
official tools.

Steps, each refusing in one line (HarnessError, exit 2) what no reviewer should be handed:
  1. the runs (runs.py): one campaign directory (every run it launched, in launch order) or run directories /
     logs; synthetic data and mixed benchmarks are refused;
  2. the window (window.py): from M >= N launched runs, the N consecutive runs the scoring rules submit;
     a hand-picked subset of a campaign is refused;
  3. the round (runs.py `package_ruleset`): `--ruleset`, required unless the runs' own is the newest round;
     the round's rules refuse what they refuse (benchmark and division, compliance checker per log);
  4. the tree (tree.py, systemdesc.py): results, the training nodes' system description, and the
     implementation: the harness's source at the runs' commit, pinned requirements, config, run_and_time.sh;
  5. the official tools (official.py): package, system description, RCP checkers and result summarizer.
Exit 0 only when every official check passed; an RCP bypass passes only when asked for (`--rcp_bypass`).
The window chosen and why is kept in <out>/package_report.json and the implementation's README.
"""
from __future__ import annotations

import dataclasses
import json
import os

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.review import scoring
from harness.submission import official, systemdesc, tree, window
from harness.submission.official import Check
from harness.submission.runs import benchmark_of, check_compliance, check_runs, find_runs


def _print_table(checks: list[Check]) -> None:
    width = max(len(c.name) for c in checks)
    print(f"{'check'.ljust(width)}  {'verdict':<8}  detail")
    print(f"{'-' * width}  {'-' * 8}  {'-' * 40}")
    for c in checks:
        print(f"{c.name.ljust(width)}  {c.verdict:<8}  {c.detail}")


INCOMPLETE = "PACKAGE_INCOMPLETE.txt"


def _score_check(runs: list, benchmark: str, official_score: float | None) -> Check:
    score = scoring.olympic_score([r.summary for r in runs], benchmark=benchmark)
    text = (f"{score.score_min:.4f} min (mean of {len(score.used)}, fastest and slowest dropped)"
            if score.score_min is not None else f"none: {score.reason}")
    if score.score_min is not None and official_score is not None:
        agree = abs(score.score_min - official_score) <= 1e-3 * max(official_score, 1e-9)
        text += "; agrees with result_summarizer" if agree else (
            f"; result_summarizer says {official_score:.4f} min (it scales scores by RCP normalization)")
    return Check("olympic score (harness)", "ran", text)


def main(inputs: list[str], out_dir: str, system: str | None = None, system_fields: list[str] | None = None,
         implementation: str = "tf2-mlperf-harness", ruleset: list[str] | None = None,
         rcp_bypass: bool = False) -> int:
    """Packages one result set; 0 when every official check passed, 1 when one did not."""
    overrides = systemdesc.parse_system_fields(list(system_fields or []))
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise HarnessError(f"--out {out_dir} exists and is not empty; choose a new directory (the checkers "
                           f"read everything under it)")
    launched, notes = find_runs(inputs)
    for note in notes:
        print(f"note: {note}")
    logged = [e.run for e in launched if e.run is not None]
    if not logged:
        raise HarnessError(f"refusing to package: none of the {len(launched)} launched run(s) left a result log")
    benchmark = benchmark_of(logged)
    selection = window.select(launched, rules.runs_required(benchmark) or len(launched), benchmark)
    runs = [e.run for e in selection.chosen]
    benchmark, ruleset_ = check_runs(runs, system, list(ruleset or []))
    org = tree.safe_name(runs[0].summary.org or "", "submission_org")
    system = tree.safe_name(system or runs[0].summary.platform or "", "system name")
    impl = tree.safe_name(implementation, "--implementation")
    info = tree.implementation(runs)
    desc, unknown = systemdesc.system_description(runs, system, ruleset_, overrides)
    own = runs[0].ruleset
    print(f"packaging {len(runs)} {benchmark} run(s) for {org}/{system} under ruleset {ruleset_}"
          + (f" (the runs' config names {own})" if own != ruleset_ else "") + f"; {selection.why}", flush=True)
    print("running the official compliance checker on each log ...", flush=True)
    verdicts = check_compliance(runs, ruleset_)

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
    mapping = tree.write_tree(runs, out_dir, org, system, benchmark, impl, ruleset_, desc, info, selection.why)
    org_dir = os.path.abspath(os.path.join(out_dir, org))
    bench_dir = os.path.join(org_dir, "results", system, benchmark)
    print(f"wrote {org_dir}; running the official checkers ...", flush=True)

    n_pass = sum(v.passed for v in verdicts)
    checks = [Check(f"compliance_checker {ruleset_} (per log)", "PASS",
                    f"{n_pass}/{len(verdicts)} logs pass" + ("" if n_pass == len(verdicts) else
                    "; one run missed the quality target (olympic scoring counts it as the slowest)"))]
    plain, bypass = official.run_package_checker(org_dir, ruleset_, logs_dir, rcp_bypass)
    checks += [plain] + ([bypass] if bypass else [])
    checks.append(official.run_system_desc_checker(os.path.join(org_dir, "systems", f"{system}.json"), ruleset_,
                                                   logs_dir))
    checks.append(official.run_rcp_checker(bench_dir, benchmark, ruleset_, runs[0].summary.division, logs_dir,
                                           rcp_bypass))
    summarizer, official_score = official.run_result_summarizer(org_dir, benchmark, ruleset_, logs_dir)
    checks += [summarizer, _score_check(runs, benchmark, official_score)]

    package_ok = plain.ok or (bypass is not None and bypass.verdict == "BYPASSED")
    others_ok = all(c.ok or c.verdict == "BYPASSED" for c in checks if c not in (plain, bypass))
    accepted = package_ok and others_ok
    print()
    _print_table(checks)
    if unknown:
        print(f"note: system fields not recorded on the training node (set them with --system_field key=value): "
              f"{', '.join(unknown)}")
    failed = [c.name for c in checks if not (c.ok or c.verdict == "BYPASSED")]
    if bypass is not None and bypass.verdict == "BYPASSED":
        verdict = "ACCEPTED WITH RCP BYPASS (asked for by --rcp_bypass; RCP failed)" if others_ok else \
            f"REJECTED: {', '.join(failed)} failed"
    else:
        verdict = "ACCEPTED: every official check passed" if accepted else f"REJECTED: {', '.join(failed)} failed"
    print(f"\npackage {verdict}: {org_dir}")

    report = {
        "accepted": accepted, "verdict": verdict, "benchmark": benchmark, "ruleset": ruleset_,
        "runs_ruleset": own, "rcp_bypass_asked": rcp_bypass, "org": org, "system": system,
        "implementation": impl, "tree": org_dir, "harness_commit": info["commit"],
        "harness_dirty": bool(info["changes"]), "selection": selection.record(),
        "results": {os.path.relpath(k, out_dir): v for k, v in mapping.items()},
        "seeds": [r.summary.seed for r in runs], "global_batch_size": runs[0].summary.global_batch_size,
        "checks": [dataclasses.asdict(c) for c in checks],
        "rcp_passed": next(c.verdict == "PASS" for c in checks if c.name == "rcp_checker"),
        "result_summarizer_score_min": official_score,
        "system_fields_unknown": unknown, "notes": notes,
    }
    with open(os.path.join(out_dir, "package_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"report: {os.path.join(out_dir, 'package_report.json')}")
    os.remove(incomplete)
    return 0 if accepted else 1
