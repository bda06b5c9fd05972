"""The decoder LMs' feed-forward: SwiGLU, silu(x W_gate) * (x W_up), then W_down. The dense block here and
gpt_oss_20b's experts (benchmarks/gpt_oss_20b/moe.py) compute the same math through these functions."""
from __future__ import annotations

import tensorflow as tf

from harness.nn.layers import Block, normal, silu
from harness.runtime.base import Runtime


def swiglu_hidden(gate: tf.Tensor, up: tf.Tensor) -> tf.Tensor:
    """The hidden units from the gate and up projections: silu(gate) * up (harness.nn.layers.silu: no constant
    operand in its custom gradient, which a DTensor mesh can move out of the train loop)."""
    return silu(gate) * up


def swiglu(x: tf.Tensor, w_gate: tf.Tensor, w_up: tf.Tensor, w_down: tf.Tensor, up_equation: str,
           down_equation: str) -> tf.Tensor:
    """SwiGLU of x with einsums: `up_equation` (x, W_gate or W_up -> hidden) and `down_equation` (hidden,
    W_down -> out), so batched or per-expert weights take the same path."""
    hidden = swiglu_hidden(tf.einsum(up_equation, x, w_gate), tf.einsum(up_equation, x, w_up))
    return tf.einsum(down_equation, hidden, w_down)


class SwiGLU(Block):
    """The dense SwiGLU feed-forward; the hidden units on `ff`, so tensor parallelism splits them and sums
    the down projection (one all-reduce). Weights: normal(stddev), the down projection normal(output_stddev)."""

    def __init__(self, runtime: Runtime, path: str, seed: int, hidden: int, ffn_hidden: int, stddev: float,
                 output_stddev: float) -> None:
        super().__init__(runtime, path, seed)
        init = lambda name, sd: normal(sd, f"{path}/{name}/kernel", seed)  # noqa: E731
        self.w_gate = self.var("gate/kernel", (hidden, ffn_hidden), (None, "ff"), init("gate", stddev))
        self.w_up = self.var("up/kernel", (hidden, ffn_hidden), (None, "ff"), init("up", stddev))
        self.w_down = self.var("down/kernel", (ffn_hidden, hidden), ("ff", None), init("down", output_stddev))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        dt = self.dtype
        return swiglu(x, tf.cast(self.w_gate, dt), tf.cast(self.w_up, dt), tf.cast(self.w_down, dt),
                      "bsm,mf->bsf", "bsf,fm->bsm")
