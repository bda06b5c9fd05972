"""FSDP on the DTensor mesh (runtime.fsdp): train steps on 4 logical CPUs equal one device's, and every
variable with a dimension the data axis divides is split over it.

One subprocess (tests/helpers/fsdp_case.py): GPT-OSS and BERT smoke configs at reduced size, each on a
data=4 mesh and a data=2 x model=2 mesh with FSDP (BERT's 2x2 also in bfloat16), then on one device.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

GPT = os.path.join(REPO, "configs", "gpt_oss_20b")
BERT = os.path.join(REPO, "configs", "bert")
GPT_SMALL = ["data.seq_length=128", "data.synthetic_train_rows=8", "data.eval_samples=2",
             "schedule.global_batch_size=4", "model.num_layers=1"]
BERT_SMALL = ["data.train_samples=256", "data.eval_samples=8", "schedule.global_batch_size=8",
              "model.hidden_size=64", "model.ff_size=128", "model.num_layers=1"]
DATA4 = ["runtime.mesh={data: 4, model: 1}", "runtime.fsdp=true"]
STEPS = 2  # calls of the compiled train loop, 2 steps each (tests/helpers/fsdp_case.py)
CASES = {  # mesh cases first: the first mesh sets up the 4 logical devices
    "gpt_data4": [f"{GPT}/smoke-mesh.yaml", GPT_SMALL + DATA4
                  + ["runtime.layout={batch: data, heads: model, ff: model, vocab: model}"], STEPS],
    "gpt_2x2": [f"{GPT}/smoke-mesh.yaml", GPT_SMALL + ["runtime.fsdp=true"], STEPS],
    "bert_data4": [f"{BERT}/smoke-mesh.yaml", BERT_SMALL + DATA4, STEPS],
    "bert_2x2": [f"{BERT}/smoke-mesh.yaml", BERT_SMALL + ["runtime.fsdp=true"], STEPS],
    "bert_2x2_bf16": [f"{BERT}/smoke-mesh.yaml", BERT_SMALL + ["runtime.fsdp=true",
                                                              "runtime.precision=bfloat16"], STEPS],
    "gpt_one": [f"{GPT}/smoke.yaml", GPT_SMALL, STEPS],
    "bert_one": [f"{BERT}/smoke.yaml", BERT_SMALL, STEPS],
}


@pytest.fixture(scope="module")
def result():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "helpers", "fsdp_case.py"),
                           json.dumps(CASES)], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("mesh,one", [("gpt_data4", "gpt_one"), ("gpt_2x2", "gpt_one"),
                                      ("bert_data4", "bert_one"), ("bert_2x2", "bert_one")])
def test_fsdp_steps_equal_one_device(result, mesh, one):
    losses = np.array(result[mesh]["losses"])
    assert np.all(np.isfinite(losses)) and len(losses) == STEPS
    np.testing.assert_allclose(losses, result[one]["losses"], rtol=2e-5)


def test_fsdp_in_bfloat16_with_float32_master_weights(result):
    r = result["bert_2x2_bf16"]
    # bfloat16 compute rounds differently from float32 (one device's float32 losses), by little.
    assert r["losses"] != result["bert_2x2"]["losses"]
    np.testing.assert_allclose(r["losses"], result["bert_one"]["losses"], rtol=1e-3)
    assert r["layouts"] == result["bert_2x2"]["layouts"]  # the float32 weights are split as in float32


@pytest.mark.parametrize("case", ["gpt_data4", "gpt_2x2", "bert_data4", "bert_2x2"])
def test_every_variable_the_data_axis_divides_is_split_over_it(result, case):
    r = result[case]
    n, split, replicated = r["data"], 0, 0
    for path, layout in r["layouts"].items():
        shape = r["shapes"][path]
        free = [a for a, spec in enumerate(layout) if spec == "unsharded" and shape[a] % n == 0]
        if "data" in layout:
            split += 1
            axis = layout.index("data")
            assert shape[axis] % n == 0, (path, shape, layout)
            # The largest dimension it could take (unless the workload's layout put data there already).
            assert path in r["by_layout"] or all(shape[a] <= shape[axis] for a in free), (path, shape, layout)
        else:
            assert not free, (path, shape, layout)  # nothing left for the data axis to divide
            replicated += int(np.prod(shape)) * r["itemsize"][path]
    weights = [p for p in r["layouts"] if not p.startswith("optimizer/")]
    # Optimizer slots (AdamW's m and v, LAMB's) follow their weights.
    for p in weights:
        for slot in ("m", "v"):
            if f"optimizer/{slot}/{p}" in r["layouts"]:
                assert r["layouts"][f"optimizer/{slot}/{p}"] == r["layouts"][p]
    assert split > 15 and r["replicated_bytes"] == replicated


def test_fsdp_off_a_mesh_is_refused_with_one_reason():
    from harness import config as config_lib
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match=r"runtime.fsdp: true needs runtime.kind=mesh \(got 'mirrored'\)"):
        config_lib.load_config(f"{BERT}/smoke.yaml", ["runtime.kind=mirrored", "runtime.fsdp=true"])
    assert config_lib.load_config(f"{BERT}/smoke-mesh.yaml", ["runtime.fsdp=true"]).runtime.fsdp
