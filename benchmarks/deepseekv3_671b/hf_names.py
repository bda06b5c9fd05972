"""deepseekv3_671b in Hugging Face layout (`DeepseekV3ForCausalLM`, DeepSeek's own checkpoints): tensor names,
shapes and config.json keys.

Per layer L: `input_layernorm`, `post_attention_layernorm`; attention `self_attn.{q_a_proj [q_lora, hidden],
q_a_layernorm, q_b_proj [heads x (nope + rope), q_lora], kv_a_proj_with_mqa [kv_lora + rope, hidden],
kv_a_layernorm, kv_b_proj [heads x (nope + v), kv_lora], o_proj [hidden, heads x v]}`; dense layers
`mlp.{gate,up,down}_proj`; MoE layers `mlp.gate.weight [experts, hidden]`, `mlp.gate.e_score_correction_bias
[experts]` (float32, the expert bias), `mlp.experts.{j}.{gate,up,down}_proj.weight` (one tensor per expert,
stacked here into [experts, in, out] kernels) and `mlp.shared_experts.{gate,up,down}_proj.weight`. Layer
`num_hidden_layers` (61 in DeepSeek-V3) is the multi-token-prediction block: a layer's tensors under that
index plus `enorm`, `hnorm`, `eh_proj [hidden, 2 x hidden]` (the embedding's columns first),
`shared_head.norm` and copies of the embedding and LM head (`embed_tokens`, `shared_head.head`, not read;
export writes them). transformers ignores the block and writes none: a model with MTP (model.mtp_layers)
loads it when the checkpoint has it and keeps its initialization otherwise; a model without ignores it.

The rotary rows (the last `rope` rows of each head's q_b_proj block and the last `rope` rows of
kv_a_proj_with_mqa) are stored in interleaved pairs (x0, x1), (x2, x3), ... (config.json rope_interleave);
the model's RoPE rotates halves (x_j, x_j+rope/2), so import puts the even rows first, then the odd
(export undoes it). q and k are permuted alike, so every score is unchanged.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from harness.nn.hf_checkpoint import Checker, Entry, Layout, Out, Part, direct, linear_out, same, transposed

from benchmarks.deepseekv3_671b.config import TRANSFORMERS_GROUP_TOP
from benchmarks.deepseekv3_671b.model import NAME
from benchmarks.lm.hf_names import rope

ARCH = "DeepseekV3ForCausalLM"


def rope_order(dim: int) -> np.ndarray:
    """Interleaved pairs -> rotate-half order: the even rows, then the odd."""
    return np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])


def _q_up(heads: int, nope: int, rope_dim: int) -> tuple[Callable, Callable]:
    """q_b_proj [heads x (nope + rope), q_lora] <-> the kernel [q_lora, heads, nope + rope]."""
    order = np.concatenate([np.arange(nope), nope + rope_order(rope_dim)])
    back = np.argsort(order)

    def to_var(w):
        return np.ascontiguousarray(w.reshape(heads, nope + rope_dim, -1)[:, order].transpose(2, 0, 1))

    def to_hf(k):
        return np.ascontiguousarray(k[:, :, back].transpose(1, 2, 0).reshape(heads * (nope + rope_dim), -1))
    return to_var, to_hf


def _kv_down(kv_lora: int, rope_dim: int) -> tuple[Callable, Callable]:
    """kv_a_proj_with_mqa [kv_lora + rope, hidden] <-> the kernel [hidden, kv_lora + rope]."""
    order = np.concatenate([np.arange(kv_lora), kv_lora + rope_order(rope_dim)])
    back = np.argsort(order)
    return (lambda w: np.ascontiguousarray(w[order].T)), (lambda k: np.ascontiguousarray(k[:, back].T))


def stacked(path: str, shape: tuple[int, int, int], names: list[str]) -> Entry:
    """A kernel [experts, in, out] from one Linear weight [out, in] per expert; a block of it (experts, in,
    out ranges) is read expert by expert."""
    parts = tuple(Part(n, (shape[2], shape[1])) for n in names)

    def block(read, index):
        experts = range(*index[0].indices(shape[0]))
        return np.stack([np.ascontiguousarray(read(names[j], (index[2], index[1])).T) for j in experts])
    return Entry(path, shape, parts, lambda *ws: np.stack([np.ascontiguousarray(w.T) for w in ws]), block)


def config_problems(hf: dict[str, Any], m: Any) -> list[str]:
    """Where a DeepSeek-V3 checkpoint's config.json differs from the model config."""
    c = Checker(hf)
    for key, want, model_key in (
            ("vocab_size", m.vocab_size, "vocab_size"), ("hidden_size", m.hidden_size, "hidden_size"),
            ("intermediate_size", m.ffn_hidden, "ffn_hidden"), ("num_hidden_layers", m.num_layers, "num_layers"),
            ("num_attention_heads", m.num_heads, "num_heads"), ("q_lora_rank", m.q_lora_rank, "q_lora_rank"),
            ("kv_lora_rank", m.kv_lora_rank, "kv_lora_rank"),
            ("qk_nope_head_dim", m.qk_nope_head_dim, "qk_nope_head_dim"),
            ("qk_rope_head_dim", m.qk_rope_head_dim, "qk_rope_head_dim"), ("v_head_dim", m.v_head_dim, "v_head_dim"),
            ("moe_intermediate_size", m.expert_hidden, "expert_hidden"),
            ("n_routed_experts", m.num_experts, "num_experts"),
            ("n_shared_experts", m.shared_experts, "shared_experts"),
            ("num_experts_per_tok", m.experts_per_token, "experts_per_token"),
            ("n_group", m.expert_groups, "expert_groups"),
            ("topk_group", m.groups_per_token, "groups_per_token"),
            ("first_k_dense_replace", m.first_dense_layers, "first_dense_layers")):
        c.same(key, want, f"model.{model_key}")
    c.same("num_key_value_heads", m.num_kv_heads, "model.num_kv_heads", default=hf.get("num_attention_heads"))
    if m.group_score_top() != TRANSFORMERS_GROUP_TOP:
        c.problems.append(f"the model scores an expert group by its top {m.group_score_top()} experts "
                          f"(model.group_score_experts={m.group_score_experts}), transformers by its top "
                          f"{TRANSFORMERS_GROUP_TOP}: set model.group_score_experts={TRANSFORMERS_GROUP_TOP} (or 0)")
    c.same("routed_scaling_factor", m.routed_scaling_factor, "model.routed_scaling_factor", close=True)
    c.same("rms_norm_eps", m.norm_epsilon, "model.norm_epsilon", close=True)
    c.flag("norm_topk_prob", True, True, "the model normalizes the chosen experts' weights")
    c.flag("scoring_func", "sigmoid", "sigmoid", "the model's router scores are sigmoids")
    c.flag("topk_method", "noaux_tc", "noaux_tc", "the model routes group-limited with the expert bias")
    c.flag("rope_interleave", True, True, "the importer reorders interleaved rotary rows")
    c.flag("tie_word_embeddings", False, False, "the model's output layer is its own weight")
    c.flag("attention_bias", False, False, "the model's attention has no biases")
    c.flag("hidden_act", "silu", "silu", "the model's feed-forwards are SwiGLU (silu)")
    theta, scaling = rope(hf, 10000.0)
    if not math.isclose(theta, m.rope_base, rel_tol=1e-6):
        c.problems.append(f"config.json rope_theta={theta:g}, the model has model.rope_base={m.rope_base:g}")
    kind = scaling["rope_type"]
    if m.rope_scaling_factor > 1:
        if kind != "yarn":
            c.problems.append(f"config.json RoPE rope_type={kind}: the model uses YaRN (model.rope_scaling_factor="
                              f"{m.rope_scaling_factor:g}; 1 = plain RoPE)")
        else:
            for key, want, model_key in (("factor", m.rope_scaling_factor, "rope_scaling_factor"),
                                         ("original_max_position_embeddings", m.rope_original_context,
                                          "rope_original_context"),
                                         ("beta_fast", m.rope_beta_fast, "rope_beta_fast"),
                                         ("beta_slow", m.rope_beta_slow, "rope_beta_slow"),
                                         ("mscale", m.rope_mscale, "rope_mscale"),
                                         ("mscale_all_dim", m.rope_mscale_all_dim, "rope_mscale_all_dim")):
                got = scaling.get(key, {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0}.get(key))
                if got is None or not math.isclose(float(got), float(want), rel_tol=1e-6):
                    c.problems.append(f"config.json RoPE {key}={got}, the model has model.{model_key}={want:g}")
            if not scaling.get("truncate", True):
                c.problems.append("config.json RoPE truncate=false: the model floors/ceils YaRN's correction range")
    elif kind != "default":
        c.problems.append(f"config.json RoPE rope_type={kind}, the model has plain RoPE")
    return c.problems


def layout(m: Any, ckpt_names: set[str], have: Callable[[str], bool]) -> Layout:
    """The DeepSeek-V3 model (decoder name `deepseek`) <-> `DeepseekV3ForCausalLM`'s tensors."""
    del have
    v, h, heads = m.vocab_size, m.hidden_size, m.num_heads
    nope, rdim, vd, ql, kvl = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.q_lora_rank, m.kv_lora_rank
    e, eh = m.num_experts, m.expert_hidden
    entries = [direct(f"{NAME}/embedding/embeddings", (v, h), Part("model.embed_tokens.weight", (v, h))),
               direct(f"{NAME}/final_norm/gamma", (h,), Part("model.norm.weight", (h,))),
               transposed(f"{NAME}/output/kernel", (h, v), Part("lm_head.weight", (v, h)))]
    outs = [Out("model.embed_tokens.weight", (v, h), (f"{NAME}/embedding/embeddings",), same((v, h))),
            Out("model.norm.weight", (h,), (f"{NAME}/final_norm/gamma",), same((h,))),
            Out("lm_head.weight", (v, h), (f"{NAME}/output/kernel",), linear_out(h))]
    q_in, q_out = _q_up(heads, nope, rdim)
    kv_in, kv_out = _kv_down(kvl, rdim)

    def vector(ours: str, theirs: str, n: int) -> None:
        entries.append(direct(ours, (n,), Part(theirs, (n,))))
        outs.append(Out(theirs, (n,), (ours,), same((n,))))

    def linear(ours: str, theirs: str, shape: tuple[int, ...]) -> None:
        """A kernel [in, ...out] from a Linear weight [out, in] with in = shape[0]."""
        out_rows = math.prod(shape[1:])
        entries.append(transposed(ours, shape, Part(theirs, (out_rows, shape[0]))))
        outs.append(Out(theirs, (out_rows, shape[0]), (ours,), linear_out(shape[0])))

    def layer(i: int, hf: str, us: str) -> None:
        vector(f"{us}/attention_norm/gamma", f"{hf}.input_layernorm.weight", h)
        vector(f"{us}/mlp_norm/gamma", f"{hf}.post_attention_layernorm.weight", h)
        a, at = f"{hf}.self_attn", f"{us}/attention"
        linear(f"{at}/q_down/kernel", f"{a}.q_a_proj.weight", (h, ql))
        vector(f"{at}/q_norm/gamma", f"{a}.q_a_layernorm.weight", ql)
        q_shape = (heads * (nope + rdim), ql)
        entries.append(Entry(f"{at}/q_up/kernel", (ql, heads, nope + rdim), (Part(f"{a}.q_b_proj.weight", q_shape),),
                             q_in))
        outs.append(Out(f"{a}.q_b_proj.weight", q_shape, (f"{at}/q_up/kernel",), q_out))
        kv_shape = (kvl + rdim, h)
        entries.append(Entry(f"{at}/kv_down/kernel", (h, kvl + rdim),
                             (Part(f"{a}.kv_a_proj_with_mqa.weight", kv_shape),), kv_in))
        outs.append(Out(f"{a}.kv_a_proj_with_mqa.weight", kv_shape, (f"{at}/kv_down/kernel",), kv_out))
        vector(f"{at}/kv_norm/gamma", f"{a}.kv_a_layernorm.weight", kvl)
        linear(f"{at}/kv_up/kernel", f"{a}.kv_b_proj.weight", (kvl, heads, nope + vd))
        entries.append(transposed(f"{at}/output/kernel", (heads, vd, h), Part(f"{a}.o_proj.weight", (h, heads * vd))))
        outs.append(Out(f"{a}.o_proj.weight", (h, heads * vd), (f"{at}/output/kernel",), linear_out(heads * vd)))
        mlp, ours = f"{hf}.mlp", f"{us}/mlp"
        if not m.is_moe(i):
            for name, theirs, shape in (("gate", "gate_proj", (h, m.ffn_hidden)), ("up", "up_proj", (h, m.ffn_hidden)),
                                        ("down", "down_proj", (m.ffn_hidden, h))):
                linear(f"{ours}/{name}/kernel", f"{mlp}.{theirs}.weight", shape)
            return
        linear(f"{ours}/router/kernel", f"{mlp}.gate.weight", (h, e))
        vector(f"{ours}/router/expert_bias", f"{mlp}.gate.e_score_correction_bias", e)
        for name, theirs, shape in (("gate", "gate_proj", (e, h, eh)), ("up", "up_proj", (e, h, eh)),
                                    ("down", "down_proj", (e, eh, h))):
            names = [f"{mlp}.experts.{j}.{theirs}.weight" for j in range(e)]
            entries.append(stacked(f"{ours}/experts/{name}/kernel", shape, names))
            outs.extend(Out(n, (shape[2], shape[1]), (f"{ours}/experts/{name}/kernel",),
                            lambda k, j=j: np.ascontiguousarray(k[j].T)) for j, n in enumerate(names))
        if m.shared_experts:
            sh = m.shared_experts * eh
            for name, theirs, shape in (("gate", "gate_proj", (h, sh)), ("up", "up_proj", (h, sh)),
                                        ("down", "down_proj", (sh, h))):
                linear(f"{ours}/shared/{name}/kernel", f"{mlp}.shared_experts.{theirs}.weight", shape)
    for i in range(m.num_layers):
        layer(i, f"model.layers.{i}", f"{NAME}/layer_{i}")
    mtp = f"model.layers.{m.num_layers}"
    copies = (f"{mtp}.embed_tokens.weight", f"{mtp}.shared_head.head.weight")   # the main model's, duplicated
    with_mtp = bool(m.mtp_layers) and (not ckpt_names or any(n.startswith(f"{mtp}.") and n not in copies
                                                             for n in ckpt_names))
    if with_mtp:
        us = f"{NAME}/mtp_0"
        layer(m.num_layers, mtp, f"{us}/layer")
        vector(f"{us}/enorm/gamma", f"{mtp}.enorm.weight", h)
        vector(f"{us}/hnorm/gamma", f"{mtp}.hnorm.weight", h)
        vector(f"{us}/final_norm/gamma", f"{mtp}.shared_head.norm.weight", h)
        linear(f"{us}/eh_proj/kernel", f"{mtp}.eh_proj.weight", (2 * h, h))
        outs.extend([Out(copies[0], (v, h), (f"{NAME}/embedding/embeddings",), same((v, h))),
                     Out(copies[1], (v, h), (f"{NAME}/output/kernel",), linear_out(h))])

    def ignore(name: str) -> bool:
        return name.endswith("rotary_emb.inv_freq") or name in copies or (
            not with_mtp and name.startswith(f"{mtp}."))
    return Layout(entries, outs, ignore=ignore)


def hf_config(m: Any, seq_length: int, dtype: str) -> dict[str, Any]:
    """config.json for `DeepseekV3ForCausalLM` as this model computes (rotary rows written interleaved)."""
    scaling: dict[str, Any] = {"rope_type": "default"}
    if m.rope_scaling_factor > 1:
        scaling = {"rope_type": "yarn", "factor": m.rope_scaling_factor,
                   "original_max_position_embeddings": m.rope_original_context, "beta_fast": m.rope_beta_fast,
                   "beta_slow": m.rope_beta_slow, "mscale": m.rope_mscale, "mscale_all_dim": m.rope_mscale_all_dim}
    context = max(seq_length, int(m.rope_original_context * m.rope_scaling_factor))
    return {"architectures": [ARCH], "model_type": "deepseek_v3", "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden, "moe_intermediate_size": m.expert_hidden,
            "num_hidden_layers": m.num_layers, "first_k_dense_replace": m.first_dense_layers,
            "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads, "q_lora_rank": m.q_lora_rank,
            "kv_lora_rank": m.kv_lora_rank, "qk_nope_head_dim": m.qk_nope_head_dim,
            "qk_rope_head_dim": m.qk_rope_head_dim, "v_head_dim": m.v_head_dim, "n_routed_experts": m.num_experts,
            "n_shared_experts": m.shared_experts, "num_experts_per_tok": m.experts_per_token,
            "n_group": m.expert_groups, "topk_group": m.groups_per_token,
            "routed_scaling_factor": m.routed_scaling_factor, "norm_topk_prob": True, "scoring_func": "sigmoid",
            "topk_method": "noaux_tc", "hidden_act": "silu", "rms_norm_eps": m.norm_epsilon,
            "rope_theta": m.rope_base, "rope_scaling": scaling, "rope_interleave": True,
            "max_position_embeddings": context, "attention_bias": False, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "initializer_range": m.init_stddev, "use_cache": True,
            "torch_dtype": dtype}
