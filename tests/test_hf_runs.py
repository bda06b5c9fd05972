"""Hugging Face checkpoints in real runs: a checkpoint loaded onto a 2 x 2 mesh with FSDP (each device gets
only its slice, the model then computes transformers' logits and loss), and `mlperf-harness run` with
`model.init_checkpoint` and `save_final_weights` followed by `mlperf-harness export` (compliant log that names
the checkpoint, weights written after run_stop, a checkpoint directory out)."""
from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

from tests.conftest import REPO, run_cli, run_dir, sets
from tests.test_hf_golden import GOLDEN, LLAMA


def mesh_load(case: str, layout: str) -> dict:
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "helpers", "hf_mesh.py"), case, layout],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["equal"] and all(result["equal"].values()), [k for k, v in result["equal"].items() if not v]
    golden = load_file(os.path.join(GOLDEN, case, "golden.safetensors"))
    logits = np.array(result["logits"], np.float32)
    assert np.abs(logits - golden["logits"]).max() / np.abs(golden["logits"]).max() < 1e-4
    np.testing.assert_allclose(result["loss"], float(golden["loss"].reshape(-1)[0]), rtol=1e-6)
    return result


def test_checkpoint_loads_onto_a_mesh_with_fsdp():
    result = mesh_load("gpt_oss_plain", "runtime.layout={batch: data, experts: data, heads: model, ff: model, "
                                        "vocab: model}")
    # The embeddings: vocab on `model`, FSDP's data split on the other axis: each device a quarter.
    shards = result["local"]["gpt_oss/embedding/embeddings"]
    assert len(shards) == 4 and all(math.prod(s) == 256 * 64 // 4 for s in shards)
    # Split variables are read slice by slice (each distinct device block once), never whole.
    assert result["reads"]["model.embed_tokens.weight"] == [256 * 64 // 4] * 4
    assert result["reads"]["lm_head.weight"] == [256 * 64 // 4] * 4
    gate_up = result["reads"]["model.layers.0.mlp.experts.gate_up_proj"]     # gate's blocks, then up's
    assert len(gate_up) == 8 and max(gate_up) < 4 * 64 * 64


def test_fused_qkv_loads_onto_a_mesh_by_row_ranges():
    """q, k and v of one fused tensor: k and v, split by FSDP, come as blocks of their own rows of it."""
    result = mesh_load("llama_fused_qkv", "runtime.layout={batch: data, ff: model, vocab: model}")
    reads = result["reads"]["model.layers.0.self_attn.qkv_proj.weight"]
    assert len(reads) > 3 and sum(reads) == 4 * 128 * 64 and max(reads) < 4 * 128 * 64


def test_run_from_a_checkpoint_then_export(tmp_path):
    out = str(tmp_path / "runs")
    overrides = [o for item in LLAMA for o in ("--set", item)]
    proc = run_cli("run", os.path.join(REPO, "configs", "llama31_8b", "smoke.yaml"), "--output_dir", out,
                   *overrides, *sets(model__init_checkpoint=os.path.join(GOLDEN, "llama"), save_final_weights="true",
                                     data__synthetic_train_rows=16, data__eval_samples=8,
                                     data__eval_every_samples=16, schedule__max_epochs=1))
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    run = run_dir(out, "llama31_8b")
    with open(os.path.join(run, "summary.json")) as f:
        assert json.load(f)["compliant"]
    (log,) = glob.glob(os.path.join(run, "result_*.txt"))
    with open(log) as f:
        events = [json.loads(line.split(":::MLLOG", 1)[1]) for line in f if ":::MLLOG" in line]
    assert [e["value"] for e in events if e["key"] == "harness_init_checkpoint"] == [os.path.join(GOLDEN, "llama")]
    run_stop = next(e["time_ms"] for e in events if e["key"] == "run_stop")
    weights = os.path.join(run, "final_weights.safetensors")
    assert run_stop and f"final weights: {weights}" in proc.stdout   # written after the loop, not timed
    trained = load_file(weights)["llama/layer_0/mlp/up/kernel"]
    start = load_file(os.path.join(GOLDEN, "llama", "model.safetensors"))["model.layers.0.mlp.up_proj.weight"].T
    assert trained.shape == start.shape and not np.array_equal(trained, start)    # trained from the checkpoint
    hf = str(tmp_path / "hf")
    proc = run_cli("export", run, "--out", hf, "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["torch_dtype"] == "bfloat16"
    exported = load_file(os.path.join(hf, "model.safetensors"))
    assert exported["model.layers.0.mlp.up_proj.weight"].dtype.name == "bfloat16"
    np.testing.assert_allclose(exported["model.layers.0.mlp.up_proj.weight"].astype(np.float32), trained.T,
                               rtol=1e-2)
