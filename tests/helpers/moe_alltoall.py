"""gpt_oss's all-to-all MoE dispatch on a mesh of 4 logical CPU devices, as JSON (tests/test_moe_alltoall.py).

Run in a subprocess with the SPMD dump variables of tests/helpers/mesh_split.py in its environment (logical
devices and DTensor's dump are set up at TensorFlow's start):
- `layer`: one MoE layer, 8 experts over a {data: 4} mesh (2 per device), batch-split tokens: the output, the
  dropped counts and the gradients (input, router, experts) of the alltoall and sorted dispatches from the
  same weights, dropless and with a capacity factor that drops; and the layer's per-device program under
  each dispatch (the sorted one gathers the experts' weights: what the check must see when it is there);
- `step`: the per-device program of a train step of configs/gpt_oss_20b/smoke-mesh.yaml (experts over
  `data`, each expert's hidden units over `model`) with model.moe_dispatch=alltoall.
Each program as {"all_to_alls", "all_gathers": ["in->out" local shapes], "expert_matmuls": [operand shapes
of the experts' gate/up einsum]}. Prints one RESULT line.
"""
from __future__ import annotations

import glob
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from benchmarks.gpt_oss_20b import moe  # noqa: E402
from benchmarks.gpt_oss_20b.config import ModelConfig  # noqa: E402
from harness.config import RuntimeConfig  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402
from harness.train import loop  # noqa: E402
from tests.helpers.mesh_split import OP, shapes  # noqa: E402
from tests.helpers.step_case import build  # noqa: E402

SMOKE = ["model.num_layers=1", "data.seq_length=128", "data.synthetic_train_rows=8", "data.eval_samples=2",
         "model.moe_dispatch=alltoall"]


def program(path: str) -> dict:
    ops = []
    with open(path) as f:
        for line in f:
            m = OP.match(line)
            if not m:
                continue
            _, op, _, rest = m.groups()
            sig = rest.split(":", 1)[-1] if ":" in rest else ""
            ins, _, outs = sig.partition("->")
            eq = rest.split('equation = "', 1)[1].split('"', 1)[0] if 'equation = "' in rest else ""
            ops.append((op, shapes(ins), shapes(outs), eq))
    moved = lambda name: sorted(f"{i[0]}->{o[0]}" for op, i, o, _ in ops if op == name)  # noqa: E731
    return {"all_to_alls": moved("DTensorAllToAll"), "all_gathers": moved("DTensorAllGather"),
            "expert_matmuls": sorted("|".join(i) for op, i, _, eq in ops if eq == "becm,emh->bech")}


def dumped(dump: str, before: set, name: str) -> str:
    new = sorted(set(glob.glob(os.path.join(dump, f"*after_DTensorSPMDExpansion*{name}*"))) - before)
    if len(new) != 1:
        raise SystemExit(f"expected one SPMD-expanded {name} module in {dump}, found {new}")
    return new[0]


def layer_case(dump: str) -> dict:
    rt = make_runtime(RuntimeConfig(kind="mesh", cpu_devices=4, mesh={"data": 4},
                                    layout={"batch": "data", "experts": "data"}))
    x = rt.to_mesh(tf.random.stateless_normal([4, 32, 16], seed=[1, 2]), rt.layout_for(("batch", None, None)))
    out = {}
    for cf in (0.0, 0.5):
        results, first = {}, None
        for dispatch in ("alltoall", "sorted"):
            cfg = ModelConfig(hidden_size=16, num_experts=8, experts_per_token=2, expert_hidden=12, moe_group_size=16,
                              capacity_factor=cf, moe_dispatch=dispatch, moe_block_size=4, init_stddev=0.3)
            layer = moe.MoE(rt, f"moe_{dispatch}_{cf}", 7, cfg)
            variables = [layer.router, layer.w_gate, layer.w_up, layer.w_down]
            for v, w in zip(variables, first or []):  # the same weights under both dispatches
                v.assign(w.read_value())
            first = first or variables

            def moe_alltoall_case(t):
                with tf.GradientTape() as tape:
                    tape.watch(t)
                    y, r = layer(t)
                    loss = tf.reduce_sum(y * tf.sin(tf.range(y.shape[-1], dtype=tf.float32)))
                return [y, r.dropped] + tape.gradient(loss, [t] + variables)

            before = set(glob.glob(os.path.join(dump, "*")))
            values = rt.function(moe_alltoall_case)(x)
            if cf == 0.0:
                out[f"{dispatch}_layer_program"] = program(dumped(dump, before, "moe_alltoall_case"))
            values = rt.function(lambda *v: rt.gather(list(v)))(*values)   # whole, to compare on the host
            results[dispatch] = [rt.to_host(v).tolist() for v in values]
        out[f"cf{cf}"] = results
    return out


def step_case(dump: str) -> dict:
    cfg, rt, wl = build("configs/gpt_oss_20b/smoke-mesh.yaml", SMOKE)
    steps = loop.CompiledSteps(rt, wl)
    it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
    before = set(glob.glob(os.path.join(dump, "*")))
    loss = float(steps.train_loop(it, tf.constant(1))["loss"])
    return {"step_program": program(dumped(dump, before, "__train_loop")), "step_loss": loss,
            "expert_parallelism": wl.extra_hparams()["expert_parallelism"]}


def main(dump: str) -> None:
    out = layer_case(dump)
    out.update(step_case(dump))
    print("RESULT " + json.dumps(out, default=lambda v: np.asarray(v).tolist()), flush=True)
    os._exit(0)  # several meshes in one process: TensorFlow's teardown can abort after the result is out


if __name__ == "__main__":
    main(sys.argv[1])
