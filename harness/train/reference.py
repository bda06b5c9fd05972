"""The reference model a closed-division result must train, declared by each workload, checked here.

The official checker cannot see a model's size, so a closed log from a 2-layer Transformer would pass it.
A workload declares its reference (`Workload.reference_model()`: a name and the values the MLPerf rules fix,
keyed by the config path that sets each one) and what the run actually builds (`Workload.model_settings()`).
This module compares the two for a closed run on real data, refuses a mismatch at load in one line, and
writes the comparison into the log (`harness_model`), so `check` and `package` can judge a log from what it
shows. Synthetic-data runs are smoke tests (they say so everywhere) and keep their small models.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from harness.errors import HarnessError

# Not an MLPerf key (the checkers ignore it): the run's model settings beside the reference's.
LOG_KEY = "harness_model"


@dataclasses.dataclass(frozen=True)
class ReferenceModel:
    """`name` (e.g. 'Transformer-big') and the values the rules fix, by the config path that sets each."""
    name: str
    values: Mapping[str, Any]


def lookup(cfg: Any, dotted: str) -> Any:
    """The value at a dotted config path ('model.num_layers') of a Config or nested mapping; None when the
    path names no config value."""
    node = cfg
    for part in dotted.split("."):
        if isinstance(node, Mapping):
            node = node.get(part)
        elif part in (getattr(node, "sections", None) or {}):
            node = node.sections[part]
        else:
            node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _same(actual: Any, reference: Any) -> bool:
    if isinstance(reference, (list, tuple)):
        return (isinstance(actual, (list, tuple)) and len(actual) == len(reference)
                and all(_same(a, r) for a, r in zip(actual, reference)))
    if isinstance(reference, bool) or isinstance(actual, bool):
        return isinstance(actual, bool) and isinstance(reference, bool) and actual == reference
    if isinstance(reference, (int, float)) and isinstance(actual, (int, float)):
        return abs(float(actual) - float(reference)) <= 1e-9 * max(1.0, abs(float(reference)))
    return actual == reference


def _plain(value: Any) -> Any:
    """JSON-friendly: tuples as lists, integral floats as ints (so 6.0 and 6 print alike)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def differences(settings: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """'key=actual (reference value)' for every reference value the settings do not match, in reference order."""
    out = []
    for key, want in reference.items():
        have = settings.get(key)
        if not _same(have, want):
            out.append(f"{key}={_fmt(have)} (reference {_fmt(want)})")
    return out


def _fmt(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return "missing" if value is None else str(value)


def disclosure(workload: Any) -> dict[str, Any] | None:
    """The `harness_model` log value: the reference's name and values and the run's own (None: no reference)."""
    ref = workload.reference_model()
    if ref is None:
        return None
    settings = workload.model_settings()
    return {"reference_model": ref.name,
            "settings": {k: _plain(settings.get(k)) for k in ref.values},
            "reference": {k: _plain(v) for k, v in ref.values.items()}}


def check_closed_model(workload: Any) -> None:
    """Refuses a closed-division run on real data whose model is not the workload's reference, naming each
    value that differs (raise HarnessError, before any log exists)."""
    cfg = workload.cfg
    if cfg.submission.division != "closed" or workload.is_synthetic:
        return
    ref = workload.reference_model()
    if ref is None:
        return
    off = differences(workload.model_settings(), ref.values)
    if off:
        raise HarnessError(f"closed division on real data needs the reference {ref.name}: {', '.join(off)}; "
                           f"use submission.division=open")


def count_data(config_path: str, overrides: list[str]) -> dict[str, int]:
    """`mlperf-harness data count`: the counts the config's data files hold (on the default runtime: counting
    needs no accelerator)."""
    from harness import config as config_lib
    from harness.runtime import make_runtime

    cfg = config_lib.load_config(config_path, overrides)
    cfg.runtime = config_lib.RuntimeConfig()
    workload = cfg.workload_class(cfg, make_runtime(cfg.runtime))
    counts = workload.data_counts()
    if not counts:
        raise HarnessError(f"data.source={workload.data_source} of {cfg.workload} has no files to count")
    return counts
