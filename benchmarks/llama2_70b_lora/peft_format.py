"""The LoRA adapters of a llama2_70b_lora run in PEFT's adapter format, and the merged model.

PEFT (github.com/huggingface/peft, `LoraModel`, `save_pretrained`) saves `adapter_config.json` and
`adapter_model.safetensors`, whose tensors are named `base_model.model.<module>.lora_A.weight` [rank, in] and
`...lora_B.weight` [out, rank] for each adapted torch Linear (the adapter name 'default' dropped), and adds
(lora_alpha / r) * B(A(x)) to the module's output. The harness's adapters (benchmarks/lm/attention.py `Lora`)
put ONE A on the fused q/k/v input and split B by rows into q, k and v parts: written as PEFT's separate
q_proj, k_proj and v_proj adapters, each with a copy of that A and its own part of B, they compute the same
outputs (dropout aside: the harness draws one mask for the three, PEFT one per module, which only training
sees). The output projection's adapter maps one to one onto o_proj. Rows follow the base layout of
benchmarks/lm/hf_names.py (query head h uses key/value head h // group; no RoPE permutation).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def adapters(m: Any, read: Callable[[str], np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each adapted module's (A [rank, in], B [out, rank]) under its transformers name, from the run's
    variables (`read(path)`), in float32."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    r, kv, g, d = m.lora_rank, m.num_kv_heads, m.num_heads // m.num_kv_heads, m.head_dim
    for i in range(m.num_layers):
        us, hf = f"llama/layer_{i}/attention", f"model.layers.{i}.self_attn"
        a = np.asarray(read(f"{us}/lora_qkv/a"), np.float32).T  # [rank, hidden]
        out[f"{hf}.q_proj"] = (a, np.asarray(read(f"{us}/lora_qkv/b_query"), np.float32).reshape(r, kv * g * d).T)
        out[f"{hf}.k_proj"] = (a, np.asarray(read(f"{us}/lora_qkv/b_key"), np.float32).reshape(r, kv * d).T)
        out[f"{hf}.v_proj"] = (a, np.asarray(read(f"{us}/lora_qkv/b_value"), np.float32).reshape(r, kv * d).T)
        oa = np.asarray(read(f"{us}/lora_output/a"), np.float32).reshape(kv * g * d, r).T
        out[f"{hf}.o_proj"] = (oa, np.asarray(read(f"{us}/lora_output/b"), np.float32).T)
    return out


def is_adapter(path: str) -> bool:
    """Whether a variable path is one of the adapters' (the rest is the frozen base)."""
    return "/lora_" in path


def adapter_tensors(pairs: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """adapter_model.safetensors' tensors under PEFT's names."""
    tensors = {}
    for module, (a, b) in pairs.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a
        tensors[f"base_model.model.{module}.lora_B.weight"] = b
    return tensors


def adapter_config(m: Any, base: str) -> dict[str, Any]:
    """adapter_config.json for the run's adapters (PEFT LoraConfig fields; `base`: where the base comes from)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": m.lora_rank,
            "lora_alpha": m.lora_alpha, "lora_dropout": m.lora_dropout, "target_modules": list(TARGET_MODULES),
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
            "use_rslora": False, "use_dora": False, "modules_to_save": None, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "revision": None}


def merged(weight: np.ndarray, pair: tuple[np.ndarray, np.ndarray], m: Any) -> np.ndarray:
    """A base Linear weight [out, in] with its adapter folded in: W + (alpha / rank) B A (PEFT `merge_and_unload`)."""
    a, b = pair
    return np.asarray(weight, np.float32) + (m.lora_alpha / m.lora_rank) * (b @ a)


# The public base the reference fine-tunes (MLCommons serves a copy with q, k and v fused into qkv_proj).
REFERENCE_BASE = "meta-llama/Llama-2-70b-hf"
