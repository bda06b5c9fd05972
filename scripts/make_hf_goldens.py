"""Golden outputs from the reference implementations: tiny models built with Hugging Face `transformers`,
saved in Hugging Face layout, and the logits and loss transformers computes for fixed inputs, written to
tests/data/hf_golden/<case>/ (tests/test_hf_golden.py loads each checkpoint through the harness's importer,
model.init_checkpoint, and compares).

Needs torch and transformers, which the harness never depends on: run it with a separate environment, e.g.

    python3 -m venv ../hfref
    ../hfref/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors numpy
    OMP_NUM_THREADS=1 ../hfref/bin/python scripts/make_hf_goldens.py

(the committed files were made with torch 2.13.0+cpu, transformers 5.24.0, safetensors 0.8.0; each case's
golden.json records the versions). Everything is float32 on the CPU, eager attention, fixed seeds. Weights are
drawn larger than transformers' init (and norms and biases away from 1 and 0, so a swapped or dropped tensor
shows) so that max |logit| is of order 1-10 and a relative tolerance on it means something.

Cases:
- llama: `LlamaForCausalLM`, head_dim 128 (Llama 3.1 8B's), RoPE base 500000 with Llama 3.1's scaling (factor 8,
  low/high frequency factors 1/4) at original_max_position_embeddings 16 and rows of 64 tokens, so the scaling
  moves the logits (golden.json: `rope_scaling_moves_logits`, the relative change with rope_type default);
  saved by `save_pretrained` as one model.safetensors, config.json in transformers 5's `rope_parameters` form.
- llama_fused_qkv: the same weights and golden outputs with q, k and v fused into `self_attn.qkv_proj` (rows q,
  k, v: the MLPerf llama2_70b_lora checkpoint's layout), which transformers cannot write: this script re-packs
  the tensors itself, in three shards named 0-based (model-00000-of-00002 ... as OpenAI's gpt-oss converter
  names them) listed by an index json, and writes config.json in the older form (rope_theta + rope_scaling).
- gpt_oss_plain: `GptOssForCausalLM` with everything the harness's base gpt_oss_20b model lacks neutralized:
  sinks -1e9 (softmax weight exactly 0), every bias 0, rope_type default (no YaRN), swiglu_alpha 1 and
  swiglu_limit 1e9 (config keys: silu, no clamp). The `+ 1` transformers adds to the up projection in the
  experts is neither a weight nor a config key: this script replaces `GptOssExperts._apply_gate` with
  silu(gate) * up while it computes this case (its config.json therefore does not describe that change:
  the checkpoint is a test artifact for the harness, not a model transformers reproduces unpatched).
- gpt_oss_features: `GptOssForCausalLM` as transformers defines it (sinks, q/k/v/o, router and expert biases,
  the clamped SwiGLU alpha 1.702 / limit 7 with its + 1, YaRN factor 32 at original context 16), weights
  large enough that the clamp is reached (golden.json counts the clamped values); saved sharded by
  `save_pretrained(max_shard_size=...)` with its index json.
- deepseek_v3: `DeepseekV3ForCausalLM` at the tiny configuration of the deepseekv3_671b spec (section 5.3: 2 dense
  then 2 MoE layers, MLA with q/kv latents, rope_interleave, YaRN factor 40 with mscale / mscale_all_dim 1, 8
  routed experts in 2 groups, top-2 from 1 group, a shared expert, routed_scaling_factor 2.5), every
  e_score_correction_bias drawn in [0, 0.3) so that the bias moves the selection (golden.json counts the
  tokens whose experts change without it, and how far the logits move with plain RoPE order); saved by
  `save_pretrained` (one tensor per expert, as DeepSeek's checkpoints).
- bert: `BertForPreTraining` with hidden_act gelu_new (the tanh GELU the harness and the MLPerf reference use);
  masked-LM logits at every position, next-sentence logits, and the loss with labels at every position.
"""
from __future__ import annotations

import json

import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data", "hf_golden")
ROWS = 2
VERSIONS = {"torch": torch.__version__, "transformers": transformers.__version__}


def perturb(model: torch.nn.Module, seed: int, std: float, neutral_extras: bool = False,
            sink_std: float = 1.0) -> None:
    """Weights normal(std); norm weights 1 + normal(0.2); biases normal(0.1); sinks normal(sink_std), or
    (neutral_extras) sinks -1e9 and biases 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name.lower():
                p.copy_(1.0 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
            elif name.endswith("sinks"):
                p.copy_(torch.full_like(p, -1e9) if neutral_extras else sink_std * noise)
            elif name.endswith("bias"):
                p.copy_(torch.zeros_like(p) if neutral_extras else 0.1 * noise)
            else:
                p.copy_(std * noise)


def tokens(seed: int, vocab: int, length: int, low: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, vocab, size=(ROWS, length)).astype(np.int32)


def causal_lm(model: torch.nn.Module, toks: np.ndarray) -> tuple[np.ndarray, float]:
    """Logits of the first s positions of rows of s + 1 tokens, and the mean next-token loss over them."""
    ids = torch.tensor(toks, dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    return out.logits[:, :-1].numpy().astype(np.float32), float(out.loss)


def write_case(name: str, model: torch.nn.Module | None, tensors: dict[str, np.ndarray], notes: dict,
               shard: str | None = None) -> str:
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    if model is not None:
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(path, safe_serialization=True, **kwargs)
        gen = os.path.join(path, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
    else:
        os.makedirs(path)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(path, "golden.safetensors"))
    logits = tensors["logits"]
    notes = {"max_abs_logit": float(np.abs(logits).max()), **notes, "versions": VERSIONS}
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump(notes, f, indent=1, sort_keys=True)
        f.write("\n")
    shown = {k: v for k, v in notes.items() if k != "versions"}
    print(f"{name}: {json.dumps(shown)}")
    return path


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# ------------------------------------------------------------------------------------------------ llama

def llama_config(scaled: bool) -> transformers.LlamaConfig:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    if not scaled:
        rope = {"rope_type": "default", "rope_theta": 500000.0}
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                                   max_position_embeddings=128, rms_norm_eps=1e-5, rope_parameters=rope,
                                   tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    cfg._attn_implementation = "eager"
    return cfg


def llama() -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config(True)).eval()
    perturb(model, 1, 0.15)
    toks = tokens(2, 256, 65)
    logits, loss = causal_lm(model, toks)
    plain = transformers.LlamaForCausalLM(llama_config(False)).eval()
    plain.load_state_dict(model.state_dict())
    plain_logits, _ = causal_lm(plain, toks)
    moved = rel(plain_logits, logits)
    assert moved > 1e-2, f"Llama 3.1 scaling changes the logits by only {moved:.2e}"
    notes = {"loss": loss, "rope_scaling_moves_logits": moved}
    path = write_case("llama", model, {"tokens": toks, "logits": logits, "loss": np.array(loss, np.float32)}, notes)
    fused_qkv(path, model, toks, logits, loss)


def fused_qkv(source: str, model: torch.nn.Module, toks: np.ndarray, logits: np.ndarray, loss: float) -> None:
    """llama_fused_qkv: the llama case's tensors with q/k/v fused, in 3 shards named 0-based, old-form config."""
    state = {k: v.numpy().copy() for k, v in model.state_dict().items() if not k.endswith("inv_freq")}
    for i in range(model.config.num_hidden_layers):
        p = f"model.layers.{i}.self_attn"
        state[f"{p}.qkv_proj.weight"] = np.concatenate([state.pop(f"{p}.{n}_proj.weight") for n in "qkv"], 0)
    names = sorted(state)
    parts = [names[j::3] for j in range(3)]
    path = os.path.join(OUT, "llama_fused_qkv")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    weight_map = {}
    for j, part in enumerate(parts):
        file = f"model-{j:05d}-of-{len(parts) - 1:05d}.safetensors"
        save_file({n: state[n] for n in part}, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(v.nbytes for v in state.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    config["model_type"] = "custom_llama"   # as the MLPerf llama2_70b_lora fused checkpoint names itself
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file({"tokens": toks, "logits": logits, "loss": np.array(loss, np.float32)},
              os.path.join(path, "golden.safetensors"))
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump({"max_abs_logit": float(np.abs(logits).max()), "loss": loss,
                   "made_from": "llama, q/k/v fused by this script", "versions": VERSIONS}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"llama_fused_qkv: {len(parts)} shards, {len(state)} tensors")


# ---------------------------------------------------------------------------------------------- gpt-oss

def gpt_oss_config(features: bool) -> transformers.GptOssConfig:
    kwargs = dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, num_local_experts=4, num_experts_per_tok=2,
                  sliding_window=8, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  output_router_logits=False)
    if features:
        kwargs["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16}
    else:
        kwargs.update(rope_parameters={"rope_type": "default", "rope_theta": 150000.0}, swiglu_alpha=1.0,
                      swiglu_limit=1e9)
    cfg = transformers.GptOssConfig(**kwargs)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"
    return cfg


def plain_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
    """The harness's expert activation: silu(gate) * up, gate and up interleaved as transformers stores them."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    return torch.nn.functional.silu(gate) * up


def gpt_oss() -> None:
    from transformers.models.gpt_oss import modeling_gpt_oss as m

    toks = tokens(3, 256, 33)
    clamped = {"n": 0, "of": 0}
    original = m.GptOssExperts._apply_gate

    def counting_gate(self, gate_up):
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        clamped["n"] += int((gate > self.limit).sum() + (up.abs() > self.limit).sum())
        clamped["of"] += 2 * gate.numel()
        return original(self, gate_up)

    torch.manual_seed(0)
    model = m.GptOssForCausalLM(gpt_oss_config(True)).eval()
    perturb(model, 4, 0.25)
    with torch.no_grad():   # gate/up pre-activations of a few units: some pass the clamp at 7
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(2.0)
    m.GptOssExperts._apply_gate = counting_gate
    try:
        logits, loss = causal_lm(model, toks)
    finally:
        m.GptOssExperts._apply_gate = original
    assert clamped["n"] > 0, "the clamp is never reached: draw larger weights"
    moved = {}
    experts = [layer.mlp.experts for layer in model.model.layers]
    for e in experts:
        e.limit = 1e9
    moved["clamp_off_moves_logits"] = rel(causal_lm(model, toks)[0], logits)
    for e in experts:
        e.limit = model.config.swiglu_limit
    sinks = [layer.self_attn.sinks.detach().clone() for layer in model.model.layers]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e9)
        moved["sinks_off_moves_logits"] = rel(causal_lm(model, toks)[0], logits)
        for layer, s in zip(model.model.layers, sinks):
            layer.self_attn.sinks.copy_(s)
    assert rel(causal_lm(model, toks)[0], logits) == 0.0
    write_case("gpt_oss_features", model, {"tokens": toks, "logits": logits, "loss": np.array(loss, np.float32)},
               {"loss": loss, "clamped_values": clamped["n"], "of_values": clamped["of"], **moved}, shard="150KB")

    torch.manual_seed(0)
    model = m.GptOssForCausalLM(gpt_oss_config(False)).eval()
    perturb(model, 5, 0.25, neutral_extras=True)
    unpatched, _ = causal_lm(model, toks)
    m.GptOssExperts._apply_gate = plain_gate
    try:
        logits, loss = causal_lm(model, toks)
    finally:
        m.GptOssExperts._apply_gate = original
    write_case("gpt_oss_plain", model, {"tokens": toks, "logits": logits, "loss": np.array(loss, np.float32)},
               {"loss": loss, "patched": "GptOssExperts._apply_gate = silu(gate) * up (no + 1)",
                "plus_one_moves_logits": rel(unpatched, logits)})


# ------------------------------------------------------------------------------------------- deepseek-v3

def deepseek_v3_config(interleave: bool = True, **overrides) -> transformers.DeepseekV3Config:
    """The tiny DeepSeek-V3 of the goldens; `overrides` change its fields (scripts/make_hf_offpath.py)."""
    fields = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
        first_k_dense_replace=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rms_norm_eps=1e-6, hidden_act="silu", max_position_embeddings=163840, rope_interleave=interleave,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0},
        tie_word_embeddings=False, attention_bias=False)
    cfg = transformers.DeepseekV3Config(**{**fields, **overrides})
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"
    return cfg


def deepseek_v3() -> None:
    toks = tokens(9, 512, 33)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(deepseek_v3_config()).eval()
    perturb(model, 10, 0.15)
    g = torch.Generator().manual_seed(11)
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    with torch.no_grad():
        for gate in gates:   # >= 0: transformers 4.57's 0.0 masking and -inf masking then agree
            gate.e_score_correction_bias.copy_(0.3 * torch.rand(gate.e_score_correction_bias.shape, generator=g))
    chosen = []
    hooks = [gate.register_forward_hook(lambda mod, inp, out: chosen.append(out[2].sort(-1).values)) for gate in gates]
    logits, loss = causal_lm(model, toks)
    biased = list(chosen)
    chosen.clear()
    saved = [gate.e_score_correction_bias.clone() for gate in gates]
    with torch.no_grad():
        for gate in gates:
            gate.e_score_correction_bias.zero_()
        unbiased_logits, _ = causal_lm(model, toks)
        for gate, b in zip(gates, saved):
            gate.e_score_correction_bias.copy_(b)
    for h in hooks:
        h.remove()
    changed = sum(int((a != b).any(-1).sum()) for a, b in zip(biased, chosen))
    assert changed > 0, "the expert bias changes no token's experts: draw larger biases"
    plain = transformers.DeepseekV3ForCausalLM(deepseek_v3_config(interleave=False)).eval()
    plain.load_state_dict(model.state_dict())
    notes = {"loss": loss, "bias_changes_experts_of_tokens": changed, "of_tokens": sum(int(a.shape[0]) for a in biased),
             "bias_off_moves_logits": rel(unbiased_logits, logits),
             "interleave_off_moves_logits": rel(causal_lm(plain, toks)[0], logits),
             "softmax_scale": model.model.layers[0].self_attn.scaling}
    write_case("deepseek_v3", model, {"tokens": toks, "logits": logits, "loss": np.array(loss, np.float32)}, notes)


# ------------------------------------------------------------------------------------------------- bert

def bert() -> None:
    cfg = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, hidden_act="gelu_new", max_position_embeddings=32,
                                  type_vocab_size=2, layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(cfg).eval()
    perturb(model, 6, 0.15)
    model.tie_weights()
    seq = 32
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 128, size=(ROWS, seq)).astype(np.int32)
    segments = (np.arange(seq)[None, :] >= np.array([[12], [20]])).astype(np.int32)
    labels = rng.integers(1, 128, size=(ROWS, seq)).astype(np.int32)
    nsp = np.array([0, 1], np.int32)
    with torch.no_grad():
        def long(a):
            return torch.tensor(a, dtype=torch.long)
        out = model(input_ids=long(ids), token_type_ids=long(segments), attention_mask=long(np.ones_like(ids)),
                    labels=long(labels), next_sentence_label=long(nsp))
    logits = out.prediction_logits.numpy().astype(np.float32)
    write_case("bert", model, {"input_ids": ids, "segment_ids": segments, "masked_lm_ids": labels,
                               "next_sentence_labels": nsp, "logits": logits,
                               "nsp_logits": out.seq_relationship_logits.numpy().astype(np.float32),
                               "loss": np.array(float(out.loss), np.float32)},
               {"loss": float(out.loss)})


def main() -> None:
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    cases = sys.argv[1:] or ["llama", "gpt_oss", "deepseek_v3", "bert"]
    for case in cases:
        globals()[case]()
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"{OUT}: {total / 2 ** 20:.2f} MiB in all")



if __name__ == "__main__":
    main()
