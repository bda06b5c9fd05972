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

import errno
import os
import shutil
import tempfile
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


def export(run_dir: str, out: str, max_shard: str = "5GB", dtype: str = "float32", merged: bool = False) -> list[str]:
    """Writes run `run_dir`'s final weights as a Hugging Face checkpoint directory `out`; the files written.

    A run with LoRA adapters (a workload with `PEFT_FORMAT`) is written as PEFT writes adapters
    (adapter_config.json, adapter_model.safetensors), with the frozen base beside them in base/ when the run
    started from no public checkpoint, and, when `merged`, the base with the adapters folded in under merged/.
    """
    from safetensors import safe_open

    from harness import config as config_lib

    if dtype not in DTYPES:
        raise HarnessError(f"--dtype {dtype}: choose {' or '.join(DTYPES)}")
    config_path, weights = os.path.join(run_dir, "config.yaml"), os.path.join(run_dir, FILE)
    if not os.path.exists(config_path):
        raise HarnessError(f"{run_dir}: no config.yaml (not a run directory)")
    if not os.path.exists(weights):
        raise HarnessError(f"{run_dir}: no {FILE}; the run must set save_final_weights: true")
    cfg = config_lib.load_config(config_path, [])
    workload = cfg.workload_class
    fmt, peft = workload.HF_FORMAT, getattr(workload, "PEFT_FORMAT", None)
    if fmt is None:
        raise HarnessError(f"{cfg.workload} has no Hugging Face layout to export to")
    stored = hf_checkpoint.variables_file_tensors(weights)
    lora = peft is not None and any(peft.is_adapter(p) for p in stored)
    if merged and not lora:
        raise HarnessError(f"--merged: {run_dir} holds no LoRA adapters to merge (its export is the whole model)")
    layout = fmt.layout(cfg.model, set(), lambda p: p in stored)
    missing = sorted({p for o in layout.outs for p in o.paths if p not in stored})
    if missing:
        raise hf_checkpoint.problems_line(weights, [f"variable {p} missing" for p in missing])
    size = hf_checkpoint.parse_size(max_shard)
    with safe_open(weights, framework="np") as f:
        tensors, produce = hf_checkpoint.export_tensors(layout, f.get_tensor, DTYPES[dtype])
        if not lora:
            return hf_checkpoint.write_checkpoint(out, tensors, produce, fmt.config(cfg, dtype), size,
                                                  fmt.stem)
        return _export_lora(peft, cfg, out, f.get_tensor, tensors, produce, fmt.config(cfg, dtype), size, dtype,
                            merged)


def _export_lora(peft: Any, cfg: Any, out: str, read: Any, tensors: list, produce: Any, hf_config: dict,
                 size: int, dtype: str, merged: bool) -> list[str]:
    """The adapters in PEFT's format in `out`; the base in base/ (no public checkpoint); merged/ on request."""
    import json

    pairs = peft.adapters(cfg.model, read)
    adapter = peft.adapter_tensors(pairs)
    os.makedirs(out, exist_ok=True)
    hf_checkpoint.write_safetensors(os.path.join(out, "adapter_model.safetensors"),
                                    [(n, t.shape, DTYPES[dtype]) for n, t in adapter.items()],
                                    adapter.__getitem__, {"format": "pt"})
    # The reference's own base is public (and 140 GB): named, not copied. Any other base (a smoke's seeded one)
    # is written beside the adapters, from the run's own frozen weights: exactly what they were trained on.
    from harness.train.reference import lookup

    values = cfg.workload_class.REFERENCE_MODEL.values
    public_base = bool(cfg.model.init_checkpoint) and all(lookup(cfg, k) == v for k, v in values.items())
    base = peft.REFERENCE_BASE if public_base else "base"
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(peft.adapter_config(cfg.model, base), f, indent=2, sort_keys=True)
        f.write("\n")
    written = ["adapter_config.json", "adapter_model.safetensors"]
    if not public_base:  # the adapters belong to the run's own randomly initialized base
        written += [f"base/{n}" for n in hf_checkpoint.write_checkpoint(os.path.join(out, "base"), tensors, produce,
                                                                        hf_config, size)]
    if merged:
        def produce_merged(name: str) -> Any:
            module = name.removesuffix(".weight")
            return peft.merged(produce(name), pairs[module], cfg.model) if module in pairs else produce(name)

        written += [f"merged/{n}" for n in hf_checkpoint.write_checkpoint(os.path.join(out, "merged"), tensors,
                                                                          produce_merged, hf_config, size)]
    return written


def tokenizer_line(run_dir: str) -> str:
    """Where the exported model's tokenizer comes from (export writes weights only)."""
    from harness import benchmark_rules as rules
    from harness import config as config_lib

    cfg = config_lib.load_config(os.path.join(run_dir, "config.yaml"), [])
    workload = cfg.workload_class
    reference = getattr(getattr(workload, "REFERENCE_MODEL", None), "values", None) or {}
    vocab = getattr(cfg.model, "vocab_size", None)
    return rules.tokenizer_source(workload.MLPERF_KEY, vocab or 0, reference.get("model.vocab_size"))


def main(args: list[str], out: str | None, max_shard: str, dtype: str, merged: bool = False) -> int:
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
    # Written into a private folder beside `out`, then renamed onto it in one step: rename(2) onto an empty
    # or missing directory succeeds, onto one another export filled meanwhile fails (two exports started
    # together never mix their files; the emptiness check above and the write are not one step).
    os.makedirs(os.path.dirname(out), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out.rstrip(os.sep))}.partial-", dir=os.path.dirname(out))
    try:
        files = export(args[0], staging, max_shard, dtype, merged)
        try:
            os.rename(staging, out)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise HarnessError(f"--out {out}: filled by another writer while this export ran; nothing "
                                   "written there") from None
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    tokenizer = tokenizer_line(args[0])
    with open(os.path.join(out, "TOKENIZER.md"), "w") as f:
        f.write(f"# Tokenizer\n\nNot written by `mlperf-harness export`. Its source: {tokenizer}.\n")
    print(f"wrote {len(files)} file(s) to {out}: {', '.join(files[:4])}{' ...' if len(files) > 4 else ''}")
    print(f"tokenizer (not written): {tokenizer}")
    return 0
