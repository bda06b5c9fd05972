"""The package layout holds: the import rules of docs/ARCHITECTURE.md's "Where to look" (harness groups, the
root, benchmarks/ packages, harness/config.py as the one way from harness/ to a workload, no import cycle), the
top level stays small, each group holds what it says (no other command's code in train/), no module in
harness/ is over 600 lines, and no workload branches on the runtime's kind (the workload contract).

Each rule is a function over {file: modules it imports} so it can be shown to catch a planted violation."""
from __future__ import annotations

import ast
import re

from pathlib import Path

import pytest

from conftest import REPO as _REPO

pytestmark = pytest.mark.quick

REPO = Path(_REPO)

HARNESS = REPO / "harness"
BENCHMARKS = REPO / "benchmarks"
# group -> groups it may import (the root: config, errors, mlperf, sysinfo, runtime, is always allowed)
ALLOWED = {"nn": set(), "review": set(), "data": set(), "export": {"nn"},
           "train": {"nn", "review", "data", "export"}, "dryrun": {"train"}, "submission": {"review"},
           "plan": {"review"}}
# group -> single modules of other groups it may import besides: the run's MFU line is computed in plan's units;
# the data checks and the data service read files and input options as every workload's data source does;
# export reads a config's closed values (reference.lookup) to tell a LoRA run's public base from its own.
ALLOWED_MODULES = {"train": {"harness.plan.mfu"}, "dryrun": {"harness.plan.mfu"},
                   "data": {"harness.train.datafiles", "harness.train.input_pipeline", "harness.train.reference"},
                   "export": {"harness.train.reference"}}
ROOT_MODULES = {"__init__", "__main__", "cli", "config", "errors", "mlperf", "platforms", "sysinfo", "runtime",
                "benchmark_rules"}
# The command line sits above every group: it dispatches each subcommand to its group (lazily).
DISPATCHERS = {"harness/cli.py", "harness/__main__.py"}
# The one edge from harness/ to benchmarks/: load_config resolves a config's workload through the registry (lazily:
# the registry's workloads import harness.config's `field`), and the Config carries the class and cost module.
EDGE = ("harness/config.py", "benchmarks.registry")
# What each group of another command holds (the names its command starts from); harness/train/ holds what one run
# does, so none of these is defined there.
ROOMS = {"dryrun": {"compile_report", "compile_replica", "StandInRuntime", "count_flops", "linear_stand_in",
                    "check_device_memory"},
         "data": {"verify_config", "check_closed_data", "serve_dispatcher", "serve_worker", "distribute_epochs"},
         "export": {"export", "model_variables"}}
MAX_LINES = 600
# Modules over MAX_LINES for now, each with its cap and reason; an allowance no longer needed fails too.
OVER: dict[str, int] = {}  # modules allowed over MAX_LINES for now, with their caps
# benchmarks/ packages built on the shared decoder package benchmarks/lm (a new decoder LLM adds its name).
LM_PACKAGES = {"llama31_8b", "gpt_oss_20b", "llama2_70b_lora", "deepseekv3_671b", "qwen35_397b_grpo"}
LM = "lm"


def imported_modules(path: Path) -> set[str]:
    """Dotted harness/benchmarks modules a file imports (at any depth: lazy imports count too);
    `from a.b import c` counts as a.b.c (a module or a name in a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("harness", "benchmarks")}


def import_table(*roots: Path) -> dict[str, set[str]]:
    """{repo-relative path: modules it imports} for every .py file under `roots`."""
    return {str(p.relative_to(REPO)): imported_modules(p) for root in roots for p in sorted(root.rglob("*.py"))}


def group_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 and parts[1] in ALLOWED else None


def _group_of_file(path: str) -> str | None:
    parts = path.split("/")
    return parts[1] if parts[0] == "harness" and len(parts) > 2 and parts[1] in ALLOWED else None


def _on_the_edge(path: str, mod: str) -> bool:
    return path == EDGE[0] and (mod == EDGE[1] or mod.startswith(EDGE[1] + "."))


def group_violations(table: dict[str, set[str]]) -> list[str]:
    """A harness group imports only the groups (or single modules) it may."""
    bad = []
    for path, mods in table.items():
        group = _group_of_file(path)
        if group is None:
            continue
        for mod in mods:
            target = group_of(mod)
            if (target and target != group and target not in ALLOWED[group]
                    and not any(mod == m or mod.startswith(m + ".") for m in ALLOWED_MODULES.get(group, ()))):
                bad.append(f"{path} imports {mod}")
    return bad


def exception_violations(table: dict[str, set[str]]) -> list[str]:
    """A module another group may import by exception (ALLOWED_MODULES) imports nothing from that group,
    so the exception cannot close a cycle between the groups."""
    bad = []
    for group, modules in ALLOWED_MODULES.items():
        for module in modules:
            path = module.replace(".", "/") + ".py"
            bad += [f"{path} imports {m}" for m in sorted(table.get(path, ())) if group_of(m) == group]
    return bad


def root_violations(table: dict[str, set[str]]) -> list[str]:
    """The root (harness/*.py and harness/runtime/) imports only the root: no group, no workload; the
    command line excepted."""
    bad = []
    for path, mods in table.items():
        parts = path.split("/")
        is_root = parts[0] == "harness" and (len(parts) == 2 or parts[1] == "runtime")
        if not is_root or path in DISPATCHERS:
            continue
        bad += [f"{path} imports {m}" for m in sorted(mods)
                if (group_of(m) or m.startswith("benchmarks")) and not _on_the_edge(path, m)]
    return bad


def harness_to_benchmarks_violations(table: dict[str, set[str]]) -> list[str]:
    """harness/ reaches a workload only through harness/config.py's import of the registry (benchmarks.registry):
    no other module imports anything from benchmarks/, the command line included."""
    bad = []
    for path, mods in table.items():
        if path.startswith("harness/"):
            bad += [f"{path} imports {m}" for m in sorted(mods)
                    if m.startswith("benchmarks") and not _on_the_edge(path, m)]
    return bad


def benchmark_violations(table: dict[str, set[str]]) -> list[str]:
    """A benchmarks/<name>/ package imports harness/ (not submission/ or the command line), its own package,
    and benchmarks/lm when it is a decoder LLM; never another package or the registry. The registry imports
    only the harness root."""
    bad = []
    for path, mods in table.items():
        parts = path.split("/")
        if parts[0] != "benchmarks":
            continue
        if len(parts) == 2:  # benchmarks/registry.py, benchmarks/__init__.py
            bad += [f"{path} imports {m}" for m in sorted(mods)
                    if m.startswith("benchmarks") or group_of(m) or m.startswith("harness.cli")]
            continue
        own = parts[1]
        may = {own} | ({LM} if own in LM_PACKAGES else set())
        for m in sorted(mods):
            names = m.split(".")
            if names[0] == "benchmarks" and (len(names) < 2 or names[1] not in may):
                bad.append(f"{path} imports {m}")
            elif names[0] == "harness" and (group_of(m) == "submission" or names[1:2] == ["cli"]):
                bad.append(f"{path} imports {m}")
    return bad


def _module_of(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(table: dict[str, set[str]]) -> list[list[str]]:
    """Cycles among the files' modules (lazy imports included): each strongly connected set of two or more."""
    modules = {_module_of(p): mods for p, mods in table.items()}
    graph = {m: {d if d in modules else d.rsplit(".", 1)[0] for d in deps} & set(modules) - {m}
             for m, deps in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_groups_import_only_what_they_may():
    bad = group_violations(import_table(HARNESS))
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_modules_imported_by_exception_do_not_import_back():
    bad = exception_violations(import_table(HARNESS))
    assert not bad, "\n".join(bad)


def test_the_root_imports_only_the_root():
    bad = root_violations(import_table(HARNESS))
    assert not bad, "root modules importing above the root:\n" + "\n".join(bad)


def test_harness_reaches_workloads_only_through_the_registry():
    bad = harness_to_benchmarks_violations(import_table(HARNESS))
    assert not bad, "\n".join(bad)


def test_benchmark_packages_import_harness_their_own_package_and_lm_only():
    bad = benchmark_violations(import_table(BENCHMARKS))
    assert not bad, "\n".join(bad)


def test_no_import_cycle_in_harness_and_benchmarks():
    cycles = import_cycles(import_table(HARNESS, BENCHMARKS))
    assert not cycles, cycles


def test_only_the_command_line_reaches_the_dry_run():
    """`run --dry_run` and `plan --compile` get the dry run from cli.py: no group imports it, and it never imports
    the run's top (run.py) back."""
    table = import_table(HARNESS)
    assert any(m.startswith("harness.dryrun") for m in table["harness/cli.py"])
    reach = [f"{p} imports {m}" for p, mods in table.items() if not p.startswith(("harness/dryrun/", "harness/cli.py"))
             for m in mods if m.startswith("harness.dryrun")]
    assert not reach, reach
    assert not any(m.startswith("harness.train.run") for p, mods in table.items() if p.startswith("harness/dryrun/")
                   for m in mods)


def test_each_rule_catches_a_planted_violation():
    """The rules above on fake import lists: each flags exactly the planted edge and passes the clean one."""
    planted = {
        group_violations: {"harness/review/x.py": {"harness.train.loop.run_timed"},
                           "harness/train/x.py": {"harness.plan.planner"},
                           "harness/train/y.py": {"harness.dryrun.command"},
                           "harness/plan/x.py": {"harness.dryrun.command.compile_report"},
                           "harness/data/x.py": {"harness.train.loop"}},
        exception_violations: {"harness/plan/mfu.py": {"harness.dryrun.compile.useful_train_flops"}},
        root_violations: {"harness/errors.py": {"harness.train.run"},
                          "harness/runtime/x.py": {"benchmarks.registry"},
                          "harness/config.py": {"benchmarks.resnet.workload"}},
        harness_to_benchmarks_violations: {"harness/train/x.py": {"benchmarks.resnet.workload.ResNetWorkload"},
                                           "harness/train/y.py": {"benchmarks.registry"},
                                           "harness/cli.py": {"benchmarks.registry.names"},
                                           "harness/config.py": {"benchmarks.resnet.cost"}},
        benchmark_violations: {"benchmarks/bert/x.py": {"benchmarks.resnet.model"},
                               "benchmarks/resnet/y.py": {"benchmarks.lm.attention.Attention"},
                               "benchmarks/ssd/z.py": {"harness.submission.package"},
                               "benchmarks/registry.py": {"benchmarks.bert.workload"}},
    }
    clean = {
        group_violations: {"harness/train/x.py": {"harness.plan.mfu.mfu_line", "harness.review.integrity",
                                                  "harness.data.service", "harness.export.weights"},
                           "harness/dryrun/x.py": {"harness.train.loop", "harness.plan.mfu"},
                           "harness/data/x.py": {"harness.train.datafiles.list_files"}},
        exception_violations: {"harness/plan/mfu.py": {"harness.plan.system", "harness.errors"}},
        root_violations: {"harness/cli.py": {"harness.train.run"}, "harness/errors.py": {"harness.mlperf"},
                          "harness/config.py": {"benchmarks.registry"}},
        harness_to_benchmarks_violations: {"harness/config.py": {"benchmarks.registry"}, "harness/train/x.py": set()},
        benchmark_violations: {"benchmarks/bert/x.py": {"benchmarks.bert.model", "harness.train.workload"},
                               "benchmarks/llama31_8b/y.py": {"benchmarks.lm.attention.Attention"},
                               "benchmarks/registry.py": {"harness.errors.HarnessError"}},
    }
    for rule, table in planted.items():
        assert len(rule(table)) == len(table), (rule.__name__, rule(table))
        assert rule(clean[rule]) == [], (rule.__name__, rule(clean[rule]))
    cycle = {"harness/train/run.py": {"harness.dryrun.compile"},
             "harness/dryrun/compile.py": {"harness.train.run.run_rulesets"}, "harness/train/loop.py": set()}
    assert import_cycles(cycle) == [["harness.dryrun.compile", "harness.train.run"]]
    assert import_cycles({**cycle, "harness/dryrun/compile.py": {"harness.train.loop"}}) == []


def defined_names(*roots: Path) -> dict[str, set[str]]:
    """{repo-relative path: top-level functions and classes it defines} for every .py file under `roots`."""
    return {str(p.relative_to(REPO)): {n.name for n in ast.parse(p.read_text()).body
                                       if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            for root in roots for p in sorted(root.rglob("*.py"))}


def room_violations(table: dict[str, set[str]]) -> list[str]:
    """A command's own code (ROOMS) is defined in its group, not in harness/train/ (or elsewhere)."""
    bad = []
    for path, names in table.items():
        for group, own in ROOMS.items():
            if not path.startswith(f"harness/{group}/"):
                bad += [f"{path} defines {n} (harness/{group}/ holds it)" for n in sorted(names & own)]
    return bad


def oversized(lines: dict[str, int], over: dict[str, int] = OVER) -> list[str]:
    """Modules over MAX_LINES (or over their cap in `over`), and allowances no longer needed."""
    bad = [f"{p}: {n} lines (at most {over.get(p, MAX_LINES)})" for p, n in sorted(lines.items())
           if n > over.get(p, MAX_LINES)]
    return bad + [f"{p}: {lines[p]} lines, within {MAX_LINES}: remove its allowance in OVER" for p in sorted(over)
                  if p in lines and lines[p] <= MAX_LINES]


def test_each_group_holds_its_commands_code():
    table = defined_names(HARNESS)
    bad = room_violations(table)
    assert not bad, "\n".join(bad)
    for group, own in ROOMS.items():  # each name still exists in its group: the rule is not stale
        found = set().union(*(n for p, n in table.items() if p.startswith(f"harness/{group}/")))
        assert own <= found, (group, own - found)
    assert not [p for p in table if p.startswith("harness/train/")
                and Path(p).stem.startswith(("dryrun", "data_verify", "data_service", "export"))]


def test_no_module_in_harness_is_over_600_lines():
    bad = oversized({str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in HARNESS.rglob("*.py")})
    assert not bad, "\n".join(bad)


def test_the_room_and_size_rules_catch_a_planted_violation():
    assert room_violations({"harness/train/x.py": {"compile_report", "run_timed"},
                            "harness/dryrun/command.py": {"compile_report"}}) == [
        "harness/train/x.py defines compile_report (harness/dryrun/ holds it)"]
    assert oversized({"harness/train/x.py": MAX_LINES, "harness/train/y.py": MAX_LINES + 1}) == [
        f"harness/train/y.py: {MAX_LINES + 1} lines (at most {MAX_LINES})"]
    planted = {"harness/train/z.py": MAX_LINES + 40}
    assert oversized({"harness/train/z.py": MAX_LINES + 40}, planted) == []
    assert oversized({"harness/train/z.py": MAX_LINES}, planted) == [  # a stale allowance
        f"harness/train/z.py: {MAX_LINES} lines, within {MAX_LINES}: remove its allowance in OVER"]


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
