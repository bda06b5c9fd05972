"""A run's final weights: written into its run directory after run_stop (`save_final_weights: true`), and
`mlperf-harness export RUN_DIR --out DIR`, which turns them into a Hugging Face checkpoint directory.

The run directory keeps the model's variables under their own paths in one safetensors file
(`final_weights.safetensors`, the variables' dtype, no optimizer state), written variable by variable after the
log's run_stop, so the time to train never includes it. Export runs on the host alone (no device, no model
built; the workload's module is imported for its layout): it reads the run's config.yaml, asks the workload
for its Hugging Face form (`Workload.HF_FORMAT`) and writes each tensor of that layout from the variables it
is made of (harness/nn/hf_checkpoint.py), sharded with an index json when the tensors exceed one shard.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from harness.errors import HarnessError, check_output_dir
from harness.nn import hf_checkpoint

FILE = "final_weights.safetensors"
DTYPES = {"float32": np.float32, "bfloat16": hf_checkpoint.DTYPES["BF16"]}


def check(cfg: Any, runtime: Any) -> None:
    """Before the log opens: weights are written from one host's memory, so every variable must be whole
    there (one host)."""
    if cfg.save_final_weights and runtime.num_hosts > 1:
        raise HarnessError(f"save_final_weights: the run spans {runtime.num_hosts} hosts and each holds only its "
                           f"shards; weights are written from one host (set save_final_weights: false)")


def model_variables(runtime: Any, workload: Any) -> list[Any]:
    """The model's variables: every runtime variable but the optimizer's (its slots and step)."""
    name = getattr(workload.optimizer, "name", None)
    return [v for v in runtime.variables() if not (name and v.path.startswith(f"{name}/"))]


def save(runtime: Any, workload: Any, run_dir: str) -> str:
    """Writes the model's variables to <run_dir>/final_weights.safetensors (chief only); returns the path."""
    variables = {v.path: v.variable for v in model_variables(runtime, workload)}
    path = os.path.join(run_dir, FILE)
    if not runtime.is_chief:
        return path
    tensors = [(p, tuple(v.shape), v.dtype.as_numpy_dtype) for p, v in variables.items()]
    hf_checkpoint.write_safetensors(path, tensors, lambda p: hf_checkpoint.host_value(variables[p]),
                                    {"format": "mlperf-harness", "workload": workload.NAME})
    return path


def export(run_dir: str, out: str, max_shard: str = "5GB", dtype: str = "float32") -> list[str]:
    """Writes run `run_dir`'s final weights as a Hugging Face checkpoint directory `out`; the files written."""
    from safetensors import safe_open

    from benchmarks import registry
    from harness import config as config_lib

    if dtype not in DTYPES:
        raise HarnessError(f"--dtype {dtype}: choose {' or '.join(DTYPES)}")
    config_path, weights = os.path.join(run_dir, "config.yaml"), os.path.join(run_dir, FILE)
    if not os.path.exists(config_path):
        raise HarnessError(f"{run_dir}: no config.yaml (not a run directory)")
    if not os.path.exists(weights):
        raise HarnessError(f"{run_dir}: no {FILE}; the run must set save_final_weights: true")
    cfg = config_lib.load_config(config_path, [])
    fmt = registry.get(cfg.workload).HF_FORMAT
    if fmt is None:
        raise HarnessError(f"{cfg.workload} has no Hugging Face layout to export to")
    stored = hf_checkpoint.variables_file_tensors(weights)
    layout = fmt.layout(cfg.model, set(), lambda p: p in stored)
    missing = sorted({p for o in layout.outs for p in o.paths if p not in stored})
    if missing:
        raise hf_checkpoint.problems_line(weights, [f"variable {p} missing" for p in missing])
    with safe_open(weights, framework="np") as f:
        tensors, produce = hf_checkpoint.export_tensors(layout, f.get_tensor, DTYPES[dtype])
        return hf_checkpoint.write_checkpoint(out, tensors, produce, fmt.config(cfg, dtype),
                                              hf_checkpoint.parse_size(max_shard), fmt.stem)


def main(args: list[str], out: str | None, max_shard: str, dtype: str) -> int:
    if len(args) != 1:
        raise HarnessError("export takes exactly one RUN_DIR (and --out DIR)")
    if not out:
        raise HarnessError("export needs --out DIR for the Hugging Face checkpoint")
    out = check_output_dir(out, "--out")
    # A directory holding another checkpoint would mix its shards and index with these, and transformers and
    # the importer pick files in different orders: the two would read different weights.
    if os.path.isdir(out) and os.listdir(out):
        raise HarnessError(f"--out {out}: not empty; export writes a whole checkpoint into an empty or new "
                           f"directory")
    files = export(args[0], out, max_shard, dtype)
    print(f"wrote {len(files)} file(s) to {out}: {', '.join(files[:4])}{' ...' if len(files) > 4 else ''}")
    return 0
