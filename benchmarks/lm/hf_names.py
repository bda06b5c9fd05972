"""The decoder LMs in Hugging Face layout: tensor names, shapes and config.json keys (harness/nn/hf_checkpoint.py
reads and writes them).

What the Hugging Face Llama layout holds (transformers `LlamaForCausalLM.save_pretrained`): `model.embed_tokens`,
`model.norm`, `lm_head` (absent when tied to the embeddings), and per layer `input_layernorm`,
`post_attention_layernorm`, `self_attn.{q,k,v,o}_proj` and `mlp.{gate,up,down}_proj`, each a torch Linear
weight [out, in]. Query head h uses key/value head h // (heads / kv heads), as the harness's query kernel
[hidden, kv, group, head_dim] lays them out; q and k rows are already ordered for rotate-half RoPE, which is the
harness's form, so no permutation. The MLPerf llama2_70b_lora checkpoint fuses q, k and v into one
`self_attn.qkv_proj` [(heads + 2 kv) x head_dim, hidden] (q rows, then k, then v): read by row ranges.

config.json: transformers 5 writes RoPE as `rope_parameters` {rope_type, rope_theta, factor, ...}; older
files carry `rope_theta` and `rope_scaling` {rope_type or type, factor, ...}. Both are read. Export writes the
older pair: transformers 5 reads it (folding it into `rope_parameters`), and so does every reader that predates 5.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from harness.nn.hf_checkpoint import Checker, Entry, Layout, Out, Part, direct, linear_out, same, transposed

LLAMA_ARCH = "LlamaForCausalLM"
TIE = ("lm_head.weight", "model.embed_tokens.weight")  # the LM head read from the embedding when tied


def rope(hf: dict[str, Any], default_theta: float) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling dict with 'rope_type') from either config.json form."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:   # per layer type: the full layers' values
        params = params["full_attention"]
    if isinstance(params, dict) and params:
        theta = params.get("rope_theta", hf.get("rope_theta", default_theta))
        scaling = dict(params)
    else:
        theta = hf.get("rope_theta", default_theta)
        scaling = dict(hf.get("rope_scaling") or {})
    scaling["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta), scaling


def decoder_config_problems(hf: dict[str, Any], m: Any, ffn_key: str, ffn_size: int, default_theta: float,
                            ) -> tuple[Checker, float, dict[str, Any]]:
    """The checks every decoder shares (sizes, norm epsilon, RoPE base, untied or tied embeddings, no bias in
    the dense layers); returns the checker and the RoPE parameters for the model's own checks."""
    c = Checker(hf)
    heads = hf.get("num_attention_heads")
    c.same("vocab_size", m.vocab_size, "model.vocab_size")
    c.same("hidden_size", m.hidden_size, "model.hidden_size")
    c.same("intermediate_size", ffn_size, ffn_key)
    c.same("num_hidden_layers", m.num_layers, "model.num_layers")
    c.same("num_attention_heads", m.num_heads, "model.num_heads")
    c.same("num_key_value_heads", m.num_kv_heads, "model.num_kv_heads", default=heads)
    head_dim = hf.get("head_dim") or (hf.get("hidden_size", 0) // heads if heads else None)
    if head_dim != m.head_dim:
        c.problems.append(f"config.json head_dim={head_dim}, the model has model.head_dim={m.head_dim}")
    c.same("rms_norm_eps", m.norm_epsilon, "model.norm_epsilon", close=True)
    theta, scaling = rope(hf, default_theta)
    if not math.isclose(theta, m.rope_base, rel_tol=1e-6):
        c.problems.append(f"config.json rope_theta={theta:g}, the model has model.rope_base={m.rope_base:g}")
    return c, theta, scaling


def llama_config_problems(hf: dict[str, Any], m: Any) -> list[str]:
    """Where a Llama checkpoint's config.json differs from the model config (`LlamaModelConfig`)."""
    c, _, scaling = decoder_config_problems(hf, m, "model.ffn_hidden", m.ffn_hidden, 10000.0)
    kind = scaling["rope_type"]
    if m.rope_scaling_factor:
        if kind != "llama3":
            c.problems.append(f"config.json RoPE rope_type={kind}, the model scales RoPE as Llama 3.1 (llama3; "
                              f"model.rope_scaling_factor=0 turns that off)")
        else:
            for key, want, model_key in (("factor", m.rope_scaling_factor, "rope_scaling_factor"),
                                         ("low_freq_factor", m.rope_low_freq_factor, "rope_low_freq_factor"),
                                         ("high_freq_factor", m.rope_high_freq_factor, "rope_high_freq_factor"),
                                         ("original_max_position_embeddings", m.rope_original_context,
                                          "rope_original_context")):
                got = scaling.get(key)
                if got is None or not math.isclose(float(got), float(want), rel_tol=1e-6):
                    c.problems.append(f"config.json RoPE {key}={got}, the model has model.{model_key}={want:g}")
    elif kind != "default":
        c.problems.append(f"config.json RoPE rope_type={kind}, the model has plain RoPE "
                          f"(model.rope_scaling_factor=0)")
    c.flag("attention_bias", False, False, "the model's attention has no biases")
    c.flag("mlp_bias", False, False, "the model's feed-forward has no biases")
    c.flag("hidden_act", "silu", "silu", "the model's feed-forward is SwiGLU (silu)")
    return c.problems


def decoder_entries(name: str, m: Any, ckpt_names: set[str]) -> tuple[list[Entry], list[Out]]:
    """Embeddings, final norm, LM head and, per layer, the two norms and the attention (separate or fused
    q/k/v, chosen by what the checkpoint holds; export writes them separate, as transformers does)."""
    v, h, kv, d = m.vocab_size, m.hidden_size, m.num_kv_heads, m.head_dim
    g = m.num_heads // kv
    embed = Part("model.embed_tokens.weight", (v, h))
    entries = [direct(f"{name}/embedding/embeddings", (v, h), embed),
               direct(f"{name}/final_norm/gamma", (h,), Part("model.norm.weight", (h,)))]
    outs = [Out("model.embed_tokens.weight", (v, h), (f"{name}/embedding/embeddings",), same((v, h))),
            Out("model.norm.weight", (h,), (f"{name}/final_norm/gamma",), same((h,))),
            Out("lm_head.weight", (v, h), (f"{name}/output/kernel",), linear_out(h))]
    tied = "lm_head.weight" not in ckpt_names and "model.embed_tokens.weight" in ckpt_names and ckpt_names != set()
    head = Part("model.embed_tokens.weight" if tied else "lm_head.weight", (v, h))  # tied: the head is a copy
    entries.append(transposed(f"{name}/output/kernel", (h, v), head))
    shapes = {"query": (h, kv, g, d), "key": (h, kv, d), "value": (h, kv, d)}
    q_rows, kv_rows = kv * g * d, kv * d
    rows = {"query": (0, q_rows), "key": (q_rows, q_rows + kv_rows), "value": (q_rows + kv_rows, q_rows + 2 * kv_rows)}
    for i in range(m.num_layers):
        hf, us = f"model.layers.{i}", f"{name}/layer_{i}"
        for ours, theirs in (("attention_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")):
            entries.append(direct(f"{us}/{ours}/gamma", (h,), Part(f"{hf}.{theirs}.weight", (h,))))
            outs.append(Out(f"{hf}.{theirs}.weight", (h,), (f"{us}/{ours}/gamma",), same((h,))))
        fused = f"{hf}.self_attn.qkv_proj.weight"
        for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            shape = shapes[ours]
            out_rows = math.prod(shape[1:])
            if fused in ckpt_names:
                part = Part(fused, (kv * (g + 2) * d, h), rows[ours])
            else:
                part = Part(f"{hf}.self_attn.{theirs}.weight", (out_rows, h))
            entries.append(transposed(f"{us}/attention/{ours}/kernel", shape, part))
            outs.append(Out(f"{hf}.self_attn.{theirs}.weight", (out_rows, h), (f"{us}/attention/{ours}/kernel",),
                            linear_out(h)))
        o_shape = (kv, g, d, h)
        entries.append(transposed(f"{us}/attention/output/kernel", o_shape,
                                  Part(f"{hf}.self_attn.o_proj.weight", (h, kv * g * d))))
        outs.append(Out(f"{hf}.self_attn.o_proj.weight", (h, kv * g * d), (f"{us}/attention/output/kernel",),
                        linear_out(kv * g * d)))
    return entries, outs


def llama_layout(m: Any, ckpt_names: set[str], have: Callable[[str], bool]) -> Layout:
    """The Llama model (benchmarks/lm/llama.py, decoder name `llama`) <-> `LlamaForCausalLM`'s tensors."""
    del have
    entries, outs = decoder_entries("llama", m, ckpt_names)
    h, f = m.hidden_size, m.ffn_hidden
    for i in range(m.num_layers):
        hf, us = f"model.layers.{i}.mlp", f"llama/layer_{i}/mlp"
        for ours, theirs, shape in (("gate", "gate_proj", (h, f)), ("up", "up_proj", (h, f)),
                                    ("down", "down_proj", (f, h))):
            entries.append(transposed(f"{us}/{ours}/kernel", shape, Part(f"{hf}.{theirs}.weight", shape[::-1])))
            outs.append(Out(f"{hf}.{theirs}.weight", shape[::-1], (f"{us}/{ours}/kernel",), linear_out(shape[0])))
    return Layout(entries, outs, ignore=lambda n: n.endswith("rotary_emb.inv_freq"), tie=TIE)


def llama_config(m: Any, seq_length: int, dtype: str) -> dict[str, Any]:
    """config.json for `LlamaForCausalLM` as this model computes."""
    scaling = {"rope_type": "default"}
    if m.rope_scaling_factor:
        scaling = {"rope_type": "llama3", "factor": m.rope_scaling_factor, "low_freq_factor": m.rope_low_freq_factor,
                   "high_freq_factor": m.rope_high_freq_factor,
                   "original_max_position_embeddings": m.rope_original_context}
    context = max(seq_length, int(m.rope_original_context * m.rope_scaling_factor))
    return {"architectures": [LLAMA_ARCH], "model_type": "llama", "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden, "num_hidden_layers": m.num_layers,
            "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim,
            "hidden_act": "silu", "rms_norm_eps": m.norm_epsilon, "rope_theta": m.rope_base, "rope_scaling": scaling,
            "max_position_embeddings": context, "attention_bias": False, "attention_dropout": 0.0,
            "mlp_bias": False, "tie_word_embeddings": False, "initializer_range": m.init_stddev,
            "use_cache": True, "torch_dtype": dtype}
