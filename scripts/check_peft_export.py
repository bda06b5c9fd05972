"""Checks once, by hand, that a llama2_70b_lora run's export loads in transformers + PEFT and that its adapters
change the logits as the harness's model does (not run by the test suite: it needs the side virtualenv).

Two steps, each in its own environment:
  1. harness side (the harness's .venv): the run's model with its final weights, on fixed token ids; writes the
     logits with the adapters and with them zeroed (the base alone) to an .npz:
       .venv/bin/python scripts/check_peft_export.py harness RUN_DIR logits.npz
  2. reference side (a virtualenv with torch, transformers and peft; OMP_NUM_THREADS=1):
       python scripts/check_peft_export.py peft EXPORT_DIR logits.npz
     loads EXPORT_DIR/base with transformers, the adapters with `PeftModel.from_pretrained`, and EXPORT_DIR/merged
     when present; prints each max |difference| against the harness's logits and the adapters' own effect, and
     exits 1 when PEFT's logits differ from the harness's by more than the tolerance or the adapters change nothing.
"""
from __future__ import annotations

import os
import sys

import numpy as np

TOLERANCE = 2e-3  # float32 on both sides; the harness's frozen base is bfloat16-valued, read as float32 here
BATCH, LENGTH, SEED = 2, 24, 0


def token_ids(vocab: int) -> np.ndarray:
    """Fixed ids without 0 (an end-of-document id would start a new attention segment in the harness)."""
    return np.random.default_rng(SEED).integers(1, vocab, size=(BATCH, LENGTH)).astype(np.int64)


def harness_logits(run_dir: str, out: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tensorflow as tf
    from safetensors import safe_open

    from benchmarks import registry
    from harness import config as config_lib
    from harness.runtime import make_runtime

    cfg = config_lib.load_config(os.path.join(run_dir, "config.yaml"),
                                 ["model.init_checkpoint=", "runtime.kind=default", "runtime.fsdp=false"])
    runtime = make_runtime(cfg.runtime)
    workload = registry.get(cfg.workload)(cfg, runtime)
    with runtime.scope():
        model = workload.make_model()
    with safe_open(os.path.join(run_dir, "final_weights.safetensors"), framework="np") as f:
        for v in runtime.variables():
            if v.path in f.keys():
                v.variable.assign(f.get_tensor(v.path).astype(v.variable.dtype.as_numpy_dtype))
    ids = token_ids(cfg.model.vocab_size)

    def logits() -> np.ndarray:
        hidden, _ = model(tf.constant(ids, tf.int32))
        return model.logits(hidden).numpy()

    with_adapters = logits()
    for v in runtime.variables():
        if "/lora_" in v.path and "/b" in v.path.rsplit("/lora_", 1)[1]:
            v.variable.assign(tf.zeros_like(v.variable))
    np.savez(out, ids=ids, lora=with_adapters, base=logits())
    print(f"wrote {out}: logits {with_adapters.shape}")


def peft_logits(export_dir: str, npz: str) -> int:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = np.load(npz)
    ids = torch.tensor(data["ids"])
    base = AutoModelForCausalLM.from_pretrained(os.path.join(export_dir, "base"), dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = base(ids).logits.numpy()
    model = PeftModel.from_pretrained(base, export_dir).eval()
    with torch.no_grad():
        lora_logits = model(ids).logits.numpy()
    effect = float(np.abs(data["lora"] - data["base"]).max())
    diffs = {"base (transformers) vs harness base": float(np.abs(base_logits - data["base"]).max()),
             "base + adapters (PEFT) vs harness": float(np.abs(lora_logits - data["lora"]).max())}
    merged_dir = os.path.join(export_dir, "merged")
    if os.path.isdir(merged_dir):
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            diffs["merged (transformers) vs harness"] = float(np.abs(merged(ids).logits.numpy() - data["lora"]).max())
    print(f"adapters' effect on the harness's logits: max |with - without| = {effect:.4f}")
    print(f"adapters' effect in PEFT: max |with - without| = {float(np.abs(lora_logits - base_logits).max()):.4f}")
    for what, d in diffs.items():
        print(f"{what}: max |diff| = {d:.2e} ({'OK' if d <= TOLERANCE else 'MISMATCH'})")
    ok = all(d <= TOLERANCE for d in diffs.values()) and effect > 100 * TOLERANCE
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("harness", "peft"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "harness":
        harness_logits(sys.argv[2], sys.argv[3])
    else:
        sys.exit(peft_logits(sys.argv[2], sys.argv[3]))
