"""Reduced-width dry runs of the hardware configs, built once per test session and shared by
tests/test_dry_run.py and tests/test_tpu_rules.py (each build and trace costs seconds)."""
from __future__ import annotations

import functools
import glob
import os

from harness.train import dryrun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per workload: the model's width and depth cut down (layout divisibility kept: 4 heads, ff and hidden
# divisible by a model axis of 4). SSD's closed rules demand the reference model, so it runs as open.
REDUCED = {
    "resnet": ["model.width=8", "model.blocks=[1,1,1,1]"],
    "bert": ["model.hidden_size=64", "model.num_layers=1", "model.num_heads=4", "model.ff_size=128"],
    "ssd": ["model.width=8", "model.blocks=[1,1,1]", "submission.division=open"],
    "transformer": ["model.hidden_size=64", "model.num_layers=1", "model.num_heads=4", "model.filter_size=128"],
}

HARDWARE_CONFIGS = sorted(os.path.relpath(f, REPO) for pattern in ("reference", "gpu-*", "tpu-*")
                          for f in glob.glob(os.path.join(REPO, "configs", "*", f"{pattern}.yaml")))


def workload_of(config: str) -> str:
    return config.split(os.sep)[1]


@functools.lru_cache(maxsize=None)
def reduced_report(config: str, optimize: bool = False) -> dryrun.CompileReport:
    return dryrun.compile_report(os.path.join(REPO, config), REDUCED[workload_of(config)], optimize=optimize)
