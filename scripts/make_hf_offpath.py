"""Tiny checkpoints written by Hugging Face `transformers` at configurations the golden cases
(scripts/make_hf_goldens.py) do not take, into tests/data/hf_offpath/<case>/, for tests/test_hf_offpath.py:
the harness's import must give transformers' logits for each, or refuse it in one line.

Run it in an environment with torch and transformers (the harness never imports them):

    python3 -m venv ../hfref && ../hfref/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors numpy
    OMP_NUM_THREADS=1 ../hfref/bin/python scripts/make_hf_offpath.py

(the committed files: torch 2.13.0+cpu, transformers 5.24.0; golden.json records the versions). float32 on the
CPU, eager attention, fixed seeds; weights drawn as make_hf_goldens.py draws them.

Cases:
- llama_tied: `LlamaForCausalLM` with tie_word_embeddings true: `save_pretrained` writes no lm_head.weight
  and transformers uses the embedding as the LM head. Equal logits expected.
- llama_untied_no_head: the same model untied, saved, then lm_head.weight removed from the file: transformers
  loads it with the key reported missing and a fresh random head (golden.json: its missing_keys). The
  harness must refuse it, not tie the head silently.
- deepseek_v3_k3: `DeepseekV3ForCausalLM` with 12 routed experts in 4 groups, 3 experts per token from 2
  groups (k / topk_group = 1.5, where transformers scores a group by its top 2 experts and Megatron by its
  top k // topk_group = 1), and rms_norm_eps 1e-5 (transformers' MLA latent norms keep 1e-6), with the latent
  projections scaled down (latents of RMS ~4e-3) so that the latent norms' epsilon shows. golden.json records
  how far Megatron's group rule and latent norms at rms_norm_eps would move the logits.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from make_hf_goldens import causal_lm, deepseek_v3_config, perturb, rel, tokens  # noqa: E402

OUT = os.path.join(REPO, "tests", "data", "hf_offpath")
VERSIONS = {"torch": torch.__version__, "transformers": transformers.__version__}


def write(name: str, model: torch.nn.Module, toks: np.ndarray, logits: np.ndarray | None, notes: dict) -> str:
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path, safe_serialization=True)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    if logits is not None:
        save_file({"tokens": toks, "logits": np.ascontiguousarray(logits)}, os.path.join(path, "golden.safetensors"))
        notes = {"max_abs_logit": float(np.abs(logits).max()), **notes}
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump({**notes, "versions": VERSIONS}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{name}: {json.dumps(notes)}")
    return path


def llama_config(tied: bool) -> transformers.LlamaConfig:
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64, rms_norm_eps=1e-5,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                   tie_word_embeddings=tied, attention_bias=False, mlp_bias=False)
    cfg._attn_implementation = "eager"
    return cfg


def llama() -> None:
    toks = tokens(21, 128, 33)
    torch.manual_seed(0)
    tied = transformers.LlamaForCausalLM(llama_config(True)).eval()
    perturb(tied, 22, 0.2)
    tied.tie_weights()
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    logits, _ = causal_lm(tied, toks)
    path = write("llama_tied", tied, toks, logits, {})
    assert "lm_head.weight" not in load_file(os.path.join(path, "model.safetensors"))

    untied = transformers.LlamaForCausalLM(llama_config(False)).eval()
    perturb(untied, 23, 0.2)
    path = write("llama_untied_no_head", untied, toks, None, {})
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    del tensors["lm_head.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    _, info = transformers.LlamaForCausalLM.from_pretrained(path, output_loading_info=True)
    assert "lm_head.weight" in info["missing_keys"], info
    with open(os.path.join(path, "golden.json")) as f:
        notes = json.load(f)
    notes["transformers_missing_keys"] = sorted(info["missing_keys"])
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump(notes, f, indent=1, sort_keys=True)
        f.write("\n")


def deepseek_config() -> transformers.DeepseekV3Config:
    """Twelve experts in four groups, top-3 of 2 groups: the ratio at which the group scores of transformers
    and Megatron differ."""
    return deepseek_v3_config(
        vocab_size=128, moe_intermediate_size=16, num_hidden_layers=3, first_k_dense_replace=1,
        n_routed_experts=12, num_experts_per_tok=3, n_group=4, topk_group=2, rms_norm_eps=1e-5)


def _router_summing_top(n: int):
    """DeepseekV3TopkRouter.forward with a group scored by its top `n` experts (Megatron's rule at n = k //
    topk_group), the rest as transformers computes it."""
    def forward(self, hidden_states):
        hidden_states = hidden_states.view(-1, self.hidden_dim)
        router_logits = torch.nn.functional.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))
        scores = router_logits.sigmoid()
        choice = scores + self.e_score_correction_bias
        per_group = self.num_experts // self.num_group
        group_scores = choice.view(-1, self.num_group, per_group).topk(n, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        mask = mask.unsqueeze(-1).expand(-1, self.num_group, per_group).reshape(-1, self.num_experts)
        choice = choice.masked_fill(~mask.bool(), float("-inf"))
        idx = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.routed_scaling_factor
        return router_logits, weights, idx
    return forward


def deepseek() -> None:
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdl

    toks = tokens(31, 128, 33)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(deepseek_config()).eval()
    perturb(model, 32, 0.15)
    g = torch.Generator().manual_seed(33)
    with torch.no_grad():
        for layer in model.model.layers:
            # latents of RMS ~4e-3, so that the latent norms' epsilon (1e-6 against 1e-5) shows in the logits
            layer.self_attn.q_a_proj.weight.mul_(0.003)
            layer.self_attn.kv_a_proj_with_mqa.weight.mul_(0.003)
            if hasattr(layer.mlp, "gate"):
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(0.3 * torch.rand(bias.shape, generator=g))
    logits, _ = causal_lm(model, toks)
    original = mdl.DeepseekV3TopkRouter.forward
    mdl.DeepseekV3TopkRouter.forward = _router_summing_top(3 // 2)
    try:
        megatron_logits, _ = causal_lm(model, toks)
    finally:
        mdl.DeepseekV3TopkRouter.forward = original
    for layer in model.model.layers:
        layer.self_attn.q_a_layernorm.variance_epsilon = 1e-5
        layer.self_attn.kv_a_layernorm.variance_epsilon = 1e-5
    eps_logits, _ = causal_lm(model, toks)
    for layer in model.model.layers:
        layer.self_attn.q_a_layernorm.variance_epsilon = 1e-6
        layer.self_attn.kv_a_layernorm.variance_epsilon = 1e-6
    assert np.array_equal(causal_lm(model, toks)[0], logits)
    notes = {"megatron_group_rule_moves_logits": rel(megatron_logits, logits),
             "latent_norm_eps_1e-5_moves_logits": rel(eps_logits, logits)}
    write("deepseek_v3_k3", model, toks, logits, notes)


def main() -> None:
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for case in sys.argv[1:] or ["llama", "deepseek"]:
        globals()[case]()
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"{OUT}: {total / 2 ** 20:.2f} MiB in all")


if __name__ == "__main__":
    main()
