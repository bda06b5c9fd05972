"""Maps workload names to their Workload classes, importing a workload only when it is asked for."""
from __future__ import annotations

import difflib
import importlib

from harness.errors import HarnessError

# name -> "module:Class"; a workload registers here and nowhere else, and lives in benchmarks/<name>/.
_WORKLOADS = {
    "resnet": "benchmarks.resnet.workload:ResNetWorkload",
    "bert": "benchmarks.bert.workload:BertWorkload",
    "transformer": "benchmarks.transformer.workload:TransformerWorkload",
    "ssd": "benchmarks.ssd.workload:SSDWorkload",
    "gpt_oss_20b": "benchmarks.gpt_oss_20b.workload:GptOssWorkload",
    "llama31_8b": "benchmarks.llama31_8b.workload:LlamaWorkload",
    "llama2_70b_lora": "benchmarks.llama2_70b_lora.workload:LoraWorkload",
    "deepseekv3_671b": "benchmarks.deepseekv3_671b.workload:DeepseekV3Workload",
    "flux1": "benchmarks.flux1.workload:FluxWorkload",
    "dlrmv4": "benchmarks.dlrmv4.workload:DlrmV4Workload",
    "qwen35_397b_grpo": "benchmarks.qwen35_397b_grpo.workload:QwenGrpoWorkload",
}


def names() -> list[str]:
    return sorted(_WORKLOADS)


def cost_model(name: str):
    """The workload's declared cost (`COST`, a harness.plan.cost.CostModel, in benchmarks/<name>/cost.py: FLOPs,
    sample counts and eval positions for `plan`, the dry run and the host-memory estimate); None where it has
    none. TensorFlow-free."""
    get_known(name)
    try:
        return importlib.import_module(f"benchmarks.{name}.cost").COST
    except ModuleNotFoundError:
        return None


def get_known(name: str) -> None:
    if name not in _WORKLOADS:
        close = difflib.get_close_matches(name, names(), n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise HarnessError(f"unknown workload {name!r}{hint} (known: {', '.join(names())})")


def get(name: str) -> type:
    get_known(name)
    module, cls = _WORKLOADS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        raise HarnessError(f"workload {name!r} is registered but not installed ({e})") from None
