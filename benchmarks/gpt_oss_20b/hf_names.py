"""gpt_oss_20b in Hugging Face layout (`GptOssForCausalLM`): tensor names, shapes and config.json keys.

Beside the decoder's tensors (benchmarks/lm/hf_names.py) each layer holds `self_attn.sinks` [heads] and
q/k/v/o biases, `mlp.router.{weight [experts, hidden], bias}` and `mlp.experts.{gate_up_proj [experts, hidden,
2 x ff], gate_up_proj_bias, down_proj [experts, ff, hidden], down_proj_bias}` (expert tensors are in x out and
have no `.weight` suffix). gate_up_proj interleaves its columns: gate on the even ones, up on the odd. The
published openai/gpt-oss-20b stores the expert matrices as MXFP4: `<name>_blocks` uint8 [experts, out, in/32,
16] (two e2m1 values a byte, low nibble first) and `<name>_scales` uint8 [experts, out, in/32] (a power of two
2^(s - 127) per 32 values), out x in, transposed here after decoding.

A tensor of the published architecture that this model has no variable for (sinks, biases) is accepted only
when it changes nothing (zero biases, sinks <= -1e4), and export writes it so: then transformers computes what
the model does. The clamped SwiGLU (`swiglu_limit`, `swiglu_alpha`, the `+ 1` on the up projection) and YaRN are
config.json keys: a checkpoint that asks for them is refused unless the model computes them. Variable paths for
those features, where the model has them, are in FEATURE_PATHS.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from harness.nn.hf_checkpoint import Entry, Layout, Neutral, Out, Part, direct, linear_out, same, sink_neutral, \
    transposed, zero_neutral

from benchmarks.lm.hf_names import decoder_config_problems, decoder_entries

ARCH = "GptOssForCausalLM"
NO_CLAMP = 1e9   # a swiglu_limit this large clamps nothing
# The model's variables for the published architecture's extra tensors, by layer path (used when they exist).
FEATURE_PATHS = {
    "self_attn.sinks": "attention/sinks",
    "self_attn.q_proj.bias": "attention/query/bias", "self_attn.k_proj.bias": "attention/key/bias",
    "self_attn.v_proj.bias": "attention/value/bias", "self_attn.o_proj.bias": "attention/output/bias",
    "mlp.router.bias": "moe/router/bias",
    "mlp.experts.gate_up_proj_bias": "moe/experts/gate_up/bias", "mlp.experts.down_proj_bias": "moe/experts/down/bias",
}
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 blocks [..., rows, groups, 16] (uint8) and scales [..., rows, groups] -> float32 [..., rows,
    groups x 32], in the stored out x in orientation."""
    low, high = FP4[blocks & 0x0F], FP4[blocks >> 4]
    values = np.stack([low, high], -1).reshape(*blocks.shape[:-1], 32)
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*scales.shape[:-1], -1)


def interleaved(path: str, shape: tuple[int, ...], part: Part, which: int) -> Entry:
    """gate (which 0: even columns) or up (1: odd) of gate_up_proj [experts, hidden, 2 x ff]; a block of
    columns [a, b) is columns [2a, 2b) of the tensor, every other one."""
    def block(read, index):
        cols = index[-1].indices(shape[-1])[:2]
        return read(part.name, (*index[:-1], slice(2 * cols[0], 2 * cols[1])))[..., which::2]
    return Entry(path, shape, (part,), lambda a: a[..., which::2], block)


def config_problems(hf: dict[str, Any], m: Any) -> list[str]:
    """Where a GPT-OSS checkpoint's config.json differs from the model config."""
    c, _, scaling = decoder_config_problems(hf, m, "model.expert_hidden", m.expert_hidden, 150000.0)
    c.same("num_local_experts", m.num_experts, "model.num_experts")
    c.same("num_experts_per_tok", m.experts_per_token, "model.experts_per_token")
    c.same("sliding_window", m.sliding_window, "model.sliding_window")
    want_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(m.num_layers)]
    if hf.get("layer_types", want_types) != want_types:
        c.problems.append(f"config.json layer_types={hf['layer_types']}: the model slides its window on the even "
                          f"layers only")
    if scaling["rope_type"] != "default":
        c.problems.append(f"config.json RoPE rope_type={scaling['rope_type']}: the model has plain RoPE")
    alpha, limit = hf.get("swiglu_alpha", 1.702), hf.get("swiglu_limit", 7.0)
    if alpha != 1.0 or limit < NO_CLAMP:
        c.problems.append(f"config.json swiglu_alpha={alpha}, swiglu_limit={limit}: the model's experts compute a "
                          f"plain SwiGLU (alpha 1, no clamp)")
    c.flag("tie_word_embeddings", False, False, "the model's output layer is its own weight")
    if hf.get("quantization_config") and hf["quantization_config"].get("quant_method") not in (None, "mxfp4"):
        c.problems.append(f"config.json quantization {hf['quantization_config'].get('quant_method')}: only mxfp4 "
                          f"expert weights are decoded")
    return c.problems


def layout(m: Any, ckpt_names: set[str], have: Callable[[str], bool]) -> Layout:
    """The GPT-OSS model (decoder name `gpt_oss`) <-> `GptOssForCausalLM`'s tensors. `have(path)`: the model
    has that variable (the published architecture's extras, FEATURE_PATHS), else the tensor must be neutral."""
    entries, outs = decoder_entries("gpt_oss", m, ckpt_names)
    h, e, f, heads, kv, d = m.hidden_size, m.num_experts, m.expert_hidden, m.num_heads, m.num_kv_heads, m.head_dim
    neutral: list[Neutral] = []
    extra_shapes = {"self_attn.sinks": (heads,), "self_attn.q_proj.bias": (heads * d,),
                    "self_attn.k_proj.bias": (kv * d,), "self_attn.v_proj.bias": (kv * d,),
                    "self_attn.o_proj.bias": (h,), "mlp.router.bias": (e,),
                    "mlp.experts.gate_up_proj_bias": (e, 2 * f), "mlp.experts.down_proj_bias": (e, h)}
    for i in range(m.num_layers):
        hf, us = f"model.layers.{i}", f"gpt_oss/layer_{i}"
        entries.append(transposed(f"{us}/moe/router/kernel", (h, e), Part(f"{hf}.mlp.router.weight", (e, h))))
        outs.append(Out(f"{hf}.mlp.router.weight", (e, h), (f"{us}/moe/router/kernel",), linear_out(h)))
        gate_up, down = f"{hf}.mlp.experts.gate_up_proj", f"{hf}.mlp.experts.down_proj"
        if f"{gate_up}_blocks" in ckpt_names:
            g = h // 32
            gu = (Part(f"{gate_up}_blocks", (e, 2 * f, g, 16), dtypes=("U8",)),
                  Part(f"{gate_up}_scales", (e, 2 * f, g), dtypes=("U8",)))
            dn = (Part(f"{down}_blocks", (e, h, f // 32, 16), dtypes=("U8",)),
                  Part(f"{down}_scales", (e, h, f // 32), dtypes=("U8",)))
            entries += [Entry(f"{us}/moe/experts/gate/kernel", (e, h, f), gu,
                              lambda b, s: mxfp4(b, s).transpose(0, 2, 1)[..., ::2]),
                        Entry(f"{us}/moe/experts/up/kernel", (e, h, f), gu,
                              lambda b, s: mxfp4(b, s).transpose(0, 2, 1)[..., 1::2]),
                        Entry(f"{us}/moe/experts/down/kernel", (e, f, h), dn,
                              lambda b, s: mxfp4(b, s).transpose(0, 2, 1))]
        else:
            gu = Part(gate_up, (e, h, 2 * f))
            entries += [interleaved(f"{us}/moe/experts/gate/kernel", (e, h, f), gu, 0),
                        interleaved(f"{us}/moe/experts/up/kernel", (e, h, f), gu, 1),
                        direct(f"{us}/moe/experts/down/kernel", (e, f, h), Part(down, (e, f, h)))]
        outs += [Out(gate_up, (e, h, 2 * f), (f"{us}/moe/experts/gate/kernel", f"{us}/moe/experts/up/kernel"),
                     lambda gate, up: np.stack([gate, up], -1).reshape(*gate.shape[:-1], -1)),
                 Out(down, (e, f, h), (f"{us}/moe/experts/down/kernel",), same((e, f, h)))]
        for suffix, shape in extra_shapes.items():
            name, path = f"{hf}.{suffix}", f"{us}/{FEATURE_PATHS[suffix]}"
            if have(path):
                entries.append(direct(path, shape, Part(name, shape)))
                outs.append(Out(name, shape, (path,), same(shape)))
            else:
                neutral.append((sink_neutral if suffix.endswith("sinks") else zero_neutral)(name, shape))
    return Layout(entries, outs, neutral, ignore=lambda n: n.endswith("rotary_emb.inv_freq"))


def hf_config(m: Any, seq_length: int, dtype: str) -> dict[str, Any]:
    """config.json for `GptOssForCausalLM` as this model computes: plain RoPE, alpha 1 and no clamp (the `+ 1`
    on the up projection is not a config key: transformers always adds it, so its logits differ; see
    docs/checkpoints.md)."""
    return {"architectures": [ARCH], "model_type": "gpt_oss", "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size, "intermediate_size": m.expert_hidden, "num_hidden_layers": m.num_layers,
            "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim,
            "num_local_experts": m.num_experts, "num_experts_per_tok": m.experts_per_token,
            "sliding_window": m.sliding_window,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(m.num_layers)],
            "rms_norm_eps": m.norm_epsilon, "rope_theta": m.rope_base,
            "rope_scaling": {"rope_type": "default"},   # said, not left out: GptOssConfig's default is YaRN
            "swiglu_alpha": 1.0, "swiglu_limit": NO_CLAMP,
            "max_position_embeddings": seq_length, "attention_bias": True, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "initializer_range": m.init_stddev, "output_router_logits": False,
            "router_aux_loss_coef": m.load_balancing_coef, "use_cache": True, "torch_dtype": dtype}
