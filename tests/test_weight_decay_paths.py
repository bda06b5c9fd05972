"""The default weight-decay / adaptation exclusions match the variable paths the models really create."""
from __future__ import annotations

import os

import pytest

from conftest import REPO
from tests.helpers.decoder_golden import build_workload

pytestmark = pytest.mark.quick


def built(config: str):
    return build_workload(os.path.join(REPO, config)).optimizer


@pytest.mark.parametrize("config", ["configs/resnet/smoke.yaml", "configs/bert/smoke.yaml"])
def test_norm_and_bias_weights_are_excluded_and_only_they(config):
    opt = built(config)
    paths = [p.path for p in opt.params]
    excluded = {p for p in paths if opt.excluded(p)}
    norm_or_bias = {p for p in paths
                    if "/bn/" in p or "LayerNorm" in p or p.endswith("bias")}
    assert norm_or_bias and excluded == norm_or_bias, sorted(excluded ^ norm_or_bias)
    kernels = [p for p in paths if p.endswith(("kernel", "embeddings"))]
    assert kernels and not any(opt.excluded(p) for p in kernels)


def test_gpt_oss_options_norms_biases_and_sinks_are_excluded_and_only_they():
    """gpt_oss_20b with every architecture option (q/k norm, sinks, attention, router and expert biases)."""
    opt = built("configs/gpt_oss_20b/smoke-published.yaml")
    paths = [p.path for p in opt.params]
    excluded = {p for p in paths if opt.excluded(p)}
    expected = {p for p in paths if p.endswith(("gamma", "bias", "sinks"))}
    assert any(p.endswith("sinks") for p in expected) and any("experts/down/bias" in p for p in expected)
    assert excluded == expected, sorted(excluded ^ expected)
