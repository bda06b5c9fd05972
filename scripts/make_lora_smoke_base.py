"""Writes the frozen base of a llama2_70b_lora config (its seeded initialization) as a Hugging Face Llama
checkpoint directory, for `model.init_checkpoint` of the smokes (the real benchmark starts from
regisss/llama2-70b-fused-qkv-mlperf). Uses the harness's own export writer (separate q/k/v projections).

usage: python scripts/make_lora_smoke_base.py CONFIG OUT_DIR [key=value ...]
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import registry  # noqa: E402
from harness import config as config_lib  # noqa: E402
from harness.nn import hf_checkpoint  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402


def write_base(config: str, out: str, overrides: list[str]) -> list[str]:
    cfg = config_lib.load_config(config, overrides + ["model.init_checkpoint=", "runtime.kind=default",
                                                      "runtime.fsdp=false"])
    runtime = make_runtime(cfg.runtime)
    workload = registry.get(cfg.workload)(cfg, runtime)
    with runtime.scope():
        workload.make_model()
    variables = {v.path: v.variable for v in runtime.variables()}
    fmt = workload.HF_FORMAT
    layout = fmt.layout(cfg.model, set(), lambda p: p in variables)
    tensors, produce = hf_checkpoint.export_tensors(
        layout, lambda p: hf_checkpoint.host_value(variables[p]), hf_checkpoint.DTYPES["BF16"])
    return hf_checkpoint.write_checkpoint(out, tensors, produce, fmt.config(cfg, "bfloat16"),
                                          hf_checkpoint.parse_size("5GB"))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    files = write_base(sys.argv[1], sys.argv[2], sys.argv[3:])
    print(f"wrote {', '.join(files)} to {sys.argv[2]}")
