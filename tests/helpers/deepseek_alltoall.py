"""deepseekv3_671b's all-to-all routed experts on a mesh of 4 logical CPU devices, as JSON
(tests/test_deepseek_alltoall.py). Run through tests/spmd_trace.py (SPMD dump variables set at start-up).

- `layer`: one DeepseekMoE layer, 8 experts over a {data: 4} mesh (2 per device), batch-split tokens, random
  positive expert biases: the output, routing counts, seq aux sum, dropped counts and the gradients (input,
  router, routed experts, shared expert) of the alltoall execution on the mesh and of the same layer on one
  device, and (dropless) the forward of the dense execution on the mesh; dropless and with capacity factor 0.5. And the
  per-device programs of the mesh's alltoall and dense layers (tests/helpers/moe_alltoall.py's reading);
- `step`: the per-device program and loss of one train step of configs/deepseekv3_671b/smoke-mesh.yaml
  (cut to one dense layer, one MoE layer and MTP's) and the loss of the same step on one device
  (configs/.../smoke.yaml).
Prints one RESULT line.
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

from benchmarks.deepseekv3_671b.config import ModelConfig  # noqa: E402
from benchmarks.deepseekv3_671b.moe import DeepseekMoE  # noqa: E402
from harness.config import RuntimeConfig  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402
from harness.train import loop  # noqa: E402
from tests.helpers.moe_alltoall import dumped, program  # noqa: E402
from tests.helpers.step_case import build  # noqa: E402

STEP = ["model.num_layers=2", "model.first_dense_layers=1", "data.seq_length=64", "data.synthetic_train_rows=8",
        "data.eval_samples=2"]  # one dense layer, one MoE layer and MTP's
DENSE_MATMUL = "bsm,emh->bseh"   # the dense execution's gate/up einsum


def layer_values(rt, dispatch: str, cf: float, path: str, like: list | None, dump: str | None,
                 grad: bool = True):
    """The layer's outputs (with `grad`, then the gradients) and weights, whole on the host, and, when `dump` is
    given, its per-device program; `like`: the weights to start from (else its own init, with random
    positive expert biases)."""
    cfg = ModelConfig(hidden_size=16, num_experts=8, experts_per_token=2, expert_hidden=12, expert_groups=2,
                      groups_per_token=1, shared_experts=1, init_stddev=0.3, capacity_factor=cf,
                      moe_dispatch=dispatch)
    layer = DeepseekMoE(rt, path, 7, cfg)
    on_mesh = hasattr(rt, "to_mesh")
    place = (lambda value, dims: rt.to_mesh(value, rt.layout_for(dims))) if on_mesh else (lambda value, _: value)
    infos = sorted((v for v in rt.variables() if v.path.startswith(path + "/")), key=lambda v: v.path)
    if like is None:
        layer.expert_bias.assign(place(np.random.default_rng(2).uniform(0, 0.2, 8).astype(np.float32), (None,)))
    else:
        for v, w in zip(infos, like):
            v.variable.assign(place(w, v.dims))
    x = place(tf.random.stateless_normal([4, 32, 16], seed=[1, 2]), ("batch", None, None))
    trainable = [v.variable for v in infos if v.trainable]

    def deepseek_alltoall_case(t):
        if not grad:
            y, r = layer(t)
            return [y, r.counts, r.seq_aux, r.dropped]
        with tf.GradientTape() as tape:
            tape.watch(t)
            y, r = layer(t)
            loss = tf.reduce_sum(y * tf.sin(tf.range(y.shape[-1], dtype=tf.float32)))
        return [y, r.counts, r.seq_aux, r.dropped] + tape.gradient(loss, [t] + trainable)

    before = set(glob.glob(os.path.join(dump, "*"))) if dump else set()
    values = rt.function(deepseek_alltoall_case)(x)
    prog = None
    if dump:
        traced = dumped(dump, before, "deepseek_alltoall_case")
        prog = {**program(traced), "dense_matmuls": dense_matmuls(traced)}
    values, weights = rt.function(lambda v, w: (rt.gather(v), rt.gather(w)))(
        values, [v.variable.read_value() for v in infos])
    return [rt.to_host(v).tolist() for v in values], [rt.to_host(w) for w in weights], prog


def dense_matmuls(path: str) -> list[str]:
    """Operand shapes of the dense execution's gate/up einsum in a dumped program."""
    from tests.helpers.mesh_split import OP, shapes
    out = []
    with open(path) as f:
        for line in f:
            m = OP.match(line)
            if m and f'equation = "{DENSE_MATMUL}"' in m.group(4):
                sig = m.group(4).split(":", 1)[-1]
                out.append("|".join(shapes(sig.partition("->")[0])))
    return sorted(out)


def layer_case(dump: str) -> dict:
    mesh = make_runtime(RuntimeConfig(kind="mesh", cpu_devices=4, mesh={"data": 4},
                                      layout={"batch": "data", "experts": "data"}))
    one = make_runtime(RuntimeConfig(kind="default", precision="float32"))
    out = {}
    for cf in (0.0, 0.5):
        got, weights, prog = layer_values(mesh, "alltoall", cf, f"moe_a2a_{cf}", None, dump if not cf else None)
        single, _, _ = layer_values(one, "alltoall", cf, f"moe_one_{cf}", weights, None)
        out[f"cf{cf}"] = {"mesh": got, "one": single}
        if not cf:
            # forward only: the dense experts' gradient on {data: 4} (batch and experts on one axis) fails
            # DTensor's Tile expansion (the gate normalization's sum, batch-split to experts-split)
            dense, _, dense_prog = layer_values(mesh, "dense", cf, f"moe_dense_{cf}", weights, dump, grad=False)
            out[f"cf{cf}"]["dense"] = dense
            out["alltoall_layer_program"], out["dense_layer_program"] = prog, dense_prog
    return out


def step_loss(config: str, dump: str | None) -> dict:
    cfg, rt, wl = build(config, STEP)
    steps = loop.CompiledSteps(rt, wl)
    it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
    before = set(glob.glob(os.path.join(dump, "*"))) if dump else set()
    out = {"loss": float(steps.train_loop(it, tf.constant(1))["loss"]),
           "expert_parallelism": wl.extra_hparams()["expert_parallelism"]}
    if dump:
        out["program"] = program(dumped(dump, before, "__train_loop"))
    return out


def main(dump: str) -> None:
    out = layer_case(dump)
    out["step_mesh"] = step_loss("configs/deepseekv3_671b/smoke-mesh.yaml", dump)
    out["step_one"] = step_loss("configs/deepseekv3_671b/smoke.yaml", None)
    print("RESULT " + json.dumps(out, default=lambda v: np.asarray(v).tolist()), flush=True)
    os._exit(0)  # several meshes in one process: TensorFlow's teardown can abort after the result is out


if __name__ == "__main__":
    main(sys.argv[1])
