"""Golden outputs of transformers' own Qwen3.5 MoE modules: one Gated DeltaNet layer (for
tests/test_qwen35_deltanet.py) and the whole tiny `Qwen3_5MoeForCausalLM` (for tests/test_qwen35_model.py).

Run in a side virtualenv with torch and transformers (not the harness's):
    OMP_NUM_THREADS=1 /path/to/venv/bin/python scripts/make_qwen35_goldens.py
Without the fla and causal-conv1d packages transformers runs its torch paths: `torch_chunk_gated_delta_rule`
for the 70-token forward and for a left-padded batch with its attention mask, and, with a DynamicCache,
`causal_conv1d_update` + `torch_recurrent_gated_delta_rule` for single-token decoding after a 37-token prefill.

The layer is `layers.0.linear_attn` of the tiny Qwen3_5MoeTextConfig below (V heads = 2 x QK heads, dk != dv).
Its weights and input are drawn by NumPy's PCG64 from fixed seeds (`golden_weights`, `golden_input`, imported by
the test, which draws the same arrays), so the committed files hold only the outputs and a digest of the
weights, not 120 KB of random numbers. Non-trivial norm weight, dt_bias and A_log are drawn too.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

OUT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, "tests", "data", "qwen35"))
CONFIG = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=32, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=48, rms_norm_eps=1e-6, hidden_act="silu",
              tie_word_embeddings=False, attention_bias=False, max_position_embeddings=4096,
              rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True})
LENGTH, PREFILL = 70, 37  # 70 > one chunk of 64 and not a multiple of it
MODEL_ROWS, MODEL_LENGTH = 2, 16  # the whole model's token rows (logits 2 x 16 x 512 floats: 64 KB)


def golden_weights(seed: int = 35) -> dict[str, np.ndarray]:
    """transformers' names (under `linear_attn.`) and shapes for CONFIG, float32."""
    c, rng = CONFIG, np.random.default_rng(seed)
    key_dim = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    value_dim = c["linear_num_value_heads"] * c["linear_value_head_dim"]
    conv_dim, d, hv = 2 * key_dim + value_dim, c["hidden_size"], c["linear_num_value_heads"]

    def linear(n_out, n_in):
        return rng.normal(scale=n_in ** -0.5, size=(n_out, n_in))

    w = {"in_proj_qkv.weight": linear(conv_dim, d), "in_proj_z.weight": linear(value_dim, d),
         "in_proj_b.weight": linear(hv, d), "in_proj_a.weight": linear(hv, d),
         "conv1d.weight": rng.normal(scale=0.5, size=(conv_dim, 1, c["linear_conv_kernel_dim"])),
         "dt_bias": rng.normal(scale=0.5, size=hv), "A_log": np.log(rng.uniform(0.05, 1.0, hv)),
         "norm.weight": 1.0 + rng.normal(scale=0.3, size=c["linear_value_head_dim"]),
         "out_proj.weight": linear(d, value_dim)}
    return {k: v.astype(np.float32) for k, v in w.items()}


def golden_input(seed: int = 36) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(1, LENGTH, CONFIG["hidden_size"])).astype(np.float32)


def golden_padded_batch() -> tuple[np.ndarray, np.ndarray]:
    """Two rows of 12 positions: the first 12 tokens of the golden input, and its first 7 left-padded by 5
    positions of non-zero junk that the mask must hide."""
    x = golden_input()[0]
    junk = np.random.default_rng(37).normal(size=(5, x.shape[1])).astype(np.float32)
    batch = np.stack([x[:12], np.concatenate([junk, x[:7]])])
    mask = np.array([[1] * 12, [0] * 5 + [1] * 7], np.int64)
    return batch, mask


def model_weights(names: dict[str, list[int]], seed: int = 40) -> dict[str, np.ndarray]:
    """Every tensor of the tiny `Qwen3_5MoeForCausalLM` (transformers' names -> shapes, `names`), drawn in sorted
    name order. The (1 + w) norms get w ~ N(0, 0.3) (not transformers' zeros, so a norm without the + 1 shows);
    the router's logits have a spread of about 2 (so the top-2 is never near a tie and its weights are not
    one-hot); the gated DeltaNet norm is a plain weight near 1."""
    rng, out = np.random.default_rng(seed), {}
    for name in sorted(names):
        shape = tuple(names[name])
        if name.endswith("linear_attn.norm.weight"):
            w = 1.0 + rng.normal(scale=0.3, size=shape)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            w = rng.normal(scale=0.3, size=shape)
        elif name.endswith("A_log"):
            w = np.log(rng.uniform(0.05, 1.0, shape))
        elif name.endswith("dt_bias") or name.endswith("conv1d.weight"):
            w = rng.normal(scale=0.5, size=shape)
        elif name == "model.embed_tokens.weight":
            w = rng.normal(size=shape)
        elif name.endswith("mlp.gate.weight"):
            w = rng.normal(scale=0.25, size=shape)
        else:  # a Linear [out, in] or the fused experts [experts, out, in]
            w = rng.normal(scale=shape[-1] ** -0.5, size=shape)
        out[name] = w.astype(np.float32)
    return out


def model_tokens(seed: int = 41) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CONFIG["vocab_size"], (MODEL_ROWS, MODEL_LENGTH)).astype(np.int64)


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name], np.float32).tobytes())
    return h.hexdigest()


def make_model_goldens(torch, transformers, config) -> None:
    """The whole tiny model (layers: three Gated DeltaNet then one gated attention, every one MoE) on two token
    rows: logits, and the names and shapes of every tensor (the fused experts as transformers 5 stores them)."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    model = Qwen3_5MoeForCausalLM(config).eval()
    names = {k: list(v.shape) for k, v in model.state_dict().items()}
    weights = model_weights(names)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    with torch.no_grad():
        logits = model(torch.from_numpy(model_tokens())).logits.numpy()
    np.savez(os.path.join(OUT, "model_golden.npz"), logits=logits)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "config": CONFIG,
            "layer_types": list(config.layer_types), "hf_names": names, "weights_sha256": weights_digest(weights),
            "max_abs_logit": float(np.abs(logits).max())}
    with open(os.path.join(OUT, "model_golden.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT}/model_golden.*: logits {logits.shape}, max |logit| {meta['max_abs_logit']:.3f}")


def main() -> None:
    import importlib.util

    import torch
    import transformers
    from transformers import DynamicCache
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

    for fast in ("fla", "causal_conv1d", "kernels"):
        if importlib.util.find_spec(fast) is not None:
            raise SystemExit(f"error: {fast} is installed; the goldens need transformers' torch paths")
    torch.manual_seed(0)
    config = Qwen3_5MoeTextConfig(**CONFIG)
    layer = Qwen3_5MoeGatedDeltaNet(config, layer_idx=0).eval()
    weights = golden_weights()
    names = {k: list(v.shape) for k, v in layer.state_dict().items()}
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    x = torch.from_numpy(golden_input())
    with torch.no_grad():
        full = layer(x).numpy()
        cache = DynamicCache(config=config)
        steps = [layer(x[:, :PREFILL], cache=cache)]
        for t in range(PREFILL, LENGTH):
            steps.append(layer(x[:, t:t + 1], cache=cache))
        cached = torch.cat(steps, dim=1).numpy()
        padded, pad_mask = golden_padded_batch()
        padded_out = layer(torch.from_numpy(padded), attention_mask=torch.from_numpy(pad_mask)).numpy()
    os.makedirs(OUT, exist_ok=True)
    np.savez(os.path.join(OUT, "deltanet_golden.npz"), full=full, decoded=cached[:, PREFILL:], padded=padded_out)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "config": CONFIG,
            "length": LENGTH, "prefill": PREFILL, "hf_names": names, "weights_sha256": weights_digest(weights),
            "max_abs_full_minus_cached": float(np.abs(full - cached).max())}
    with open(os.path.join(OUT, "deltanet_golden.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    make_model_goldens(torch, transformers, config)
    print(f"wrote {OUT}: |full| max {np.abs(full).max():.3f}, full vs cached {meta['max_abs_full_minus_cached']:.2e}")


if __name__ == "__main__":
    main()
