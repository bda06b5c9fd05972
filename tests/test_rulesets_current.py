"""Every workload accepts exactly the rulesets of the pinned mlperf-logging that have its benchmark
key: the ruleset's closed and open common rules accept `submission_benchmark` and the per-benchmark rule
files exist. (The ruleset-matrix test proves each accepted ruleset with a real log.)"""
from __future__ import annotations

import os
import re

import pytest
import yaml

from benchmarks import registry
from harness import config
from harness.train import weights_init

pytestmark = pytest.mark.quick

# Rulesets where the key names another benchmark than this workload's model.
OTHER_MODEL = {"ssd": {"2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0", "4.1.0"}}  # RetinaNet


def accepted_keys(ruleset_dir: str, division: str) -> set[str]:
    path = os.path.join(ruleset_dir, f"{division}_common.yaml")
    if not os.path.isfile(path):
        return set()
    with open(path) as f:
        rules = yaml.safe_load(f) or []
    for rule in rules:
        key = rule.get("KEY") if isinstance(rule, dict) else None
        if key and key.get("NAME") == "submission_benchmark":
            return set(re.findall(r"'([a-z0-9_]+)'", str(key.get("CHECK", ""))))
    return set()


def checker_rulesets(benchmark: str) -> set[str]:
    root = weights_init.checker_dir()
    found = set()
    for name in os.listdir(root):
        m = re.fullmatch(r"training_(\d+\.\d+\.\d+)", name)
        if not m:
            continue
        folder = os.path.join(root, name)
        if all(benchmark in accepted_keys(folder, d) and os.path.isfile(os.path.join(folder, f"{d}_{benchmark}.yaml"))
               for d in ("closed", "open")):
            found.add(m.group(1))
    return found


def test_every_workload_accepts_every_ruleset_that_has_its_benchmark():
    for name in registry.names():
        cls = registry.get(name)
        expected = checker_rulesets(cls.MLPERF_KEY) - OTHER_MODEL.get(name, set())
        assert set(cls.RULESETS) == expected, (name, sorted(cls.RULESETS), sorted(expected))
        assert set(cls.RULESETS) <= set(config.RULESETS)


def test_bert_is_not_a_5_1_benchmark_in_the_pinned_checker():
    folder = os.path.join(weights_init.checker_dir(), "training_5.1.0")
    assert "bert" not in accepted_keys(folder, "closed") | accepted_keys(folder, "open")
    assert "bert" in accepted_keys(os.path.join(weights_init.checker_dir(), "training_5.0.0"), "closed")
