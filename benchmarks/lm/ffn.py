"""The decoder LMs' feed-forward: SwiGLU, silu(x W_gate) * (x W_up), then W_down. The dense block here and
gpt_oss_20b's experts (benchmarks/gpt_oss_20b/moe.py) compute the same math through these functions; the
experts may use gpt-oss's clamped variant (`Glu`)."""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from harness.nn.layers import Block, normal, silu
from harness.runtime.base import Runtime


@dataclasses.dataclass(frozen=True)
class Glu:
    """The gated unit's activation: gate * sigmoid(alpha * gate) * (up + up_offset), with gate clamped to at
    most `limit` and up to [-limit, limit] when limit > 0. The default (alpha 1, no clamp, offset 0) is plain
    SwiGLU, silu(gate) * up (Megatron `swiglu`, the MLPerf Primus reference); gpt-oss's published experts
    use alpha 1.702, limit 7 and offset 1 (transformers GptOssExperts._apply_gate; Megatron
    `quick_gelu` with activation_func_clamp_value 7 and glu_linear_offset 1, NVIDIA's NeMo submission)."""
    alpha: float = 1.0
    limit: float = 0.0
    up_offset: float = 0.0


SWIGLU = Glu()


def swiglu_hidden(gate: tf.Tensor, up: tf.Tensor, act: Glu = SWIGLU) -> tf.Tensor:
    """The hidden units from the gate and up projections: silu(gate) * up (harness.nn.layers.silu: no constant
    operand in its custom gradient, which a DTensor mesh can move out of the train loop), or `act`'s variant.
    A clamped value gets no gradient past its limit (as torch.clamp)."""
    if act.limit > 0:
        gate = tf.minimum(gate, tf.cast(act.limit, gate.dtype))
        up = tf.clip_by_value(up, tf.cast(-act.limit, up.dtype), tf.cast(act.limit, up.dtype))
    glu = silu(gate) if act.alpha == 1.0 else gate * tf.sigmoid(gate * tf.cast(act.alpha, gate.dtype))
    if act.up_offset:
        up = up + tf.cast(act.up_offset, up.dtype)
    return glu * up


def swiglu(x: tf.Tensor, w_gate: tf.Tensor, w_up: tf.Tensor, w_down: tf.Tensor, up_equation: str,
           down_equation: str, act: Glu = SWIGLU, biases: tuple[tf.Tensor, tf.Tensor, tf.Tensor] | None = None
           ) -> tf.Tensor:
    """SwiGLU of x with einsums: `up_equation` (x, W_gate or W_up -> hidden) and `down_equation` (hidden,
    W_down -> out), so batched or per-expert weights take the same path; `biases` (gate, up, down), each
    shaped to broadcast over its projection's output, are added after each projection."""
    gate, up = tf.einsum(up_equation, x, w_gate), tf.einsum(up_equation, x, w_up)
    if biases is not None:
        gate, up = gate + biases[0], up + biases[1]
    out = tf.einsum(down_equation, swiglu_hidden(gate, up, act), w_down)
    return out if biases is None else out + biases[2]


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
        weights = tf.cast(self.w_gate, dt), tf.cast(self.w_up, dt), tf.cast(self.w_down, dt)
        if self.runtime.laid_out:  # a DTensor mesh: the einsums keep the rows' and units' named layouts
            return swiglu(x, *weights, "bsm,mf->bsf", "bsf,fm->bsm")
        # Elsewhere the tokens as the rows of plain 2-D matmuls: XLA's CPU backend runs the einsums' gradients
        # (two contracting axes, b and s) about a fifth slower (scripts/bench_lm_step.py's wide shape: one
        # layer's SwiGLU forward and backward 113 ms as einsums, 90 as 2-D matmuls; 92 without XLA either way).
        rows = swiglu(tf.reshape(x, [-1, x.shape[-1]]), *weights, "tm,mf->tf", "tf,fm->tm")
        return tf.reshape(rows, tf.shape(x))
