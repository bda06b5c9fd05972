"""DeepSeek-V3 on the decoder LMs' shared stack (benchmarks/lm/decoder.py): multi-head latent attention with
YaRN RoPE in every layer (benchmarks/lm/mla.py), a dense SwiGLU feed-forward in the first
`first_dense_layers` layers and the DeepSeek MoE (moe.py) after them; untied embeddings, RMSNorm pre-norm.
Attention crosses documents and positions never reset (the reference's data settings). Named dimensions:
`heads`, `experts`, `ff` and `vocab`.

Multi-token prediction (model.mtp_layers = 1 as NVIDIA-NeMo/Megatron-Bridge@21b02e0:
src/megatron/bridge/recipes/deepseek/deepseek_v3.py sets it; NVIDIA/Megatron-LM@b0cc270:
megatron/core/transformer/multi_token_prediction.py): from the
main model's final hidden states H (after the final norm) and the embedding of each position's next token,
u = [enorm(Emb(x_i+1)) ; hnorm(H_i)] W_eh (the embedding half first), one more full MLA + MoE layer, its own
final norm, and the shared embedding and LM head: position i predicts token i + 2."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from harness.nn.layers import RMSNorm, normal, vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.deepseekv3_671b.config import ModelConfig
from benchmarks.deepseekv3_671b.moe import DeepseekMoE
from benchmarks.lm.decoder import Decoder, DecoderLayer, remat
from benchmarks.lm.ffn import SwiGLU
from benchmarks.lm.mla import MLAttention

NAME = "deepseek"  # the decoder's variable path prefix


class DeepseekV3(Decoder):
    """Each layer's extras: None for a dense layer, its MoE `Routing` for the others."""

    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, seq: int) -> None:
        super().__init__(runtime, NAME, seed, cfg, seq)
        self.mtp = MultiTokenPrediction(self) if cfg.mtp_layers else None

    def attention(self, path: str, layer: int) -> MLAttention:
        c = self.cfg
        return MLAttention(self.runtime, path, self.seed, c.hidden_size, c.mla(), c.rope_base, c.rope_scaling(),
                           c.init_stddev, c.output_stddev())

    def ffn(self, path: str, layer: int) -> SwiGLU | DeepseekMoE:
        c = self.cfg
        if c.is_moe(layer):
            return DeepseekMoE(self.runtime, path, self.seed, c)
        return SwiGLU(self.runtime, path, self.seed, c.hidden_size, c.ffn_hidden, c.init_stddev, c.output_stddev())


class MultiTokenPrediction:
    """The MTP block of depth 1 (variables under `deepseek/mtp_0/`): norms `enorm`, `hnorm`, the projection
    `eh_proj/kernel` [2 x hidden, hidden], a decoder layer (index num_layers: MLA and the MoE) and `final_norm`."""

    def __init__(self, decoder: DeepseekV3) -> None:
        c, rt, seed = decoder.cfg, decoder.runtime, decoder.seed
        path, m = f"{NAME}/mtp_0", c.hidden_size
        self.decoder = decoder
        self.enorm = RMSNorm(rt, f"{path}/enorm", seed, m, c.norm_epsilon)
        self.hnorm = RMSNorm(rt, f"{path}/hnorm", seed, m, c.norm_epsilon)
        self.eh_proj = rt.variable(f"{path}/eh_proj/kernel", (2 * m, m), (None, None),
                                   normal(c.init_stddev, f"{path}/eh_proj/kernel", seed))
        self.layer = DecoderLayer(decoder, f"{path}/layer", c.num_layers)
        self.final_norm = RMSNorm(rt, f"{path}/final_norm", seed, m, c.norm_epsilon)

    def __call__(self, hidden: tf.Tensor, next_tokens: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Hidden states [b, s, hidden] (after the block's final norm; the shared head turns them into logits
        for the token after next) from the main model's final hidden states and next_tokens [b, s], each
        position's next input token; and the layer's routing."""
        d = self.decoder
        e = tf.cast(vocab_parallel_lookup(d.runtime, d.embeddings, next_tokens), d.dtype)
        u = tf.einsum("bsk,km->bsm", tf.concat([self.enorm(e), self.hnorm(hidden)], -1),
                      tf.cast(self.eh_proj, d.dtype))
        y, routing = remat(self.layer, u, None) if d.cfg.remat else self.layer(u, None)
        return self.final_norm(y), routing
