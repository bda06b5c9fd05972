"""What one sample costs: the small source of truth the planner projects from.

Each workload declares what `plan` (and the dry run and the host-memory estimate) reads of it once, as the
`COST` CostModel of its `benchmarks/<name>/cost.py`: the model cost, the eval positions (from the same
TensorFlow-free cadence its run's `eval_schedule` uses), the convergence unit and table, and the optional facts
(activation and kept bytes, a real-token cost).

A ModelCost comes from one of three places, named in `source`:
- the workload's own analytic count (`benchmarks/<name>/cost.py`, `COST.model_cost(cfg)`), the default: layer by
  layer multiply-adds from the config, 2 FLOPs each, training = 3 x forward (forward + the two backward
  matmuls), cross-checked against TensorFlow's graph count on a small model in tests/test_plan.py;
- the dry-run compile (`harness.dryrun.command.compile_report`, XLA's cost analysis, handed in by the command
  line), via `from_compile_report`;
- a JSON file of either (`--model_cost FILE`).

Every one of them costs a sample at its full length. A workload whose samples vary in length (BERT) may
also state what a sample costs when an implementation skips the padding: `CostModel.real_token_cost(cfg,
fraction)`, the fraction being the mean share of real tokens; `with_real_tokens` applies it (`plan
--real_token_fraction F`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping

from harness.errors import HarnessError


_KIND_WORDS = {"float": "a number", "int": "a whole number", "str": "a string"}


def _of_kind(value: Any, kind: str) -> bool:
    """Whether a JSON value fits a ModelCost field annotated `kind` ('float', 'int' or 'str'; others: any)."""
    if kind not in _KIND_WORDS:
        return True
    if kind == "str":
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return kind == "float" or float(value).is_integer()


@dataclasses.dataclass
class ModelCost:
    workload: str
    source: str                    # "counted (...)" | "xla cost analysis" | "file ..."
    train_flops_per_sample: float  # one training sample, forward + backward
    eval_flops_per_sample: float   # one eval sample (forward; beam search counted by the workload)
    params: int
    gradient_bytes: float          # bytes all-reduced per step per replica (params x gradient dtype)
    optimizer_bytes_per_param: float  # HBM bytes the optimizer update reads + writes per parameter
    train_samples: int             # one epoch
    eval_samples: int
    sample_unit: str               # "image", "sequence", "row of 256 tokens", ...
    mp_bytes_per_sample: float = 0.0  # activation bytes all-reduced per sample in a model-parallel group
    fsdp_gather_bytes: float = 0.0    # FSDP (runtime.fsdp): the weight bytes one all-gather of the weights moves
                                      # over the data axis (0: no FSDP); the gradients are reduce-scattered
    fsdp_gathers_per_step: int = 2    # FSDP gathers the weights for the forward pass and again for the backward
    frozen_bytes: float = 0.0         # weights held but never trained (a fine-tune's frozen base), not in params:
                                      # no gradients, no optimizer state
    # Where an eval's work runs (benchmarks/<name>/cost.py states it): the forward pass over eval_samples on
    # the devices, split over the chips (eval_flops_per_sample); scoring on one host per eval sample (COCO
    # mAP, BLEU: does not shrink with the chips); a fixed cost per eval (gathering the metric, the loop).
    eval_host_seconds_per_sample: float = 0.0
    eval_fixed_seconds: float = 0.0
    eval_host_seconds: float = 0.0    # older name of a per-eval cost that does not shrink with the chips: added
                                      # to eval_fixed_seconds (cost modules and files written before the split)
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "model cost") -> "ModelCost":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise HarnessError(f"{where}: unknown key(s) {', '.join(unknown)}")
        # A string or null where a number belongs would only fail later, deep in the projection.
        wrong = [f"{f.name} must be {_KIND_WORDS[f.type]}, not {data[f.name]!r}" for f in dataclasses.fields(cls)
                 if f.name in data and not _of_kind(data[f.name], f.type)]
        if wrong:
            raise HarnessError(f"{where}: {'; '.join(wrong)}")
        try:
            return cls(**data)
        except TypeError as e:
            raise HarnessError(f"{where}: {e}") from None


@dataclasses.dataclass(frozen=True)
class CostModel:
    """What `plan`, the dry run and the host-memory estimate read of one workload: `COST` in its
    benchmarks/<name>/cost.py, TensorFlow-free.

    `model_cost(cfg)`; `eval_positions(cfg, upto, global_batch)`: the run's eval positions through the first
    at or past `upto` (a run stops only at an eval), from the cadence its `eval_schedule` uses;
    `converge_unit` ("epochs" or "samples": what the RCP tables count) and `convergence` (a documented table
    where no RCP ships); `train_activation_bytes(cfg, rows)` (the train step's peak beyond its variables) and
    `kept_activation_bytes(cfg, rows)` (what it keeps for the backward pass, at least), None where not
    estimated; `real_token_cost(cfg, fraction)` for samples whose padding an implementation may skip, and
    `dataset_real_tokens` (sequence length, mean real share, source) the MLPerf data measures;
    `routed_slots(cfg)`: an MoE's routed-expert rows computed per token, where the dispatch pads them."""
    model_cost: Callable[[Any], ModelCost]
    eval_positions: Callable[[Any, float, int], list[float]]
    converge_unit: str
    convergence: Mapping[str, Any] | None = None
    train_activation_bytes: Callable[[Any, int], int] | None = None
    kept_activation_bytes: Callable[[Any, int], int] | None = None
    real_token_cost: Callable[[Any, float], ModelCost] | None = None
    dataset_real_tokens: tuple[int, float, str] | None = None
    routed_slots: Callable[[Any], float] | None = None


def workload_cost_model(workload: str) -> CostModel:
    """The workload's declared CostModel (`COST` in benchmarks/<name>/cost.py)."""
    from harness.config import find_cost_model

    declared = find_cost_model(workload)
    if declared is None:
        raise HarnessError(f"workload {workload!r} has no cost model (benchmarks/{workload}/cost.py)")
    return declared


def analytic(cfg: Any) -> ModelCost:
    return workload_cost_model(cfg.workload).model_cost(cfg)


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
               type(None): "null"}
EXPECTED = "a JSON object (a ModelCost, or a dry-run compile report from run --dry_run --report_json)"


def from_file(path: str) -> ModelCost:
    if not os.path.isfile(path):
        raise HarnessError(f"--model_cost {path}: {'a directory' if os.path.isdir(path) else 'no such file'}; "
                           f"expected {EXPECTED}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise HarnessError(f"--model_cost {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise HarnessError(f"--model_cost {path}: not UTF-8 text; expected {EXPECTED}") from None
    except json.JSONDecodeError as e:
        raise HarnessError(f"--model_cost {path}: not JSON ({e}); expected {EXPECTED}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"--model_cost {path}: holds {_JSON_KINDS.get(type(data), 'no object')}; expected "
                           f"{EXPECTED}")
    if "train_flops_per_replica_step" in data:  # a CompileReport.to_dict()
        return from_compile_report_dict(data, None)
    cost = ModelCost.from_dict(data, f"--model_cost {path}")
    cost.source = f"{cost.source} (file {path})"
    return cost


def from_compile_report_dict(report: dict[str, Any], base: ModelCost | None) -> ModelCost:
    """Per-sample figures from a dry-run CompileReport (dict form); dataset sizes and the optimizer's
    traffic come from `base` (the analytic cost of the same config) when given."""
    try:
        per_replica = float(report["per_replica_batch"])
        eval_batch = float(report.get("eval_per_replica_batch") or per_replica)
        fields = dict(
            workload=report["workload"], source=f"{report.get('flops_source', 'xla cost analysis')} (dry run)",
            train_flops_per_sample=float(report["train_flops_per_replica_step"]) / per_replica,
            eval_flops_per_sample=float(report["eval_flops_per_replica_step"]) / eval_batch,
            params=int(report["params"]), gradient_bytes=float(report["gradient_bytes"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise HarnessError(f"compile report: missing or bad field ({e})") from None
    if base is None:
        base = ModelCost(fields["workload"], "", 0, 0, 0, 0, 16.0, 0, 0, "sample")
    return dataclasses.replace(base, **fields)


def from_compile_report(config_path: str, overrides: list[str], cfg: Any,
                        compile_report: Callable[[str, list[str]], Any]) -> ModelCost:
    """Compiles the config with the dry run (`compile_report`, minutes at full size on a CPU) and reads its cost."""
    report = compile_report(config_path, overrides)
    return from_compile_report_dict(report.to_dict(), analytic(cfg))


def skips_padding(declared: CostModel) -> bool:
    """Whether the workload's samples vary in length, so that an implementation may skip their padding."""
    return declared.real_token_cost is not None


def with_real_tokens(cfg: Any, declared: CostModel, fraction: float | None) -> ModelCost:
    """The analytic cost of one sample when `fraction` of its tokens are real (None: the padded cost)."""
    if fraction is None:
        return analytic(cfg)
    if not skips_padding(declared):
        raise HarnessError(f"--real_token_fraction: {cfg.workload}'s samples have no padding to skip (its cost "
                           f"module states no real_token_cost)")
    if not 0.0 < fraction <= 1.0:
        raise HarnessError(f"--real_token_fraction {fraction:g}: give the mean share of real (non-padding) "
                           "tokens, above 0 and at most 1")
    return declared.real_token_cost(cfg, fraction)


def conv_macs(size: int, k: int, cin: int, cout: int, stride: int = 1, pad: bool = True) -> tuple[int, int]:
    """(multiply-adds, output side) of a k x k conv on a size x size map (SAME, or VALID when pad=False)."""
    out = -(-size // stride) if pad else (size - k) // stride + 1
    return out * out * k * k * cin * cout, out
