"""`mlperf-harness check`: the official compliance checker plus the harness's integrity checks, on any log."""
from __future__ import annotations

import math

from harness import benchmark_rules as rules
from harness.review import integrity, logparse
from harness.errors import HarnessError
from harness.mlperf import require_ruleset, run_compliance_checker


DEFAULTED = "the benchmark's newest for this log"


def rulesets_for(path: str, events: list[logparse.LogEvent], given: list[str]) -> tuple[str | None, list[str], str]:
    """(benchmark, rulesets to check, where they came from); HarnessError for a benchmark no ruleset knows
    or a ruleset that does not accept it (the checker would only fail with a traceback)."""
    benchmark = next((str(e.value) for e in events if e.key == "submission_benchmark"), None)
    division = next((str(e.value) for e in events if e.key == "submission_division"), None)
    if rules.get(benchmark) is None:
        raise HarnessError(f"{path}: {'no submission_benchmark' if benchmark is None else repr(benchmark)}: "
                           f"not an MLPerf training benchmark (known: {', '.join(rules.names())})")
    if given:
        chosen, origin = list(given), "given"
    else:
        run_files = logparse.read_run_files(path)
        ran = logparse.run_benchmark(run_files)
        if ran is not None and ran != benchmark:
            raise HarnessError(f"{path}: the log is {benchmark} but the summary.json beside it is of a {ran} run; "
                               f"name the ruleset with --ruleset")
        chosen = logparse.run_rulesets(run_files)
        origin = "the run's, from summary.json / config.yaml"
        if not chosen:
            chosen = [logparse.log_ruleset(path, events, run_files)]
            origin = DEFAULTED
    for r in chosen:
        require_ruleset(r)
        try:
            rules.check_accepts(benchmark, r, division if division in ("closed", "open") else None)
        except HarnessError as e:
            raise HarnessError(f"{path}: {e}") from None
    return benchmark, chosen, origin


def main(paths: list[str], rulesets: list[str], eval_every: float | None) -> int:
    """Exit 0 when every log passes every check, 1 otherwise."""
    if not paths:
        raise HarnessError("no logs given")
    if eval_every is not None and not (math.isfinite(eval_every) and eval_every > 0):
        raise HarnessError(f"--eval_every {eval_every:g}: give the expected eval cadence as a positive number of "
                           f"epochs or samples (leave it out to infer it from the log)")
    for r in rulesets:
        require_ruleset(r)
    ok = True
    for path in paths:
        bad: list[logparse.BadLine] = []
        events = logparse.parse_log(path, bad)
        benchmark, chosen, origin = rulesets_for(path, events, rulesets)
        print(f"{path} (benchmark {benchmark}; ruleset {', '.join(chosen)}: {origin})")
        for r in chosen:
            v = run_compliance_checker(path, r)
            print(f"  official compliance checker, ruleset {r}: {v.label}")
            for e in v.errors[:10]:
                print(f"      {e}")
            model = next((v for v in rules.record(benchmark).variants if r in v.rulesets), None)
            others = [x for x in model.rulesets if x != r] if model else []
            if not v.passed and origin == DEFAULTED and others:
                print(f"      (no ruleset named by the run; the benchmark is also in {', '.join(others)}: "
                      f"--ruleset picks one)")
            ok = ok and v.passed
        findings = integrity.check_integrity(events, eval_every=eval_every, bad_lines=bad)
        for r in chosen:  # each ruleset's eval schedule and status target (closed targets differ by ruleset)
            findings += integrity.check_eval_schedule(events, r)
            findings += [f for f in integrity.check_status(events, integrity.status_target(events, r))
                         if f not in findings]
        errors = [f for f in findings if f.severity == "error"]
        print(f"  integrity checks: {'PASS' if not errors else 'FAIL'}")
        for f in findings:
            print(f"      {f.severity}: [{f.code}] {f.message}")
        ok = ok and not errors
    return 0 if ok else 1
