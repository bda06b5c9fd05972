"""Every workload accepts exactly the rulesets of the pinned mlperf-logging that have its benchmark
key in the closed division: its closed common rules accept `submission_benchmark` and the per-benchmark rule
file exists. Where the open rules of such a ruleset do not (llama2_70b_lora in 4.0.0 and 4.1.0), an open run
is refused before its log. (The ruleset-matrix test proves each accepted ruleset with a real log.)"""
from __future__ import annotations

import os
import re

import pytest
import yaml

from benchmarks import registry
from harness import config, mlperf
from harness.errors import HarnessError
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


def checker_rulesets(benchmark: str, divisions: tuple[str, ...] = ("closed", "open")) -> set[str]:
    root = weights_init.checker_dir()
    found = set()
    for name in os.listdir(root):
        m = re.fullmatch(r"training_(\d+\.\d+\.\d+)", name)
        if not m:
            continue
        folder = os.path.join(root, name)
        if all(benchmark in accepted_keys(folder, d) and os.path.isfile(os.path.join(folder, f"{d}_{benchmark}.yaml"))
               for d in divisions):
            found.add(m.group(1))
    return found


def test_every_workload_accepts_every_ruleset_that_has_its_benchmark():
    for name in registry.names():
        cls = registry.get(name)
        expected = checker_rulesets(cls.MLPERF_KEY, ("closed",)) - OTHER_MODEL.get(name, set())
        assert set(cls.RULESETS) == expected, (name, sorted(cls.RULESETS), sorted(expected))
        assert set(cls.RULESETS) <= set(config.RULESETS)
        for ruleset in expected - checker_rulesets(cls.MLPERF_KEY, ("open",)):
            with pytest.raises(HarnessError, match=f"open division of ruleset {ruleset} does not list"):
                mlperf.require_benchmark(ruleset, "open", cls.MLPERF_KEY)
        for ruleset in expected & checker_rulesets(cls.MLPERF_KEY, ("open",)):
            mlperf.require_benchmark(ruleset, "open", cls.MLPERF_KEY)


def test_bert_is_not_a_5_1_benchmark_in_the_pinned_checker():
    folder = os.path.join(weights_init.checker_dir(), "training_5.1.0")
    assert "bert" not in accepted_keys(folder, "closed") | accepted_keys(folder, "open")
    assert "bert" in accepted_keys(os.path.join(weights_init.checker_dir(), "training_5.0.0"), "closed")
