"""flux1 trained: configs/flux1/smoke.yaml runs as shipped (one subprocess) to the benchmark's loss 0.586 on the
learnable synthetic set, with a log the official checker passes for 5.1.0, 6.0.0 and 6.1.0 (open division:
averaged_validation_loss logged beside eval_accuracy); its final weights exported to the diffusers layout and
imported back equal. smoke-mesh.yaml's steps and eval, from the config at reduced size, equal one device's
(tests/test_shipped_configs.py STEPS_PROVEN counts on it)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import REPO, read_summary, run_cli, run_dir, script_result

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


# smoke.yaml and smoke-mesh.yaml (2x2, FSDP) at the step case's sizes (tests/step_cases.py SMALL: its 4 captions
# put the same content at every global position whatever the replica count): two train steps, then the eval.
MESH_SCRIPT = """
    import json
    from harness.train import loop
    from tests.helpers.step_case import build, evaluate, train
    from tests.step_cases import SMALL

    def run(config):
        cfg, rt, wl = build(config, SMALL["flux1"])
        steps = loop.CompiledSteps(rt, wl)
        losses = train(steps, cfg, 2)
        score, counted = evaluate(steps, cfg)
        # Variables whose every device holds a part of them (FSDP over `data`, heads and MLP units over `model`).
        split = (sum(all(list(s) != list(v.variable.shape) for s in rt.local_shapes(v.variable))
                     for v in rt.variables()) if hasattr(rt, "local_shapes") else 0)
        return dict(losses=losses, score=score, counted=counted, split=split, variables=len(rt.variables()),
                    tp=wl.mllog_hparams().get("tensor_parallelism"))

    mesh = run({mesh!r})
    one = run({smoke!r})
    print("RESULT " + json.dumps(dict(mesh=mesh, one=one)))
"""


def test_mesh_smoke_steps_and_eval_equal_one_device_with_fsdp():
    """smoke-mesh.yaml: the draws are keyed by each sample's global position, so the 2x2 FSDP mesh trains on
    the numbers one device does; its losses and eval loss equal one device's to float32 reduction order, and
    every weight (and AdamW slot) large enough is split over the four devices."""
    out = script_result(MESH_SCRIPT.format(mesh=os.path.join(CONFIGS, "smoke-mesh.yaml"),
                                           smoke=os.path.join(CONFIGS, "smoke.yaml")), timeout=900)
    mesh, one = out["mesh"], out["one"]
    assert np.isfinite(mesh["losses"]).all()
    np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=1e-4)
    assert mesh["counted"] == one["counted"] == 45
    np.testing.assert_allclose(mesh["score"], one["score"], rtol=1e-4)
    assert (mesh["tp"], one["tp"]) == (2, 1)
    assert mesh["split"] >= mesh["variables"] - 2, mesh   # measured: 155 of 156
