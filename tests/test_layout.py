"""The package layout holds: each harness/ group imports only what its __init__ docstring allows, the top
level stays small, and no workload branches on the runtime's kind (the workload contract)."""
from __future__ import annotations

import ast
import re

from pathlib import Path

from conftest import REPO as _REPO

REPO = Path(_REPO)

HARNESS = REPO / "harness"
# group -> groups it may import (the root: config, errors, mlperf, sysinfo, runtime, is always allowed)
ALLOWED = {"nn": set(), "review": set(), "train": {"nn", "review"}, "submission": {"review"},
           "plan": {"review", "train"}}
ROOT_MODULES = {"__init__", "__main__", "cli", "config", "errors", "mlperf", "platforms", "sysinfo", "runtime",
                "benchmark_rules"}


def imported_harness_modules(path) -> set[str]:
    """Dotted harness modules a file imports (at any depth: lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("harness")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def group_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def test_groups_import_only_what_they_may():
    bad = []
    for group, allowed in ALLOWED.items():
        for path in sorted((HARNESS / group).glob("*.py")):
            for mod in imported_harness_modules(path):
                target = group_of(mod)
                if target and target != group and target not in allowed:
                    bad.append(f"{path.relative_to(REPO)} imports {mod}")
    for path in sorted((HARNESS / "runtime").glob("*.py")):
        bad += [f"{path.relative_to(REPO)} imports {m}" for m in imported_harness_modules(path) if group_of(m)]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_top_level_is_small_and_the_groups_are_documented():
    top = {p.stem for p in HARNESS.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top - set(ALLOWED) <= ROOT_MODULES, top - set(ALLOWED) - ROOT_MODULES
    assert len([m for m in top if m not in ALLOWED and m != "__init__"]) <= 9
    for group in ALLOWED:
        doc = ast.get_docstring(ast.parse((HARNESS / group / "__init__.py").read_text()))
        assert doc and "import" in doc, f"harness/{group}/__init__.py must say what it holds and may import"


def test_no_workload_branches_on_the_runtime_kind():
    pattern = re.compile(r"runtime\.kind|\.kind\s*==")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "benchmarks").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
