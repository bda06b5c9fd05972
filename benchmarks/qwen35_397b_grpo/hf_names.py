"""The Qwen3.5 MoE text model (model.py, decoder name `qwen35`) in Hugging Face layout: transformers 5's
`Qwen3_5MoeForCausalLM` tensor names, shapes and config.json keys (harness/nn/hf_checkpoint.py reads and writes
them).

Per layer L under `model.layers.L.`: `input_layernorm`, `post_attention_layernorm` (w of the (1 + w) norms,
stored as is); gated attention layers `self_attn.{q_proj [heads x 2 x head_dim, hidden], k_proj, v_proj,
o_proj, q_norm, k_norm}`, q_proj HEAD-INTERLEAVED (head h's rows [2dh, 2dh + d) are its query, the next d its
output gate: transformers views it [..., heads, 2d] and chunks the last axis); Gated DeltaNet layers
`linear_attn.*` (deltanet.py's HF_NAMES); every layer `mlp.gate.weight [experts, hidden]` (the router),
`mlp.experts.gate_up_proj [experts, 2 x ff, hidden]` (gate rows first, then up: `.chunk(2, dim=-1)` of x W^T)
and `mlp.experts.down_proj [experts, hidden, ff]` (fused, no `.weight` suffix, out x in),
`mlp.shared_expert.{gate,up,down}_proj.weight`, `mlp.shared_expert_gate.weight [1, hidden]`
(huggingface/transformers v5.6.0: src/transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py).

The published snapshot is the vision-language `Qwen3_5MoeForConditionalGeneration`: the same text tensors under
`model.language_model.` (its config.json nests them in `text_config`), plus `model.visual.*` and the
multi-token-prediction `mtp.*`, which the benchmark uses neither of (ignored here, as transformers ignores
`mtp.*`). That prefix is read from the checkpoint's names; export writes the text model's.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from harness.nn.hf_checkpoint import Checker, Entry, Format, Layout, Out, Part, direct, linear_out, same, transposed

from benchmarks.lm.hf_names import rope
from benchmarks.qwen35_397b_grpo.config import FULL_ATTENTION, ModelConfig
from benchmarks.qwen35_397b_grpo.deltanet import HF_NAMES, VARIABLE_NAMES, hf_to_variable
from benchmarks.qwen35_397b_grpo.model import NAME

ARCH = "Qwen3_5MoeForCausalLM"
TEXT, VL_TEXT = "model.", "model.language_model."


def _q_and_gate(heads: int, d: int, which: int, shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """q_proj [heads x 2d, hidden] -> the query (which 0) or gate (1) kernel [hidden, kv, g, d]."""
    return lambda w: np.ascontiguousarray(w.reshape(heads, 2, d, -1)[:, which].reshape(heads * d, -1).T
                                          ).reshape(shape)


def _experts_in(f: int, which: int) -> Callable[[np.ndarray], np.ndarray]:
    """gate_up_proj [experts, 2f, hidden] -> the gate (which 0) or up (1) kernel [experts, hidden, f]."""
    return lambda w: np.ascontiguousarray(w[:, which * f:(which + 1) * f].transpose(0, 2, 1))


def _transpose_last(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def layout(m: ModelConfig, ckpt_names: set[str], have: Callable[[str], bool]) -> Layout:
    """The model's variables <-> the checkpoint's tensors (text model or VL snapshot, by the names it holds)."""
    del have
    prefix = VL_TEXT if f"{VL_TEXT}embed_tokens.weight" in ckpt_names else TEXT
    v, h, kv, d, heads = m.vocab_size, m.hidden_size, m.num_kv_heads, m.head_dim, m.num_heads
    g, e, f, fs = heads // kv, m.num_experts, m.expert_hidden, m.shared_expert_hidden
    entries: list[Entry] = []
    outs: list[Out] = []

    def plain(path: str, shape: tuple[int, ...], name: str, hf_shape: tuple[int, ...]) -> None:
        entries.append(direct(path, shape, Part(name, hf_shape)))
        outs.append(Out(name, hf_shape, (path,), same(hf_shape)))

    def linear(path: str, shape: tuple[int, ...], name: str, hf_shape: tuple[int, ...]) -> None:
        entries.append(transposed(path, shape, Part(name, hf_shape)))
        outs.append(Out(name, hf_shape, (path,), linear_out(hf_shape[1])))

    plain(f"{NAME}/embedding/embeddings", (v, h), f"{prefix}embed_tokens.weight", (v, h))
    plain(f"{NAME}/final_norm/gamma", (h,), f"{prefix}norm.weight", (h,))
    tied = "lm_head.weight" not in ckpt_names and f"{prefix}embed_tokens.weight" in ckpt_names
    entries.append(transposed(f"{NAME}/output/kernel", (h, v),
                              Part(f"{prefix}embed_tokens.weight" if tied else "lm_head.weight", (v, h))))
    outs.append(Out("lm_head.weight", (v, h), (f"{NAME}/output/kernel",), linear_out(h)))
    s = m.deltanet()
    dn_shapes = {"in_proj_qkv": (h, s.conv_dim), "in_proj_z": (h, s.value_dim),
                 "in_proj_b": (h, s.linear_num_value_heads), "in_proj_a": (h, s.linear_num_value_heads),
                 "conv1d": (s.linear_conv_kernel_dim, s.conv_dim), "dt_bias": (s.linear_num_value_heads,),
                 "A_log": (s.linear_num_value_heads,), "norm": (s.linear_value_head_dim,),
                 "out_proj": (s.value_dim, h)}
    for i in range(m.num_layers):
        hf, us = f"{prefix}layers.{i}", f"{NAME}/layer_{i}"
        plain(f"{us}/attention_norm/gamma", (h,), f"{hf}.input_layernorm.weight", (h,))
        plain(f"{us}/mlp_norm/gamma", (h,), f"{hf}.post_attention_layernorm.weight", (h,))
        if m.layer_type(i) == FULL_ATTENTION:
            att = f"{us}/attention"
            q_name, q_shape, k_shape = f"{hf}.self_attn.q_proj.weight", (heads * 2 * d, h), (h, kv, g, d)
            for which, var in enumerate(("query", "gate")):
                entries.append(Entry(f"{att}/{var}/kernel", k_shape, (Part(q_name, q_shape),),
                                     _q_and_gate(heads, d, which, k_shape)))
            outs.append(Out(q_name, q_shape, (f"{att}/query/kernel", f"{att}/gate/kernel"),
                            lambda q, gate: np.stack([q.reshape(h, heads, d), gate.reshape(h, heads, d)], 2)
                            .reshape(h, heads * 2 * d).T.copy()))
            linear(f"{att}/key/kernel", (h, kv, d), f"{hf}.self_attn.k_proj.weight", (kv * d, h))
            linear(f"{att}/value/kernel", (h, kv, d), f"{hf}.self_attn.v_proj.weight", (kv * d, h))
            linear(f"{att}/output/kernel", (kv, g, d, h), f"{hf}.self_attn.o_proj.weight", (h, heads * d))
            plain(f"{att}/query_norm/gamma", (d,), f"{hf}.self_attn.q_norm.weight", (d,))
            plain(f"{att}/key_norm/gamma", (d,), f"{hf}.self_attn.k_norm.weight", (d,))
        else:
            for hf_name, (attr, kind) in HF_NAMES.items():
                shape, name = dn_shapes[attr], f"{hf}.linear_attn.{hf_name}"
                hf_shape = {"linear": shape[::-1], "conv": (shape[-1], 1, shape[0])}.get(kind, shape)
                path = f"{us}/attention/{VARIABLE_NAMES[attr]}"
                entries.append(Entry(path, shape, (Part(name, hf_shape),),
                                     lambda w, kind=kind: np.ascontiguousarray(hf_to_variable(kind, w))))
                to_hf = {"linear": lambda a: _transpose_last(a),
                         "conv": lambda a: np.ascontiguousarray(a.T[:, None, :])}.get(kind, lambda a: a)
                outs.append(Out(name, hf_shape, (path,), to_hf))
        moe, hm = f"{us}/moe", f"{hf}.mlp"
        linear(f"{moe}/router/kernel", (h, e), f"{hm}.gate.weight", (e, h))
        gate_up = f"{hm}.experts.gate_up_proj"
        for which, var in enumerate(("gate", "up")):
            entries.append(Entry(f"{moe}/experts/{var}/kernel", (e, h, f), (Part(gate_up, (e, 2 * f, h)),),
                                 _experts_in(f, which)))
        outs.append(Out(gate_up, (e, 2 * f, h), (f"{moe}/experts/gate/kernel", f"{moe}/experts/up/kernel"),
                        lambda gate, up: np.concatenate([_transpose_last(gate), _transpose_last(up)], 1)))
        down = f"{hm}.experts.down_proj"
        entries.append(Entry(f"{moe}/experts/down/kernel", (e, f, h), (Part(down, (e, h, f)),), _transpose_last))
        outs.append(Out(down, (e, h, f), (f"{moe}/experts/down/kernel",), _transpose_last))
        if fs:
            for proj, shape in (("gate", (h, fs)), ("up", (h, fs)), ("down", (fs, h))):
                linear(f"{moe}/shared_expert/{proj}/kernel", shape, f"{hm}.shared_expert.{proj}_proj.weight",
                       shape[::-1])
            linear(f"{moe}/shared_expert_gate/kernel", (h, 1), f"{hm}.shared_expert_gate.weight", (1, h))
    return Layout(entries, outs, ignore=lambda n: n.startswith(("mtp.", "model.visual.")) or
                  n.endswith("rotary_emb.inv_freq"), tie=("lm_head.weight", f"{prefix}embed_tokens.weight"))


def config_problems(hf: dict[str, Any], m: ModelConfig) -> list[str]:
    """Where a checkpoint's config.json (its `text_config` for the VL snapshot) differs from the model config."""
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else hf
    c = Checker(text)
    for key, want, model_key in (
            ("vocab_size", m.vocab_size, "vocab_size"), ("hidden_size", m.hidden_size, "hidden_size"),
            ("num_hidden_layers", m.num_layers, "num_layers"), ("num_attention_heads", m.num_heads, "num_heads"),
            ("num_key_value_heads", m.num_kv_heads, "num_kv_heads"), ("head_dim", m.head_dim, "head_dim"),
            ("linear_num_key_heads", m.linear_num_key_heads, "linear_num_key_heads"),
            ("linear_num_value_heads", m.linear_num_value_heads, "linear_num_value_heads"),
            ("linear_key_head_dim", m.linear_key_head_dim, "linear_key_head_dim"),
            ("linear_value_head_dim", m.linear_value_head_dim, "linear_value_head_dim"),
            ("linear_conv_kernel_dim", m.linear_conv_kernel_dim, "linear_conv_kernel_dim"),
            ("num_experts", m.num_experts, "num_experts"),
            ("num_experts_per_tok", m.experts_per_token, "experts_per_token"),
            ("moe_intermediate_size", m.expert_hidden, "expert_hidden"),
            ("shared_expert_intermediate_size", m.shared_expert_hidden, "shared_expert_hidden")):
        c.same(key, want, f"model.{model_key}")
    c.same("rms_norm_eps", m.norm_epsilon, "model.norm_epsilon", close=True)
    theta, scaling = rope(text, 1e7)
    if not math.isclose(theta, m.rope_base, rel_tol=1e-6):
        c.problems.append(f"config.json rope_theta={theta:g}, the model has model.rope_base={m.rope_base:g}")
    factor = scaling.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    if not isinstance(factor, (int, float)) or round(m.head_dim * factor) != m.rotary_dim:
        c.problems.append(f"config.json partial_rotary_factor={factor}: the model turns model.rotary_dim="
                          f"{m.rotary_dim} of model.head_dim={m.head_dim}")
    if scaling["rope_type"] != "default":
        c.problems.append(f"config.json RoPE rope_type={scaling['rope_type']}: the model has plain RoPE")
    want_types = [m.layer_type(i) for i in range(m.num_layers)]
    if text.get("layer_types", want_types) != want_types:
        c.problems.append(f"config.json layer_types differ from every model.full_attention_interval="
                          f"{m.full_attention_interval}th layer being full attention")
    c.flag("attention_bias", False, False, "the model's attention has no biases")
    c.flag("hidden_act", "silu", "silu", "the model's experts are SwiGLU (silu)")
    return c.problems


def hf_config(m: ModelConfig, seq_length: int, dtype: str) -> dict[str, Any]:
    """config.json for the text model `Qwen3_5MoeForCausalLM` as this model computes."""
    return {"architectures": [ARCH], "model_type": "qwen3_5_moe_text", "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size, "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
            "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim,
            "linear_num_key_heads": m.linear_num_key_heads, "linear_num_value_heads": m.linear_num_value_heads,
            "linear_key_head_dim": m.linear_key_head_dim, "linear_value_head_dim": m.linear_value_head_dim,
            "linear_conv_kernel_dim": m.linear_conv_kernel_dim, "num_experts": m.num_experts,
            "num_experts_per_tok": m.experts_per_token, "moe_intermediate_size": m.expert_hidden,
            "shared_expert_intermediate_size": m.shared_expert_hidden, "rms_norm_eps": m.norm_epsilon,
            "layer_types": [m.layer_type(i) for i in range(m.num_layers)],
            "rope_parameters": {"rope_type": "default", "rope_theta": m.rope_base,
                                "partial_rotary_factor": m.rotary_dim / m.head_dim},
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "max_position_embeddings": max(seq_length, 4096), "tie_word_embeddings": False,
            "initializer_range": m.init_stddev, "use_cache": True, "torch_dtype": dtype}


FORMAT = Format(layout, config_problems, lambda cfg, dtype: hf_config(cfg.model, cfg.data.seq_length, dtype))
