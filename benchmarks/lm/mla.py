"""Multi-head latent attention (MLA, DeepSeek-V2/V3): queries through a low-rank bottleneck with its own
RMSNorm, keys and values from one compressed latent per token (RMSNorm'd, then expanded per head), and a
decoupled RoPE key: a few rotary dimensions computed once per token from the hidden state and shared by every
head. Causal over the whole row, through the decoder LMs' attention kernel (attention.py `_attend`).

Per token h and head i (DeepSeek-V3's sizes in brackets):
    c_q = RMSNorm(h W_qa)                   q_lora_rank [1536]
    [q_nope_i ; q_rope_i] = (c_q W_qb)_i    nope [128] + rope [64] per head
    [c_kv ; k_rope] = h W_kva               kv_lora_rank [512] + rope [64] (one per token)
    [k_nope_i ; v_i] = (RMSNorm(c_kv) W_kvb)_i   nope [128] + v [128] per head
    q_i = [q_nope_i ; RoPE(q_rope_i)],  k_i = [k_nope_i ; RoPE(k_rope)]
    out = sum_i softmax(q_i k_i^T * scale + causal) v_i W_o,i
The scale is mscale(factor, mscale_all_dim)^2 / sqrt(nope + rope) under YaRN (1 / sqrt(nope + rope) without).

The rotary dimensions are in rotate-half order (pairs (j, j + rope / 2)); DeepSeek's checkpoints store them
in interleaved pairs (2j, 2j + 1), which the importer permutes once (benchmarks/deepseekv3_671b/hf_names.py).

Named dimensions: `heads` on the up-projections and the output projection, so a mesh may split heads; the
down-projections, their norms and the shared rope key are whole on every device (they read the whole hidden
state and every head uses them).
"""
from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from harness.nn.layers import Block, RMSNorm, YarnScaling, normal, rotary
from harness.runtime.base import Runtime

from benchmarks.lm.attention import causal_attention


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's YaRN magnitude: 0.1 * mscale * ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass(frozen=True)
class DeepseekYarn(YarnScaling):
    """YaRN as DeepSeek-V3 configures it (transformers `_compute_yarn_parameters` with mscale and
    mscale_all_dim): the frequencies as YarnScaling's (floor/ceil correction range), cos and sin scaled by
    mscale(factor, mscale) / mscale(factor, mscale_all_dim) (1.0 at DeepSeek-V3's 1.0 / 1.0), and the
    softmax scale multiplied by mscale(factor, mscale_all_dim)^2 (`softmax_factor`)."""
    mscale: float = 1.0
    mscale_all_dim: float = 1.0

    def attention_factor(self) -> float:
        return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)

    def softmax_factor(self) -> float:
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


@dataclasses.dataclass(frozen=True)
class MlaShape:
    """MLA's sizes: heads, the two latent ranks and the per-head nope/rope/value widths."""
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_dim: int

    @property
    def qk_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim


# The q and kv latent norms' epsilon: transformers builds them as DeepseekV3RMSNorm(rank) at its default 1e-6
# whatever rms_norm_eps says (huggingface/transformers v5.24.0, models/deepseek_v3/modeling_deepseek_v3.py,
# q_a_layernorm / kv_a_layernorm); the MLPerf reference's (Megatron) takes layernorm_epsilon, 1e-6 in the
# DeepSeek-V3 recipe. A checkpoint with rms_norm_eps 1e-5 thus keeps 1e-6 here.
LATENT_NORM_EPSILON = 1e-6


class MLAttention(Block):
    """Causal MLA over the whole row (`__call__(x, segments)`: segments must be None, the reference's
    attention crosses documents). Kernels [in, ...out] as the harness's other blocks: q_down [m, q_lora],
    q_up [q_lora, heads, nope + rope], kv_down [m, kv_lora + rope], kv_up [kv_lora, heads, nope + v],
    output [heads, v, m]; norms q_norm [q_lora], kv_norm [kv_lora] with LATENT_NORM_EPSILON."""

    def __init__(self, runtime: Runtime, path: str, seed: int, hidden: int, shape: MlaShape, rope_base: float,
                 rope_scaling: YarnScaling | None, stddev: float, output_stddev: float) -> None:
        super().__init__(runtime, path, seed)
        s, m = shape, hidden
        self.shape, self.rope_base, self.rope_scaling = shape, rope_base, rope_scaling
        init = lambda name, sd=stddev: normal(sd, f"{path}/{name}/kernel", seed)  # noqa: E731
        self.w_q_down = self.var("q_down/kernel", (m, s.q_lora_rank), (None, None), init("q_down"))
        self.q_norm = RMSNorm(runtime, f"{path}/q_norm", seed, s.q_lora_rank, LATENT_NORM_EPSILON)
        self.w_q_up = self.var("q_up/kernel", (s.q_lora_rank, s.heads, s.qk_dim), (None, "heads", None),
                               init("q_up"))
        self.w_kv_down = self.var("kv_down/kernel", (m, s.kv_lora_rank + s.qk_rope_dim), (None, None),
                                  init("kv_down"))
        self.kv_norm = RMSNorm(runtime, f"{path}/kv_norm", seed, s.kv_lora_rank, LATENT_NORM_EPSILON)
        self.w_kv_up = self.var("kv_up/kernel", (s.kv_lora_rank, s.heads, s.qk_nope_dim + s.v_dim),
                                (None, "heads", None), init("kv_up"))
        self.w_out = self.var("output/kernel", (s.heads, s.v_dim, m), ("heads", None, None),
                              init("output", output_stddev))

    def softmax_scale(self) -> float:
        factor = self.rope_scaling.softmax_factor() if isinstance(self.rope_scaling, DeepseekYarn) else 1.0
        return factor / math.sqrt(self.shape.qk_dim)

    def _w(self, kernel: tf.Variable) -> tf.Tensor:
        return tf.cast(kernel, self.dtype)

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None = None) -> tf.Tensor:
        if segments is not None:
            raise ValueError("MLA attends over the whole row: no document segments")
        s = self.shape
        b, seq, _ = x.shape
        c_q = self.q_norm(tf.einsum("bsm,mr->bsr", x, self._w(self.w_q_down)))
        q = tf.einsum("bsr,rhd->bshd", c_q, self._w(self.w_q_up))                     # [b, s, H, nope + rope]
        latent = tf.einsum("bsm,mr->bsr", x, self._w(self.w_kv_down))
        c_kv, k_rope = latent[..., :s.kv_lora_rank], latent[..., s.kv_lora_rank:]
        kv = tf.einsum("bsr,rhd->bshd", self.kv_norm(c_kv), self._w(self.w_kv_up))     # [b, s, H, nope + v]
        k_nope, v = kv[..., :s.qk_nope_dim], kv[..., s.qk_nope_dim:]
        q_rope = rotary(q[..., s.qk_nope_dim:], self.rope_base, self.rope_scaling)
        k_rope = rotary(tf.expand_dims(k_rope, 2), self.rope_base, self.rope_scaling)  # [b, s, 1, rope]
        q = tf.concat([q[..., :s.qk_nope_dim], q_rope], -1)
        k = tf.concat([k_nope, tf.broadcast_to(k_rope, [b, seq, s.heads, s.qk_rope_dim])], -1)
        ctx = causal_attention(tf.expand_dims(q, 3), k, v, xla=self.runtime.jit_compile,
                               scale=self.softmax_scale())                               # [b, s, H, 1, v]
        ctx = tf.reshape(ctx, [b, seq, s.heads, s.v_dim])
        return tf.einsum("bshd,hdm->bsm", ctx, self._w(self.w_out))
