"""gpt_oss_20b in Hugging Face layout (`GptOssForCausalLM`): tensor names, shapes and config.json keys.

Beside the decoder's tensors (benchmarks/lm/hf_names.py) each layer holds `self_attn.sinks` [heads] and
q/k/v/o biases, `mlp.router.{weight [experts, hidden], bias}` and `mlp.experts.{gate_up_proj [experts, hidden,
2 x ff], gate_up_proj_bias, down_proj [experts, ff, hidden], down_proj_bias}` (expert tensors are in x out and
have no `.weight` suffix). gate_up_proj interleaves its columns: gate on the even ones, up on the odd. The
published openai/gpt-oss-20b stores the expert matrices as MXFP4: `<name>_blocks` uint8 [experts, out, in/32,
16] (two e2m1 values a byte, low nibble first) and `<name>_scales` uint8 [experts, out, in/32] (a power of two
2^(s - 127) per 32 values), out x in, transposed here after decoding.

The published architecture's sinks and biases load into the model's variables for them when its options
create them (model.attention_sinks, attention_bias, router_bias, expert_bias; FEATURE_PATHS); a tensor the
model has no variable for is accepted only when it changes nothing (zero biases, sinks <= -1e4), and export
writes it so: then transformers computes what the model does. The clamped SwiGLU (`swiglu_limit`,
`swiglu_alpha`) and YaRN (`rope_parameters`) are config.json keys, checked against model.swiglu_* and
model.rope_*; the `+ 1` transformers adds to the up projection is no key (model.swiglu_up_offset must be 1 for
a checkpoint transformers computes unpatched). transformers' gpt-oss has no q/k norm: a model with
model.qk_norm (the MLPerf reference's) neither imports nor exports.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from harness.errors import HarnessError

from harness.nn.hf_checkpoint import Entry, Layout, Neutral, Out, Part, direct, linear_out, same, sink_neutral, \
    transposed, zero_neutral

from benchmarks.lm.hf_names import TIE, decoder_config_problems, decoder_entries

ARCH = "GptOssForCausalLM"
NO_CLAMP = 1e9   # a swiglu_limit this large clamps nothing
# The model's variables for the published architecture's extra tensors, by layer path (used when they exist);
# gate_up_proj_bias interleaves the gate and up biases as gate_up_proj does the kernels.
FEATURE_PATHS = {
    "self_attn.sinks": "attention/sinks",
    "self_attn.q_proj.bias": "attention/query/bias", "self_attn.k_proj.bias": "attention/key/bias",
    "self_attn.v_proj.bias": "attention/value/bias", "self_attn.o_proj.bias": "attention/output/bias",
    "mlp.router.bias": "moe/router/bias",
    "mlp.experts.gate_up_proj_bias": ("moe/experts/gate/bias", "moe/experts/up/bias"),
    "mlp.experts.down_proj_bias": "moe/experts/down/bias",
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
    kind = scaling["rope_type"]
    if kind != m.rope_type:
        c.problems.append(f"config.json RoPE rope_type={kind}: the model has " + (
            "plain RoPE (model.rope_type=default)" if m.rope_type == "default" else f"model.rope_type={m.rope_type}"))
    elif kind == "yarn":
        for key, want, model_key in (("factor", m.rope_scaling_factor, "rope_scaling_factor"),
                                     ("original_max_position_embeddings", m.rope_original_context,
                                      "rope_original_context"),
                                     ("beta_fast", m.rope_beta_fast, "rope_beta_fast"),
                                     ("beta_slow", m.rope_beta_slow, "rope_beta_slow")):
            got = scaling.get(key)
            if got is None or not math.isclose(float(got), float(want), rel_tol=1e-6):
                c.problems.append(f"config.json RoPE {key}={got}, the model has model.{model_key}={want:g}")
        if bool(scaling.get("truncate", True)) != m.rope_truncate:
            c.problems.append(f"config.json RoPE truncate={scaling.get('truncate', True)}, the model has "
                              f"model.rope_truncate={m.rope_truncate}")
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            if scaling.get(key) is not None:
                c.problems.append(f"config.json RoPE {key}={scaling[key]}: the model's YaRN scales attention by "
                                  f"0.1 ln(factor) + 1")
    alpha, limit = hf.get("swiglu_alpha", 1.702), hf.get("swiglu_limit", 7.0)
    odd = [(k, v) for k, v in (("swiglu_alpha", alpha), ("swiglu_limit", limit))
           if isinstance(v, bool) or not isinstance(v, (int, float))]
    if odd:
        c.problems.append(f"config.json {odd[0][0]}={odd[0][1]!r} is not a number")
        return c.problems
    clamps = limit < NO_CLAMP
    if not math.isclose(alpha, m.swiglu_alpha) or clamps != (m.swiglu_limit > 0) or (
            clamps and not math.isclose(limit, m.swiglu_limit)):
        c.problems.append(f"config.json swiglu_alpha={alpha}, swiglu_limit={limit}: the model's experts have "
                          f"model.swiglu_alpha={m.swiglu_alpha:g}, model.swiglu_limit={m.swiglu_limit:g} (0: no clamp)")
    if m.qk_norm:
        c.problems.append("the model normalizes queries and keys (model.qk_norm, the MLPerf reference's "
                          "qk_layernorm): transformers' gpt-oss does not (model.qk_norm=false)")
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
    g = heads // kv
    # HF shape, then the model variable's (sinks and q/k/v biases are split by kv head and query group)
    extra_shapes = {"self_attn.sinks": ((heads,), (kv, g)), "self_attn.q_proj.bias": ((heads * d,), (kv, g, d)),
                    "self_attn.k_proj.bias": ((kv * d,), (kv, d)), "self_attn.v_proj.bias": ((kv * d,), (kv, d)),
                    "self_attn.o_proj.bias": ((h,), (h,)), "mlp.router.bias": ((e,), (e,)),
                    "mlp.experts.gate_up_proj_bias": ((e, 2 * f), (e, f)),
                    "mlp.experts.down_proj_bias": ((e, h), (e, h))}
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
        for suffix, (shape, ours) in extra_shapes.items():
            name, where = f"{hf}.{suffix}", FEATURE_PATHS[suffix]
            paths = tuple(f"{us}/{p}" for p in (where if isinstance(where, tuple) else (where,)))
            if all(have(p) for p in paths) and len(paths) == 2:      # gate and up biases, interleaved
                part = Part(name, shape)
                entries += [interleaved(paths[0], ours, part, 0), interleaved(paths[1], ours, part, 1)]
                outs.append(Out(name, shape, paths, lambda gate, up: np.stack([gate, up], -1).reshape(
                    *gate.shape[:-1], -1)))
            elif all(have(p) for p in paths):
                entries.append(direct(paths[0], ours, Part(name, shape)))
                outs.append(Out(name, shape, paths, same(shape)))
            else:
                neutral.append((sink_neutral if suffix.endswith("sinks") else zero_neutral)(name, shape))
    return Layout(entries, outs, neutral, ignore=lambda n: n.endswith("rotary_emb.inv_freq"), tie=TIE)


def hf_config(m: Any, seq_length: int, dtype: str) -> dict[str, Any]:
    """config.json for `GptOssForCausalLM` as this model computes: its RoPE (plain or YaRN) and expert GLU
    (alpha, clamp; the `+ 1` on the up projection is not a config key: transformers always adds it, so a model
    without model.swiglu_up_offset=1 differs; see docs/checkpoints.md). A model with q/k norm has no such
    config: refused."""
    if m.qk_norm:
        raise HarnessError("model.qk_norm: the model normalizes queries and keys (the MLPerf reference's "
                           "qk_layernorm), which transformers' GptOssForCausalLM cannot express")
    rope_scaling: dict[str, Any] = {"rope_type": "default"}   # said, not left out: GptOssConfig's default is YaRN
    if m.rope_type == "yarn":
        rope_scaling = {"rope_type": "yarn", "factor": m.rope_scaling_factor,
                        "original_max_position_embeddings": m.rope_original_context, "beta_fast": m.rope_beta_fast,
                        "beta_slow": m.rope_beta_slow, "truncate": m.rope_truncate}
    return {"architectures": [ARCH], "model_type": "gpt_oss", "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size, "intermediate_size": m.expert_hidden, "num_hidden_layers": m.num_layers,
            "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim,
            "num_local_experts": m.num_experts, "num_experts_per_tok": m.experts_per_token,
            "sliding_window": m.sliding_window,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(m.num_layers)],
            "rms_norm_eps": m.norm_epsilon, "rope_theta": m.rope_base, "rope_scaling": rope_scaling,
            "swiglu_alpha": m.swiglu_alpha, "swiglu_limit": m.swiglu_limit or NO_CLAMP,
            "max_position_embeddings": seq_length, "attention_bias": True, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "initializer_range": m.init_stddev, "output_router_logits": False,
            "router_aux_loss_coef": m.load_balancing_coef, "use_cache": True, "torch_dtype": dtype}
