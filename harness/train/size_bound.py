"""Checker rules that bind a run's size, for benchmarks whose checker no small run can pass in either division
(deepseekv3_671b's binds the global batch, the row length and the eval rows, open division included).

Such a benchmark's record (harness/benchmark_rules.py, `size_bound`) names those keys and the smallest values
its checker accepts. A run whose log fails the official checker is then checked once more on a copy of its
log with those keys' values set to the named ones: when that copy passes, the run failed on size-bound rules
only, and the harness says so. It stays non-compliant (the exit code and summary.json's `compliant` do not
change): the copy is a diagnosis, never a result.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any

from harness.mlperf import run_compliance_checker

_LINE = re.compile(r"^(.*?:::MLLOG )(\{.*\})\s*$")


def resized_log(path: str, values: dict[str, Any], out: str) -> int:
    """Writes `path` to `out` with the values of the events keyed in `values` replaced; returns how many."""
    changed = 0
    with open(path) as src, open(out, "w") as dst:
        for line in src:
            m = _LINE.match(line)
            if m:
                event = json.loads(m.group(2))
                if event.get("key") in values:
                    event["value"] = values[event["key"]]
                    line = m.group(1) + json.dumps(event) + "\n"
                    changed += 1
            dst.write(line)
    return changed


def logged_values(path: str, keys: Any) -> dict[str, Any]:
    """The first logged value of each of `keys` in the log at `path`."""
    found: dict[str, Any] = {}
    with open(path) as f:
        for line in f:
            m = _LINE.match(line)
            if m:
                event = json.loads(m.group(2))
                if event.get("key") in keys and event["key"] not in found:
                    found[event["key"]] = event.get("value")
    return found


def breaks(key: str, logged: Any, bound: Any) -> bool:
    """Whether a logged value misses its size bound: the global batch below it, the others unequal."""
    if key == "global_batch_size":
        return not isinstance(logged, (int, float)) or logged < bound
    return logged != bound


def diagnose(path: str, rulesets: list[str], values: dict[str, Any]) -> dict[str, Any] | None:
    """{"keys": the size-bound keys the log misses and the values tried, "rest_pass": {ruleset: the copy
    passes}}; None when the log meets every size bound (its failure is not about size)."""
    logged = logged_values(path, values)
    missed = {k: v for k, v in values.items() if breaks(k, logged.get(k), v)}
    if not missed:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        resized_log(path, missed, copy)
        passes = {r: run_compliance_checker(copy, r).passed for r in rulesets}
    return {"keys": missed, "rest_pass": passes}


def describe(result: dict[str, Any]) -> str:
    keys = ", ".join(f"{k} >= {v}" if k == "global_batch_size" else f"{k} = {v}" for k, v in result["keys"].items())
    ok = [r for r, p in result["rest_pass"].items() if p]
    bad = [r for r, p in result["rest_pass"].items() if not p]
    line = f"size-bound checker rules (no run of this size can pass them): {keys}; "
    if not bad:
        return line + f"with those values the rest of the log passes ruleset(s) {', '.join(ok)} (not a compliance pass)"
    return line + f"the log fails other rules too under ruleset(s) {', '.join(bad)}"
