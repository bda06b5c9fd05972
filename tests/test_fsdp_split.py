"""FSDP's per-device program: read DTensor's SPMD-expanded train step (as tests/test_mesh_split.py does)
of gpt_oss_20b's smoke-mesh config (2x2 {data, model}, one layer) with runtime.fsdp=true and assert:
- every weight FSDP splits is all-gathered (DTensorAllGather over `data`, from its stored layout to its
  compute layout) straight from its variable read, once per step: the backward reuses the gathered value;
- nothing else is gathered (no activation, no optimizer slot: AdamW updates its shards) but the expert
  weights, which the sorted MoE dispatch gathers the same way;
- every such weight's gradient is all-reduced over `data` (the q/k norms', used by the model-split heads, over
  both axes) in its compute layout and cut to its shard
  (DTensorAllScatter, a local slice), and DTensor's fusion pass turns each pair that is adjacent into one
  DTensorReduceScatter (those with a reshape in between stay an all-reduce and a slice).
One subprocess, about 10 s.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

HELPER = os.path.join(REPO, "tests", "helpers", "fsdp_split.py")
OVERRIDES = ["model.num_layers=1", "data.seq_length=128", "data.synthetic_train_rows=8", "data.eval_samples=2",
             "runtime.fsdp=true"]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("fsdp_spmd"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CPP_VMODULE="dtensor_mlir_passes=1",
               TF_DUMP_GRAPH_PREFIX=dump,
               MLIR_BRIDGE_LOG_PASS_FILTER="DTensorSPMDExpansion;DTensorAllReduceScatterOptimization")
    p = subprocess.run([sys.executable, HELPER, dump, "configs/gpt_oss_20b/smoke-mesh.yaml", json.dumps(OVERRIDES)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(line[-1][len("RESULT "):])


def signature(shape, stored, compute) -> str:
    return f"{shape} {stored}->{compute}"


# gpt_oss's expert weights (the layout splits them over data, so FSDP leaves them): its sorted MoE dispatch
# gathers them whole over data where it uses them (`ff` stays split over model) and reduces their gradients
# back into the shards, exactly as FSDP does its own weights (gate, up, then down).
U = "'unsharded'"
EXPERTS = [f"[8, 32, 32] ['data', {U}, 'model']->[{U}, {U}, 'model']"] * 2 + \
          [f"[8, 32, 32] ['data', 'model', {U}]->[{U}, 'model', {U}]"]


def test_each_weight_is_gathered_from_its_read_once_and_nothing_else(program):
    weights = sorted(signature(*w) for w in program["weights"])
    # Embedding, output layer, router, q/k/v/o, the three norms and the q/k norms (the reference's qk_layernorm):
    # experts are split over data by the layout.
    assert len(weights) == 12
    gathers = program["gathers"]
    assert all(g["source"] == "ReadVariableOp" for g in gathers), gathers
    assert sorted(signature(g["shape"], g["from"], g["to"]) for g in gathers) == sorted(weights + EXPERTS)


def test_each_gradient_is_reduced_over_data_into_its_shard(program):
    weights = sorted(signature(*w) for w in program["weights"])
    scatters = program["scatters"]
    # The q/k norm weights ([head_dim 8]) are used by every head, and the heads are split over model: their
    # gradient is summed over both axes at once.
    assert all(s["reduced"] == ("DTensorAllReduce Add all" if s["shape"] == [8] else "DTensorAllReduce Add data")
               and set(s["via"]) <= {"Reshape"} for s in scatters)
    assert sum(s["shape"] == [8] for s in scatters) == 2
    # Scattered from the compute layout to the stored one: the reverse of each weight's gather.
    assert sorted(signature(s["shape"], s["to"], s["from"]) for s in scatters) == sorted(weights + EXPERTS)
    # The fusion pass makes one reduce-scatter of each adjacent all-reduce + all-scatter, and no other.
    fused = program["fused"]
    assert program["direct"] > 0 and fused["DTensorReduceScatter"] == program["direct"]
    assert fused.get("DTensorAllScatter", 0) == len(scatters) - program["direct"]
