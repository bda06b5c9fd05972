"""`mlperf-harness check`: the official compliance checker plus the harness's integrity checks, on any log."""
from __future__ import annotations

from harness.review import integrity, logparse
from harness.errors import HarnessError
from harness.mlperf import run_compliance_checker

# The newest ruleset each benchmark has a closed config for (transformer stopped at 0.7.0).
DEFAULT_RULESET = {"resnet": "4.0.0", "bert": "4.0.0", "ssd": "0.7.0", "transformer": "0.7.0"}


def main(paths: list[str], rulesets: list[str], eval_every: float | None) -> int:
    """Exit 0 when every log passes every check, 1 otherwise."""
    ok = True
    for path in paths:
        events = logparse.parse_log(path)
        benchmark = next((e.value for e in events if e.key == "submission_benchmark"), None)
        chosen = rulesets or [DEFAULT_RULESET.get(str(benchmark), "4.0.0")]
        print(f"{path} (benchmark {benchmark})")
        for r in chosen:
            v = run_compliance_checker(path, r)
            print(f"  official compliance checker, ruleset {r}: {v.label}")
            for e in v.errors[:10]:
                print(f"      {e}")
            ok = ok and v.passed
        findings = integrity.check_integrity(events, eval_every=eval_every)
        for r in chosen:  # each ruleset's eval schedule (closed ResNet / BERT logs)
            findings += integrity.check_eval_schedule(events, r)
        errors = [f for f in findings if f.severity == "error"]
        print(f"  integrity checks: {'PASS' if not errors else 'FAIL'}")
        for f in findings:
            print(f"      {f.severity}: [{f.code}] {f.message}")
        ok = ok and not errors
    if not paths:
        raise HarnessError("no logs given")
    return 0 if ok else 1
