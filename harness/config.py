"""Typed, strict run configuration: YAML with `base:` inheritance and `--set` overrides.

A typo must never silently fall back to a default, so every key is checked against the dataclass it
fills: an unknown key names its dotted path and the closest valid keys, a wrong type names the path and
the expected type, and a value out of range names the bound. Workloads add their own `data`, `model` and
`optimizer` sections as dataclasses.

This module is harness/'s one way to the workloads (benchmarks/registry.py): `load_config` resolves the
config's workload name once, and the Config carries its class (`Config.workload_class`) and cost module
(`Config.cost_model`) to every command that needs them.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import re
import typing
from typing import Any

import yaml

from harness.benchmark_rules import RULESETS
from harness.errors import HarnessError

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_RUN_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def field(default: Any = dataclasses.MISSING, *, choices: tuple | None = None, min: float | None = None,
          max: float | None = None, doc: str = "", default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field carrying validation metadata (allowed choices, numeric bounds)."""
    meta = {"choices": choices, "min": min, "max": max, "doc": doc}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass
class SubmissionConfig:
    org: str = field("mlperf-harness", doc="submission_org")
    platform: str = field("cpu", doc="submission_platform (the system name)")
    division: str = field("closed", choices=("closed", "open"))
    status: str = field("research", choices=("cloud", "onprem", "preview", "research"))


@dataclasses.dataclass
class RuntimeConfig:
    kind: str = field("default", choices=("default", "mirrored", "multi_worker", "tpu", "mesh"))
    cpu_devices: int = field(0, min=0, doc="run on the CPU, split into N logical devices (tests; 0 = no "
                             "split). multi_worker: 1 = each worker on its CPU (without it, a worker that "
                             "sees no GPU is refused)")
    gpus: int = field(-1, min=-1, doc="mirrored: number of GPUs to use (-1 = all visible; 0 is refused: "
                      "TensorFlow reads an empty device list as every device)")
    slurm_port_base: int = field(8888, min=1, max=65535, doc="multi_worker without TF_CONFIG, started by srun: "
                                 "the k-th task on a node listens on this port + k")
    tpu: str = field("", doc="TPU name or grpc:// address for kind=tpu ('' = $TPU_NAME if set, else this "
                     "host's TPU ('local', a TPU VM))")
    tpu_timeout_s: float = field(120.0, min=1.0, doc="give up connecting to the TPU after this long")
    collective_timeout_s: float = field(600.0, min=0.0, doc="multi_worker: a compiled call (a chunk of "
                                        "steps_per_loop steps, an eval batch, a broadcast) waiting longer "
                                        "than this fails the run (a hung or stopped peer); must cover the "
                                        "slowest legitimate call, the chief scoring while others wait "
                                        "included; a call that traces and compiles (the first of each "
                                        "function, the warm-up) runs without it (0 = wait forever)")
    precision: str = field("float32", choices=("float32", "bfloat16", "float16"),
                           doc="compute dtype; variables, optimizer state, loss and batch-norm statistics "
                           "stay float32; float16 adds dynamic loss scaling")
    loss_scale_initial: float = field(32768.0, min=1.0, doc="precision=float16: the first loss scale")
    loss_scale_growth_steps: int = field(2000, min=1, doc="precision=float16: finite steps in a row "
                                         "before the loss scale doubles (a non-finite step halves it)")
    jit_compile: bool | None = field(None, doc="XLA on the per-replica train and eval steps (the host loop "
                                     "never); null = on for GPU/TPU, off on CPU. Refused for several CPU "
                                     "replicas; no effect on a CPU mesh")
    mesh: dict[str, int] = field(default_factory=lambda: {"data": 1, "model": 1},
                                 doc="kind=mesh: mesh dimension sizes")
    layout: dict[str, str] = field(default_factory=dict,
                                   doc="kind=mesh: named tensor dimension -> mesh dimension")
    fsdp: bool = field(False, doc="kind=mesh: fully sharded data parallelism: every variable (weights, "
                       "optimizer slots) also split over the batch mesh dimension on its largest dimension "
                       "that dimension's size divides (too small: replicated), gathered where the model "
                       "reads it; gradients reduced into the shards")
    spatial_partition: list[int] = field(default_factory=list,
                                         doc="kind=tpu: split image inputs [batch, height, width, channels] "
                                         "this many ways per dimension over one replica's cores, e.g. "
                                         "[1, 8, 1, 1] (height over 8 cores; replicas = cores / 8); only "
                                         "dimension 1 may be split; [] = off")
    allow_platform_mismatch: bool = field(False, doc="closed division: run even though the devices used "
                                          "differ from those submission.platform declares (experiments; "
                                          "such a result is filed under the wrong system)")
    host_memory_check: bool = field(True, doc="on the host CPU: refuse, before the log opens, a run whose "
                                    "estimated peak host memory exceeds the memory available "
                                    "(harness/train/host_memory.py); false runs it anyway")
    peak_tflops: float = field(0.0, min=0.0, doc="peak dense bf16/fp16 TFLOP/s of one device, for the run's "
                               "MFU (model FLOP/s over devices x peak); 0 = the peak of the plan system file "
                               "(harness/plan/systems/*.yaml) whose device_match names the device, none "
                               "matching: MFU not reported (CPUs)")

    def __post_init__(self) -> None:
        if self.gpus == 0:
            raise HarnessError("config runtime.gpus: 0 would mean every visible GPU to TensorFlow (an empty "
                               "device list); set runtime.gpus=-1 for all GPUs, N > 0 for N, or "
                               "runtime.cpu_devices=N to run on the CPU")
        if self.fsdp and self.kind != "mesh":
            raise HarnessError(f"config runtime.fsdp: true needs runtime.kind=mesh (got {self.kind!r}): FSDP "
                               "splits variables over a DTensor mesh's data dimension")


@dataclasses.dataclass
class ScheduleConfig:
    global_batch_size: int = field(256, min=1)
    eval_batch_size: int = field(0, min=0, doc="global eval batch (0 = global_batch_size)")
    max_epochs: float = field(10.0, min=0.0, doc="training budget; the run aborts when it is spent")
    eval_every_epochs: float = field(1.0, min=0.0, doc="eval cadence in epochs (0 = workload default)")
    eval_offset_epochs: float = field(0.0, min=0.0, doc="first eval at this epoch when > 0 (then every "
                                      "eval_every_epochs); 0: first eval after eval_every_epochs")
    eval_epochs: list[float] = field(default_factory=list,
                                     doc="explicit eval epochs (replaces cadence and offset when given)")
    target: float = field(0.0, min=0.0, doc="quality target (0 = the ruleset's closed target)")
    steps_per_loop: int = field(100, min=1, doc="train steps per host round-trip (capped at a block)")
    log_every_steps: int = field(0, min=0, doc="print a progress line every N train steps (0 = only at "
                                 "evals); chunks of steps_per_loop are cut to end on these steps")
    gradient_accumulation_steps: int = field(1, min=1, doc="micro-batches per optimizer step; each "
                                             "replica's batch is split this many ways")


@dataclasses.dataclass
class Config:
    workload: str = field("resnet")
    ruleset: str = field("4.0.0", choices=RULESETS)
    seed: int = field(0, min=0)
    output_dir: str = field("logs", doc="runs go to <output_dir>/<workload>/<run_id>/")
    run_id: str = field("", doc="'' = timestamp + seed")
    tensorboard: bool = field(False, doc="write TensorBoard scalars under <run dir>/tensorboard (chief)")
    check_rulesets: list[str] = field(default_factory=list,
                                      doc="more rulesets to run the official checker for, besides `ruleset`")
    save_final_weights: bool = field(False, doc="after run_stop, write the model's weights to <run dir>/"
                                     "final_weights.safetensors (mlperf-harness export makes a Hugging Face "
                                     "checkpoint of them)")
    submission: SubmissionConfig = field(default_factory=SubmissionConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    # Not fields (so never dumped or read back): the YAML file the run was loaded from (MLPerf config_filename),
    # and the Workload class `workload` names, resolved once by load_config.
    config_file = ""
    workload_class = None
    # The workload's own sections (data, model, optimizer, ...), keyed by their top-level YAML name.
    sections: dict[str, Any] = field(default_factory=dict, doc="internal")

    def __post_init__(self) -> None:
        # run_id names one directory under output_dir/<workload>: a path (/abs, a/b, ..) would write elsewhere.
        if self.run_id and not _RUN_ID.fullmatch(self.run_id):
            raise HarnessError(f"config run_id: {self.run_id!r} is not a directory name; use letters, digits, "
                               f"'.', '_' and '-', not starting with '.' ('' = timestamp + seed); the run "
                               f"goes to <output_dir>/<workload>/<run_id>/")

    @property
    def data(self) -> Any:
        return self.sections.get("data")

    @property
    def cost_model(self) -> Any:
        """The workload's declared cost (`COST`, a harness.plan.cost.CostModel, in benchmarks/<name>/cost.py:
        FLOPs, eval positions and memory figures for `plan`, the dry run and the run's MFU line); None where it
        has none."""
        return find_cost_model(self.workload)

    @property
    def model(self) -> Any:
        return self.sections.get("model")

    @property
    def optimizer(self) -> Any:
        return self.sections.get("optimizer")

    def section(self, name: str) -> Any:
        return self.sections[name]


# ----------------------------------------------------------------------------------------- loading

CONFIG_MAX_BYTES = 1_000_000
CONFIG_MAX_VALUES = 100_000  # values after YAML aliases are expanded: the shipped configs hold a few hundred
CONFIG_MAX_DEPTH = 50
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where installed: pure Python is slow


def _check_expanded_size(path: str, data: Any) -> None:
    """HarnessError when `data` nests deeper than CONFIG_MAX_DEPTH or holds more than CONFIG_MAX_VALUES values
    once aliases are expanded (a 400-byte "billion laughs" file expands to gigabytes when printed or merged).
    Counts with a stack and stops at the limit, so the check itself stays small."""
    stack, seen = [(data, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > CONFIG_MAX_VALUES:
            raise HarnessError(f"config {path}: more than {CONFIG_MAX_VALUES:,} values once its YAML aliases are "
                               "expanded; write the values out")
        if depth > CONFIG_MAX_DEPTH:
            raise HarnessError(f"config {path}: nested more than {CONFIG_MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            stack += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]


def read_yaml_with_bases(path: str, _seen: tuple[str, ...] = ()) -> dict:
    """Reads a YAML config, merging it over the file named by its `base:` key (relative paths allowed)."""
    path = os.path.abspath(path)
    if path in _seen:
        raise HarnessError(f"config {path}: circular 'base:' chain ({' -> '.join(_seen + (path,))})")
    if not os.path.isfile(path):
        raise HarnessError(f"config file not found: {path}" if not _seen
                           else f"config {_seen[-1]}: base file not found: {path}")
    size = os.path.getsize(path)
    if size > CONFIG_MAX_BYTES:
        raise HarnessError(f"config {path}: {size:,} bytes; a config is a few KB (at most {CONFIG_MAX_BYTES:,})")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_LOADER) or {}
    except yaml.YAMLError as e:
        raise HarnessError(f"config {path}: invalid YAML: {str(e).splitlines()[0]}") from None
    except UnicodeDecodeError as e:
        raise HarnessError(f"config {path}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset "
                           f"{e.start})") from None
    except RecursionError:
        raise HarnessError(f"config {path}: nested too deeply to read (a config nests a few levels)") from None
    _check_expanded_size(path, data)
    if not isinstance(data, dict):
        raise HarnessError(f"config {path}: top level must be a mapping, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise HarnessError(f"config {path}: 'base' must be a file path")
    base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
    return deep_merge(read_yaml_with_bases(base_path, _seen + (path,)), data)


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Applies `a.b.c=value` overrides; values parse as YAML scalars (so 1e-3, true, [1,2] work)."""
    data = dict(data)
    for item in overrides:
        if "=" not in item:
            raise HarnessError(f"--set {item!r}: expected key=value (e.g. schedule.max_epochs=5)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = {}
            node[p] = dict(child)
            node = node[p]
        node[parts[-1]] = value
    return data


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Checks `value` against the annotation `tp`, converting only where lossless (int -> float)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, path)
            except HarnessError:
                pass
        raise HarnessError(f"config {path}: expected {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise HarnessError(f"config {path}: expected a list of {_type_name(item_tp)}, got {value!r}")
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise HarnessError(f"config {path}: expected a mapping, got {value!r}")
        return {_coerce(k, key_tp, path): _coerce(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value)  # PyYAML (YAML 1.1) reads 1e-3 without a dot as a string
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise HarnessError(f"config {path}: expected a finite number, got {value!r}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported config annotation {tp} at {path}")
    raise HarnessError(f"config {path}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Builds dataclass `cls` from a mapping, strictly (unknown keys, types, choices, ranges)."""
    where = path or "(top level)"
    if not isinstance(data, dict):
        raise HarnessError(f"config {where}: expected a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("doc") != "internal"}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            valid = ", ".join(sorted(fields))
            raise HarnessError(f"config: unknown key '{path + '.' if path else ''}{key}'{hint} "
                               f"(valid keys here: {valid})")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        sub = f"{path}.{name}" if path else name
        value = _coerce(data[name], hints[name], sub)
        meta = f.metadata
        if meta.get("choices") and value not in meta["choices"]:
            raise HarnessError(f"config {sub}: {value!r} is not one of {', '.join(map(str, meta['choices']))}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if meta.get("min") is not None and value < meta["min"]:
                raise HarnessError(f"config {sub}: {value} is below the minimum {meta['min']}")
            if meta.get("max") is not None and value > meta["max"]:
                raise HarnessError(f"config {sub}: {value} is above the maximum {meta['max']}")
        kwargs[name] = value
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    if isinstance(obj, Config):
        out = {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "sections"}
        out.update({k: to_dict(v) for k, v in obj.sections.items()})
        return out
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


# ------------------------------------------------------------------------- the way to the workloads

def _registry() -> Any:
    from benchmarks import registry  # late: the registry imports workloads, which import this module

    return registry


def workload_names() -> list[str]:
    return _registry().names()


def find_workload(name: str) -> type:
    """The Workload class registered as `name` (HarnessError: unknown, or registered but not installed)."""
    return _registry().get(name)


def find_cost_model(name: str) -> Any:
    """The declared CostModel of a known workload (`COST` in benchmarks/<name>/cost.py); None where it has
    none."""
    return _registry().cost_model(name)


def workload_folder(name: str) -> str:
    """benchmarks/<name>/ of a known workload: where its files beside the code live (its data manifest)."""
    registry = _registry()
    registry.get_known(name)
    return os.path.join(os.path.dirname(os.path.abspath(registry.__file__)), name)


def load_config(path: str, overrides: list[str] | None = None) -> Config:
    """Loads, inherits, overrides and validates a run config, including the workload's own sections; the
    Config carries the workload class its name resolves to."""
    data = apply_overrides(read_yaml_with_bases(path), list(overrides or []))
    name = data.get("workload")
    if not isinstance(name, str):
        raise HarnessError(f"config {path}: 'workload' must name one of {', '.join(workload_names())}")
    workload_cls = find_workload(name)
    sections = workload_cls.SECTIONS
    plain = {k: v for k, v in data.items() if k not in sections}
    cfg = from_dict(Config, plain)
    cfg.config_file = path
    cfg.workload_class = workload_cls
    cfg.sections = {key: from_dict(cls, data.get(key) or {}, key) for key, cls in sections.items()}
    for i, ruleset in enumerate([cfg.ruleset] + list(cfg.check_rulesets)):
        where = "ruleset" if i == 0 else f"check_rulesets[{i - 1}]"
        if ruleset not in workload_cls.RULESETS:
            note = workload_cls.RULESET_NOTE
            raise HarnessError(f"config {where}: {ruleset} is not supported for {name} "
                               f"(supported: {', '.join(workload_cls.RULESETS)}){'; ' + note if note else ''}")
    for key, section in cfg.sections.items():
        _check_regex_lists(section, key)
    return cfg


def _check_regex_lists(section: Any, path: str) -> None:
    """Weight-decay exclusion patterns are regexes: a bad one must fail here, not mid-run."""
    for f in dataclasses.fields(section):
        if "exclude" in f.name:
            for i, pattern in enumerate(getattr(section, f.name) or []):
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise HarnessError(f"config {path}.{f.name}[{i}]: invalid regex {pattern!r} ({e})") from None


def dump_config(cfg: Config, path: str) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
