"""`weights_initialization`: the tensor names a ruleset requires, read from the installed official checker.

Closed rulesets 1.1.0-2.1.0 end with a check that the `tensor` metadata of all `weights_initialization`
events equals one fixed list: the reference model's tensor names. The list lives only in the checker's
yaml rules, so the harness reads it from the installed mlperf-logging package instead of copying it: a
checker upgrade cannot silently drift from what the harness logs. A workload maps those names to its
own variable paths (`Workload.weights_initialization_map`); a name the map cannot fill is refused before
the log is opened, never found by the checker after the run.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
from typing import Any, Iterable

import yaml

from harness.errors import HarnessError

KEY = "weights_initialization"
METADATA_FIELD = "tensor"  # the checker tests "'tensor' in v['metadata']"
_SHOWN = 6


def checker_dir() -> str:
    """The installed compliance checker's folder (holds training_<ruleset>/<division>_<benchmark>.yaml)."""
    spec = importlib.util.find_spec("mlperf_logging")
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError("mlperf-logging is not installed (pip install -e .)")
    return os.path.join(list(spec.submodule_search_locations)[0], "compliance_checker")


@functools.lru_cache(maxsize=None)
def required_tensors(benchmark: str, ruleset: str, division: str) -> tuple[str, ...] | None:
    """The tensor names the checker requires, sorted; None when the ruleset does not check the key."""
    path = os.path.join(checker_dir(), f"training_{ruleset}", f"{division}_{benchmark}.yaml")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rules = yaml.safe_load(f) or []
    key_rules = [r["KEY"] for r in rules if isinstance(r, dict) and "KEY" in r]
    rule = next((k for k in key_rules if k.get("NAME") == KEY), None)
    if rule is None:
        return None
    checks = rule.get("CHECK") or []
    if METADATA_FIELD not in " ".join(checks if isinstance(checks, list) else [checks]):
        raise HarnessError(f"{path}: the installed checker's {KEY} rule does not ask for "
                           f"'{METADATA_FIELD}' metadata; this harness does not know that format")
    end_checks = [r["END"].get("CHECK", "") for r in rules if isinstance(r, dict) and "END" in r]
    names = max((_longest_string_list(c) for c in end_checks), key=len, default=[])
    if not names:
        raise HarnessError(f"{path}: cannot read the {KEY} tensor names from the checker's END rule")
    return tuple(sorted(names))


def _longest_string_list(expression: str) -> list[str]:
    """The longest list literal of strings in a checker expression (the required names)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return []
    lists = [[e.value for e in node.elts] for node in ast.walk(tree)
             if isinstance(node, ast.List) and node.elts
             and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)]
    return max(lists, key=len, default=[])


def required_for_run(benchmark: str, rulesets: Iterable[str], division: str) -> tuple[list[str], list[str]]:
    """(tensor names, rulesets asking for them) for one log checked against all `rulesets`.

    One log serves every checked ruleset, so the lists of those that ask must agree (they do for ResNet
    and BERT 1.1.0-2.1.0); rulesets that do not know the key ignore the events.
    """
    asked = {r: names for r in rulesets if (names := required_tensors(benchmark, r, division)) is not None}
    if len(set(asked.values())) > 1:
        raise HarnessError(f"rulesets {', '.join(asked)} require different {KEY} tensor lists for "
                           f"{benchmark}; check them in separate runs (ruleset / check_rulesets)")
    names = next(iter(asked.values()), ())
    return list(names), list(asked)


def plan(workload: Any, rulesets: Iterable[str], division: str) -> dict[str, str]:
    """MLPerf tensor name -> variable path for every required name, or HarnessError naming the missing.

    Runs before the log is opened, from the config alone (the model is not built yet).
    """
    names, asking = required_for_run(workload.MLPERF_KEY, rulesets, division)
    if not names:
        return {}
    mapping = workload.weights_initialization_map()
    missing = [n for n in names if n not in mapping]
    if missing:
        shown = ", ".join(missing[:_SHOWN]) + (f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN
                                               else "")
        who = f"rulesets {', '.join(asking)} require" if len(asking) > 1 else f"ruleset {asking[0]} requires"
        raise HarnessError(
            f"{who} a {KEY} event for each of the {len(names)} tensors of "
            f"the reference {workload.MLPERF_KEY} model, but this {workload.NAME} model cannot name "
            f"{len(missing)} of them ({shown}); use the reference architecture or another ruleset")
    return {n: mapping[n] for n in names}


def log_events(log: Any, tensors: dict[str, str]) -> None:
    """One `weights_initialization` event per required tensor (call before init_stop)."""
    for name in tensors:
        log.event(KEY, metadata={METADATA_FIELD: name})
