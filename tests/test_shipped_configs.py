"""Every shipped config runs as shipped: each `configs/*/smoke*.yaml` reaches its target with a log the
official checker passes, with no --set, and each accelerator or reference config passes the dry run's
checks as shipped (or is refused in one line for a reason its header states).

Each config is run once in the suite: the smoke configs that another test already runs as shipped are
listed in COVERED_ELSEWHERE (checked against that test's source), the rest run here, several per process.
The hardware configs' full-size compiles take minutes to over half an hour each here (docs/dry-run.md), so
the suite compiles them at reduced width (tests/test_dry_run.py) and checks them as shipped here up to
the compile.
"""
from __future__ import annotations

import ast
import fnmatch
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, cli_in_process

# Smoke configs that another test runs as shipped (`run CONFIG` with no --set), to its target, and whose
# summary it holds to the official checker: config -> (test file, the function that starts the run).
COVERED_ELSEWHERE = {
    "configs/deepseekv3_671b/smoke.yaml": ("tests/test_deepseek_v3.py", "smoke"),
    "configs/deepseekv3_671b/smoke-mesh.yaml": ("tests/test_deepseek_v3.py", "smoke"),
    "configs/flux1/smoke.yaml": ("tests/test_flux1_runs.py", "smokes"),
    "configs/gpt_oss_20b/smoke.yaml": ("tests/test_gpt_oss.py", "smoke"),
    "configs/gpt_oss_20b/smoke-published.yaml": ("tests/test_gpt_oss.py", "published_smoke"),
    "configs/llama31_8b/smoke.yaml": ("tests/test_llama31_8b.py", "smokes"),
    "configs/llama31_8b/smoke-mesh.yaml": ("tests/test_llama31_8b.py", "smokes"),
    "configs/ssd/smoke.yaml": ("tests/test_ssd.py", "smoke_run"),
    "configs/transformer/smoke.yaml": ("tests/test_transformer.py", "smoke_run"),
}
# The other smoke configs, run here: per process (one TensorFlow start), the logical CPUs it sets and its
# configs. A default-runtime config takes the first device, so it rides along with a mesh's.
RUN_HERE = {
    4: ["configs/bert/smoke.yaml", "configs/resnet/smoke.yaml", "configs/resnet/smoke-tfrecord.yaml",
        "configs/bert/smoke-mesh.yaml", "configs/gpt_oss_20b/smoke-mesh.yaml", "configs/transformer/smoke-mesh.yaml",
        "configs/llama2_70b_lora/smoke.yaml", "configs/llama2_70b_lora/smoke-mesh.yaml",
        "configs/flux1/smoke-mesh.yaml"],
    2: ["configs/ssd/smoke-mesh.yaml", "configs/ssd/smoke-mirrored.yaml"],
}
# Hardware configs the dry run refuses as shipped: config -> the reason, which its header must state.
REFUSED: dict[str, str] = {}


def shipped(kind: str) -> list[str]:
    """configs/*/*.yaml, relative to the repository: the smoke configs or the others (`hardware`)."""
    paths = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "configs", "*", "*.yaml")))
    return [p for p in paths if os.path.basename(p).startswith("smoke") == (kind == "smoke")]


def header(config: str) -> str:
    """The config's leading comment block, as one line of text."""
    lines = []
    with open(os.path.join(REPO, config)) as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line[1:].strip())
    return " ".join(lines)


# ------------------------------------------------------------------ every config is covered, once

def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{name}: {len(found)} definitions"
    return found[0]


def test_every_shipped_config_is_run_as_shipped_by_exactly_one_test():
    """The tables against the directory listing and the covering tests' source: every smoke config is run
    here or by a listed test (not both), whose `run_cli("run", ...)` has no --set; every other config is
    checked by test_hardware_config_passes_the_dry_run_checks_as_shipped (and compiled by test_dry_run.py)."""
    here = [c for configs in RUN_HERE.values() for c in configs]
    assert len(here) == len(set(here)) and not set(here) & set(COVERED_ELSEWHERE)
    assert sorted(here + list(COVERED_ELSEWHERE)) == shipped("smoke")
    for config, (test_file, function) in COVERED_ELSEWHERE.items():
        with open(os.path.join(REPO, test_file)) as f:
            source = f.read()
        workload, name = config.split("/")[1:]
        assert f'"{workload}"' in source and f'"{name}"' in source, f"{test_file} does not name {config}"
        calls = [n for n in ast.walk(_function(ast.parse(source), function)) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "run_cli"]
        runs = [c for c in calls if c.args and isinstance(c.args[0], ast.Constant) and c.args[0].value == "run"]
        assert runs, f"{test_file}:{function} does not call run_cli('run', ...)"
        for call in runs:
            overridden = [a for a in call.args if isinstance(a, ast.Starred)
                          or (isinstance(a, ast.Constant) and a.value == "--set")]
            assert not overridden, f"{test_file}:{function} runs {config} with --set: not as shipped"
    compiled = ("reference.yaml", "gpu-*.yaml", "tpu-*.yaml")  # the names tests/dry_run_shared.py compiles
    uncompiled = [c for c in shipped("hardware") if not any(fnmatch.fnmatch(os.path.basename(c), p) for p in compiled)]
    assert not uncompiled, f"no test compiles {uncompiled} (tests/dry_run_shared.py takes {compiled})"
    assert set(REFUSED) <= set(shipped("hardware"))


# --------------------------------------------------------------------- smoke configs, run here

@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory) -> dict[str, dict]:
    """Runs RUN_HERE, one process per group, from a directory holding the data smoke-tfrecord.yaml's header
    says to write (at the path the config names, relative to where the run starts)."""
    cwd = str(tmp_path_factory.mktemp("shipped"))
    command = re.search(r"`python (scripts/make_imagenet_tfrecords\.py [^`]+)`",
                        header("configs/resnet/smoke-tfrecord.yaml"))
    assert command, "smoke-tfrecord.yaml's header no longer says how to write its data"
    script, *args = command.group(1).split()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    made = subprocess.run([sys.executable, os.path.join(REPO, script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    results = {}
    helper = os.path.join(REPO, "tests", "helpers", "shipped_runs.py")
    for devices, configs in RUN_HERE.items():
        proc = subprocess.run([sys.executable, helper, str(devices), os.path.join(cwd, f"runs{devices}"),
                               *[os.path.join(REPO, c) for c in configs]], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600 * len(configs))
        for line in proc.stdout.splitlines():
            status, config, detail = (line.split(" ", 2) + ["", ""])[:3]
            if status in ("RESULT", "FAILED"):
                results[os.path.relpath(config, REPO)] = (json.loads(detail) if status == "RESULT"
                                                          else {"code": None, "traceback": json.loads(detail)})
        for config in configs:
            results.setdefault(config, {"code": None, "traceback": proc.stderr[-3000:]})
    return results


@pytest.mark.parametrize("config", [c for configs in RUN_HERE.values() for c in configs])
def test_smoke_config_reaches_its_target_with_a_compliant_log_as_shipped(smoke_results, config):
    result = smoke_results[config]
    assert result["code"] == 0, result
    (path,) = glob.glob(os.path.join(result["out"], "*", "*", "summary.json"))
    with open(path) as f:
        summary = json.load(f)
    assert summary["status"] == "success", summary["reason"]
    verdicts = {r: v["verdict"] for r, v in summary["compliance"].items()}
    assert verdicts and set(verdicts.values()) == {"PASS"}, verdicts
    assert summary["compliant"]
    # `check` with no --ruleset judges the log under the rulesets its run gated on, and passes it.
    checked = cli_in_process("check", summary["log"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert all(f"official compliance checker, ruleset {r}: PASS" in checked.stdout for r in verdicts), checked.stdout


# ------------------------------------------------------------- hardware configs, up to the compile

@pytest.mark.parametrize("config", shipped("hardware"))
def test_hardware_config_passes_the_dry_run_checks_as_shipped(config):
    """What `run CONFIG --dry_run` checks before it builds and compiles (devices and batch splits, the
    closed target, the workload's inputs, eval schedule and the rulesets' weight names), as shipped; a
    refusal is one line whose reason the config's header states."""
    from harness import config as config_lib
    from harness.errors import HarnessError
    from harness.train import dryrun

    try:
        # The run's pre-log checks in the dry run's order (harness/train/preflight.py), on the stand-in replica.
        dryrun.standin_checked(config_lib.load_config(os.path.join(REPO, config), []))
    except HarnessError as e:
        message = str(e)
        assert config in REFUSED, f"{config} is refused as shipped: {message}"
        assert "\n" not in message and REFUSED[config] in message and REFUSED[config] in header(config), message
        return
    assert config not in REFUSED, f"{config} is listed as refused but passes"
