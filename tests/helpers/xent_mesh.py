"""The blockwise cross-entropy on a 2x2 {data, model} mesh of 4 logical CPUs, `vocab` split over `model`, as
JSON (tests/test_cross_entropy.py): losses and gradients of fixed inputs in float32 and bfloat16, with a block
budget that makes several blocks. Prints one RESULT line {precision: {"loss", "dx", "dw"}} (nested lists).
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from harness.nn.cross_entropy import token_cross_entropy  # noqa: E402
from tests.helpers.step_case import build  # noqa: E402


def inputs(b: int = 4, s: int = 12, m: int = 8, v: int = 40, seed: int = 0) -> dict[str, np.ndarray]:
    """The fixed case both this helper and the test compute from."""
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=[b, s, m]).astype(np.float32), "w": rng.normal(size=[m, v]).astype(np.float32),
            "targets": rng.integers(0, v, size=[b, s]).astype(np.int32),
            "dy": rng.normal(size=[b, s]).astype(np.float32)}


def main() -> None:
    _, rt, _ = build("configs/gpt_oss_20b/smoke-mesh.yaml", [])
    assert rt.shards("vocab") == 2 and rt.shards("batch") == 2
    case = inputs()
    b, s, _ = case["x"].shape
    budget = (b // 2) * 3 * (case["w"].shape[1] // 2)  # 3 positions per block: 4 blocks

    def mesh(name: str, dims: tuple) -> tf.Tensor:
        return rt.to_mesh(case[name], rt.layout_for(dims))

    out = {}
    for precision, dtype in (("float32", tf.float32), ("bfloat16", tf.bfloat16)):
        x, w = mesh("x", ("batch", None, None)), mesh("w", (None, "vocab"))
        targets, dy = mesh("targets", ("batch", None)), mesh("dy", ("batch", None))

        @tf.function
        def step(x, w, targets, dy):
            with tf.GradientTape() as tape:
                tape.watch([x, w])
                loss = token_cross_entropy(rt, tf.cast(x, dtype), tf.cast(w, dtype), targets, budget, keep=0)
                total = tf.reduce_sum(loss * dy)
            dx, dw = tape.gradient(total, [x, w])
            return [rt.gather(t) for t in (loss, dx, dw)]

        loss, dx, dw = (rt.to_host(t).astype(np.float64).tolist() for t in step(x, w, targets, dy))
        out[precision] = {"loss": loss, "dx": dx, "dw": dw}
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
