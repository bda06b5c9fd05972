"""flux1 trained: configs/flux1/smoke.yaml runs as shipped (one subprocess) to the benchmark's loss 0.586 on the
learnable synthetic set, with a log the official checker passes for 5.1.0, 6.0.0 and 6.1.0 (open division:
averaged_validation_loss logged beside eval_accuracy); its final weights exported to the diffusers layout and
imported back equal. smoke-mesh.yaml runs as shipped with the other mesh smokes (tests/test_shipped_configs.py,
one process for all)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import REPO, read_summary, run_dir, run_cli

CONFIGS = os.path.join(REPO, "configs", "flux1")
RULESETS = {"5.1.0": "PASS", "6.0.0": "PASS", "6.1.0": "PASS"}


@pytest.fixture(scope="module")
def smokes(tmp_path_factory):
    out = {}
    for name, config in (("smoke", "smoke.yaml"),):
        path = str(tmp_path_factory.mktemp(f"flux_{name}"))
        proc = run_cli("run", os.path.join(CONFIGS, config), "--output_dir", path, timeout=1800)
        out[name] = (proc, path, read_summary(path, "flux1") if proc.returncode == 0 else None)
    return out


def test_smoke_reaches_the_benchmark_loss_with_a_log_all_three_checkers_pass(smokes):
    from benchmarks.flux1.workload import FluxWorkload
    from harness.review import logparse
    from harness.train import weights_init

    proc, _, summary = smokes["smoke"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["status"] == "success" and summary["evals"][-1]["score"] <= 0.586
    assert summary["evals"][0]["score"] > 0.65                       # it had to learn (about 1.1 at init)
    assert {r: v["verdict"] for r, v in summary["compliance"].items()} == RULESETS
    assert sorted(RULESETS) == sorted(FluxWorkload.RULESETS)   # every accepted ruleset (test_ruleset_matrix)
    events = logparse.parse_log(summary["log"])
    # the rulesets that name tensors got exactly one weights_initialization event per name (none do for flux1)
    required, _ = weights_init.required_for_run("flux1", list(RULESETS), "closed")
    assert sorted(e.metadata.get("tensor") for e in events if e.key == weights_init.KEY) == sorted(required)
    keys = {e.key: e.value for e in events}
    assert keys["submission_division"] == "open" and keys["submission_benchmark"] == "flux1"
    assert keys["tensor_parallelism"] == 1
    scores = [e.value for e in events if e.key == "eval_accuracy"]
    assert scores == [e.value for e in events if e.key == "averaged_validation_loss"]
    assert "SYNTHETIC" in proc.stdout


def test_the_smoke_exports_to_diffusers_and_imports_back_equal(smokes, tmp_path):
    from safetensors.numpy import load_file

    from benchmarks.flux1 import diffusers_names
    from benchmarks.flux1.model import Flux
    from harness import config as config_lib
    from harness.nn import hf_checkpoint
    from harness.runtime import distribute

    proc, path, _ = smokes["smoke"]
    assert proc.returncode == 0
    directory = run_dir(path, "flux1")
    out = str(tmp_path / "transformer")
    exported = run_cli("export", directory, "--out", out)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert sorted(os.listdir(out)) == ["TOKENIZER.md", "config.json", "diffusion_pytorch_model.safetensors"]
    with open(os.path.join(out, "TOKENIZER.md")) as f:
        assert "google/t5-v1_1-xxl" in f.read()
    cfg = config_lib.load_config(os.path.join(directory, "config.yaml"), [])
    trained = load_file(os.path.join(directory, "final_weights.safetensors"))
    rt = distribute.make_default("float32", False)
    with rt.scope():
        Flux(rt, "flux", 7, cfg.model)
    hf_checkpoint.load_into(rt, out, diffusers_names.FORMAT, cfg.model)
    for v in rt.variables():
        np.testing.assert_array_equal(v.variable.numpy(), trained[v.path], err_msg=v.path)
