"""The decoder LMs' numbers pinned: loss terms, eval sums and gradient summaries of one forward/backward of
small llama31_8b and gpt_oss_20b models (float32, one device, eager, fixed seed and batch), so a change of
the model code that should be a refactoring is shown to leave them as they were.

Each case is a shipped smoke config with its sizes pinned and overrides that cover one path of the code:
Llama 3.1 RoPE scaling, remat, windowed and blockwise-full attention with document segments, dense causal
attention, the sorted (chunked) and dense MoE dispatch, capacity drops and the router losses.
`python tests/helpers/decoder_golden.py` writes tests/data/decoder_golden.json from the code as it is
(tests/test_decoder_golden.py compares).
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

GOLDEN = os.path.join(REPO, "tests", "data", "decoder_golden.json")
ONE_DEVICE = ["submission.division=open", "runtime.kind=default", "runtime.cpu_devices=0",
              "runtime.precision=float32", "runtime.jit_compile=false", "seed=7"]
# Every size set here, not taken from the smoke configs, so editing a smoke config leaves the pinned numbers be.
LLAMA = ["data.seq_length=32", "data.eod_id=0", "model.vocab_size=64", "model.num_layers=2", "model.num_heads=4",
         "model.num_kv_heads=2", "model.hidden_size=32", "model.head_dim=8", "model.ffn_hidden=48",
         "model.rope_original_context=16"]
GPT = ["data.seq_length=256", "data.eod_id=0", "model.vocab_size=64", "model.hidden_size=32", "model.num_layers=2",
       "model.num_heads=4", "model.num_kv_heads=2", "model.head_dim=8", "model.full_attention_span=128",
       "model.document_attention=true", "model.attention_block=64", "model.num_experts=8",
       "model.experts_per_token=2", "model.expert_hidden=32", "model.moe_group_size=32", "model.moe_block_size=8",
       "model.moe_chunk_blocks=5", "model.sliding_window=128", "model.qk_norm=false",
       "model.output_init_stddev=0.008"]
CASES = {
    "llama": ("llama31_8b", LLAMA),
    "llama_remat": ("llama31_8b", LLAMA + ["model.remat=true", "model.rope_scaling_factor=0"]),
    "gpt_oss_sorted": ("gpt_oss_20b", GPT + ["model.capacity_factor=1.0", "model.load_balancing_coef=0.01",
                                             "model.router_z_loss_coef=0.001"]),
    "gpt_oss_dense_remat": ("gpt_oss_20b", GPT + ["data.seq_length=64", "model.document_attention=false",
                                                  "model.full_attention_span=0", "model.moe_dispatch=dense",
                                                  "model.remat=true", "model.capacity_factor=0.5"]),
}
EXACT = 3  # leading gradient values kept per variable


def build_workload(config: str, overrides: list[str] = (), build: bool = True):
    """The workload of `config` with `overrides` on the runtime the overrides give (ONE_DEVICE: one CPU device,
    float32, eager), its config checked and its model built (`build=False`: only made, for a test of what is
    checked before the build): the tests that work with a workload in process (these cases, the transformers
    goldens, the all-to-all, qwen35's GRPO pieces and endpoint, the weight-decay paths, the data service's
    pipelines) make it here."""
    from benchmarks import registry
    from harness import config as C
    from harness.runtime import make_runtime

    cfg = C.load_config(config, list(overrides))
    rt = make_runtime(cfg.runtime)
    wl = registry.get(cfg.workload)(cfg, rt)
    if build:
        wl.validate_config()
        with rt.scope():
            wl.build()
    return wl


def compute(name: str) -> dict:
    """One case's loss terms, eval sums and per-variable gradient L2 norms and leading values."""
    from harness.train.workload import split_loss

    workload, overrides = CASES[name]
    wl = build_workload(os.path.join(REPO, "configs", workload, "smoke.yaml"), overrides + ONE_DEVICE)
    cfg, rt = wl.cfg, wl.runtime
    rows, seq = 2, cfg.data.seq_length
    tokens = tf.random.stateless_uniform([rows, seq + 1], [11, 13], maxval=cfg.model.vocab_size, dtype=tf.int32)
    variables = rt.variables(trainable=True)
    with tf.GradientTape() as tape:
        terms = split_loss(wl.loss({"tokens": tokens}, tf.constant([0, 0])))[0]
        loss = tf.add_n([t.total / (t.count + t.epsilon) for t in terms.values()])
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, [v.variable for v in variables])]
    evals = wl.eval_step({"tokens": tokens}, tf.constant([1.0, 0.0]))
    return {
        "loss": float(loss),
        "terms": {k: [float(t.total), float(t.count)] for k, t in sorted(terms.items())},
        "eval": {k: float(v) for k, v in sorted(evals.items())},
        "grad_norms": {v.path: float(tf.norm(g)) for v, g in zip(variables, grads)},
        "grad_values": {v.path: [float(x) for x in np.ravel(g.numpy())[:EXACT]] for v, g in zip(variables, grads)},
    }


def main() -> None:
    out = {name: compute(name) for name in CASES}
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    losses = ", ".join(f"{k} loss {v['loss']:.6f}" for k, v in out.items())
    print(f"wrote {GOLDEN}: {losses}")


if __name__ == "__main__":
    main()
