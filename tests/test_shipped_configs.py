"""Every shipped config runs as shipped: each `configs/*/smoke*.yaml` reaches its target with a log the
official checker passes, with no --set, and each accelerator or reference config passes the dry run's
checks as shipped (or is refused in one line for a reason its header states).

Each config is run once in the suite: the smoke configs that another test already runs as shipped are
listed in COVERED_ELSEWHERE (checked against that test's source), the rest run here, several per process,
except the mesh and mirrored smokes in STEPS_PROVEN: a named test builds each from the config itself and
holds its steps and eval equal to one device's, and here each passes the run's pre-log checks as shipped.
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

# Smoke configs that another test runs as shipped (`run CONFIG` with no --set, by run_cli or with its family
# in conftest.runs_in_one_process), to its target, and whose summary it holds to the official checker:
# config -> (test file, the function that starts the run).
COVERED_ELSEWHERE = {
    "configs/deepseekv3_671b/smoke.yaml": ("tests/test_deepseek_v3.py", "smoke"),
    "configs/deepseekv3_671b/smoke-mesh.yaml": ("tests/test_deepseek_v3.py", "smoke"),
    "configs/dlrmv4/smoke.yaml": ("tests/test_dlrmv4_runs.py", "smokes"),
    "configs/dlrmv4/smoke-mesh.yaml": ("tests/test_dlrmv4_runs.py", "smokes"),
    "configs/flux1/smoke.yaml": ("tests/test_flux1_runs.py", "smokes"),
    "configs/gpt_oss_20b/smoke.yaml": ("tests/test_gpt_oss.py", "smoke"),
    "configs/gpt_oss_20b/smoke-published.yaml": ("tests/test_gpt_oss.py", "smoke"),
    "configs/llama31_8b/smoke.yaml": ("tests/test_llama31_8b.py", "smokes"),
    "configs/qwen35_397b_grpo/smoke.yaml": ("tests/test_qwen35_grpo_runs.py", "smoke"),
    "configs/qwen35_397b_grpo/smoke-mesh.yaml": ("tests/test_qwen35_grpo_runs.py", "smoke"),
    "configs/llama31_8b/smoke-mesh.yaml": ("tests/test_llama31_8b.py", "smokes"),
    "configs/resnet/smoke.yaml": ("tests/test_e2e_resnet.py", "smoke_run"),
    "configs/ssd/smoke.yaml": ("tests/test_ssd.py", "smoke_run"),
    "configs/transformer/smoke.yaml": ("tests/test_transformer.py", "smoke_run"),
}
# Mesh and mirrored smokes the suite does not train to their targets: config -> (test file, the test or
# fixture that builds the config itself, at reduced size, and holds its train steps and eval equal to one
# device's). Their one-device smoke.yaml reaches the target in the suite, so the same steps on the mesh do
# (transformer's mesh smoke is its smoke at one layer and 50 eval sentences; its header gives the BLEU measured).
# Training these to their targets cost ~810 of the suite's ~4,700 CPU seconds (the full run of d66d2e3:
# groups bert_mesh 114, gpt_oss+transformer mesh 304, ssd mesh+mirrored 210, flux_mesh 182). Mesh runs to the
# target stay for the families whose test compares a whole mesh run with one device's (deepseekv3_671b,
# dlrmv4, llama2_70b_lora, llama31_8b, qwen35_397b_grpo).
STEPS_PROVEN = {
    "configs/bert/smoke-mesh.yaml": ("tests/test_mesh.py",
                                     "test_mesh_matches_single_device_and_shards_weights_1_over_m"),
    "configs/flux1/smoke-mesh.yaml": ("tests/test_flux1_runs.py",
                                      "test_mesh_smoke_steps_and_eval_equal_one_device_with_fsdp"),
    "configs/gpt_oss_20b/smoke-mesh.yaml": ("tests/test_gpt_oss.py", "subprocess_result"),
    "configs/ssd/smoke-mesh.yaml": ("tests/test_ssd.py", "test_data_parallel_mesh_and_mirrored_match_one_device"),
    "configs/ssd/smoke-mirrored.yaml": ("tests/test_ssd.py", "test_data_parallel_mesh_and_mirrored_match_one_device"),
    "configs/transformer/smoke-mesh.yaml": ("tests/test_transformer.py",
                                            "test_training_and_beam_search_on_a_2x2_mesh_match_one_device"),
}
# The other smoke configs, run here in groups: a group is one process (one TensorFlow start) with the logical
# CPUs it sets, and one xdist work unit (tests/conftest.py: a test id's part before "~"), so the groups run on
# different workers and no one process of smokes sets the suite's critical path. A default-runtime config
# takes the first device, so it rides along with a mesh's.
RUN_HERE = {
    "one_device": (1, ["configs/bert/smoke.yaml", "configs/resnet/smoke-tfrecord.yaml"]),
    "lora": (4, ["configs/llama2_70b_lora/smoke.yaml", "configs/llama2_70b_lora/smoke-mesh.yaml"]),
}
# Hardware configs the dry run refuses as shipped: config -> the reason, which its header must state.
REFUSED: dict[str, str] = {
    "configs/dlrmv4/gpu-8x-h200.yaml": "the smallest mesh that fits splits the rows 32 ways",
    "configs/qwen35_397b_grpo/reference.yaml": "R2E-Gym task containers and an OpenHands agent",
}


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
    here = [c for _, configs in RUN_HERE.values() for c in configs]
    assert len(here) == len(set(here)) and not set(here) & (set(COVERED_ELSEWHERE) | set(STEPS_PROVEN))
    assert not set(COVERED_ELSEWHERE) & set(STEPS_PROVEN)
    assert sorted(here + list(COVERED_ELSEWHERE) + list(STEPS_PROVEN)) == shipped("smoke")
    for config, (test_file, function) in {**COVERED_ELSEWHERE, **STEPS_PROVEN}.items():
        with open(os.path.join(REPO, test_file)) as f:
            source = f.read()
        workload, name = config.split("/")[1:]
        assert f'"{workload}"' in source and f'"{name}"' in source, f"{test_file} does not name {config}"
        covering = _function(ast.parse(source), function)
        if config in STEPS_PROVEN:
            continue
        calls = [n for n in ast.walk(covering) if isinstance(n, ast.Call)]
        runs = [c for c in calls if getattr(c.func, "id", None) == "run_cli"
                and c.args and isinstance(c.args[0], ast.Constant) and c.args[0].value == "run"]
        shared = [c for c in calls if getattr(c.func, "id", None) == "runs_in_one_process"]
        assert runs or shared, f"{test_file}:{function} does not call run_cli('run', ...) or runs_in_one_process"
        for call in runs:
            overridden = [a for a in call.args if isinstance(a, ast.Starred)
                          or (isinstance(a, ast.Constant) and a.value == "--set")]
            assert not overridden, f"{test_file}:{function} runs {config} with --set: not as shipped"
        for call in shared:  # each run a list of its config alone
            listed = call.args[1] if len(call.args) > 1 else None
            assert isinstance(listed, ast.List) and all(isinstance(r, ast.List) and len(r.elts) == 1
                                                        for r in listed.elts), \
                f"{test_file}:{function} runs {config} with arguments: not as shipped"
    compiled = ("reference.yaml", "gpu-*.yaml", "tpu-*.yaml")  # the names tests/dry_run_shared.py compiles
    uncompiled = [c for c in shipped("hardware") if not any(fnmatch.fnmatch(os.path.basename(c), p) for p in compiled)]
    assert not uncompiled, f"no test compiles {uncompiled} (tests/dry_run_shared.py takes {compiled})"
    assert set(REFUSED) <= set(shipped("hardware"))


# --------------------------------------------------------------------- smoke configs, run here

def run_group(group: str, cwd: str) -> dict[str, dict]:
    """One RUN_HERE group in one process, from `cwd`; for a group with smoke-tfrecord.yaml, `cwd` first gets
    the data its header says to write (at the path the config names, relative to where the run starts)."""
    devices, configs = RUN_HERE[group]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    if "configs/resnet/smoke-tfrecord.yaml" in configs:
        command = re.search(r"`python (scripts/make_imagenet_tfrecords\.py [^`]+)`",
                            header("configs/resnet/smoke-tfrecord.yaml"))
        assert command, "smoke-tfrecord.yaml's header no longer says how to write its data"
        script, *args = command.group(1).split()
        made = subprocess.run([sys.executable, os.path.join(REPO, script), *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=600)
        assert made.returncode == 0, made.stderr[-2000:]
    results = {}
    helper = os.path.join(REPO, "tests", "helpers", "shipped_runs.py")
    proc = subprocess.run([sys.executable, helper, str(devices), os.path.join(cwd, "runs"),
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


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """The results of a RUN_HERE group, its process started by the group's first test (on whichever worker
    runs that group's work unit); a group that raised (a timeout) raises again for its other tests, as a
    module fixture's error would, rather than running again."""
    done: dict[str, dict[str, dict] | Exception] = {}

    def results(group: str) -> dict[str, dict]:
        if group not in done:
            try:
                done[group] = run_group(group, str(tmp_path_factory.mktemp(f"shipped-{group}")))
            except Exception as e:  # noqa: BLE001 - kept and raised for each test of the group
                done[group] = e
        if isinstance(done[group], Exception):
            raise done[group]
        return done[group]
    return results


@pytest.mark.parametrize("group,config", [pytest.param(g, c, id=f"{g}~{c}")
                                          for g, (_, configs) in RUN_HERE.items() for c in configs])
def test_smoke_config_reaches_its_target_with_a_compliant_log_as_shipped(smoke_results, group, config):
    result = smoke_results(group)[config]
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

@pytest.mark.parametrize("config", shipped("hardware") + sorted(STEPS_PROVEN))
def test_hardware_config_passes_the_dry_run_checks_as_shipped(config):
    """What `run CONFIG --dry_run` checks before it builds and compiles (devices and batch splits, the
    closed target, the workload's inputs, eval schedule and the rulesets' weight names), as shipped; a
    refusal is one line whose reason the config's header states. The STEPS_PROVEN smokes too: their steps are
    held equal to one device's by the tests named there, from the config with reduced sizes."""
    from harness import config as config_lib
    from harness.errors import HarnessError
    from harness.dryrun.standin import standin_checked

    try:
        # The run's pre-log checks in the dry run's order (harness/train/preflight.py), on the stand-in replica.
        standin_checked(config_lib.load_config(os.path.join(REPO, config), []))
    except HarnessError as e:
        message = str(e)
        assert config in REFUSED, f"{config} is refused as shipped: {message}"
        assert "\n" not in message and REFUSED[config] in message and REFUSED[config] in header(config), message
        return
    assert config not in REFUSED, f"{config} is listed as refused but passes"
