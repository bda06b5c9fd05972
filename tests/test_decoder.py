"""The decoder LMs' shared parts (benchmarks/lm/): each model's config is the shared base plus its own keys,
checked as strictly as before; the sizes a layout splits (SPLIT_DIMS) are refused in one line before the
log when they do not divide; a workload without a model cannot be made. Their numbers are pinned by
tests/test_decoder_golden.py."""
from __future__ import annotations

import os

import pytest

from benchmarks.gpt_oss_20b.config import ModelConfig as GptOssModel
from benchmarks.llama31_8b.config import ModelConfig as LlamaModel
from benchmarks.lm.config import DecoderModelConfig
from benchmarks.lm.workload import DecoderLMWorkload
from harness import config as config_lib
from harness.errors import HarnessError

from conftest import REPO, refusals_in_one_process

SMOKE = {name: os.path.join(REPO, "configs", name, "smoke.yaml") for name in ("llama31_8b", "gpt_oss_20b")}


def test_each_model_config_is_the_shared_base_with_its_own_defaults_and_keys():
    shared = {f for f in DecoderModelConfig.__dataclass_fields__}
    for cls in (LlamaModel, GptOssModel):
        assert issubclass(cls, DecoderModelConfig) and shared <= set(cls.__dataclass_fields__)
    assert (LlamaModel().hidden_size, LlamaModel().norm_epsilon) == (4096, 1e-5)
    assert (GptOssModel().hidden_size, GptOssModel().norm_epsilon, GptOssModel().init_stddev) == (2880, 1e-6, 0.008)
    assert not LlamaModel().remat and not GptOssModel().remat


@pytest.mark.parametrize("name, foreign", [("llama31_8b", "num_experts"), ("gpt_oss_20b", "ffn_hidden")])
def test_the_other_models_key_is_refused_by_name(name, foreign):
    with pytest.raises(HarnessError, match=f"model.{foreign}"):
        config_lib.load_config(SMOKE[name], [f"model.{foreign}=8"])
    assert config_lib.load_config(SMOKE[name], ["model.remat=true"]).model.remat


def test_a_workload_without_make_model_cannot_be_made():
    class NoModel(DecoderLMWorkload):
        NAME = MLPERF_KEY = "no_model"

    with pytest.raises(TypeError, match="make_model"):
        NoModel(None, None)


def test_split_sizes_that_do_not_divide_over_the_mesh_are_refused_before_the_log(tmp_path):
    cases = [("llama31_8b", "model.num_kv_heads=1", "heads"), ("llama31_8b", "model.ffn_hidden=127", "ff"),
             ("llama31_8b", "model.vocab_size=63", "vocab"), ("gpt_oss_20b", "model.num_experts=7", "experts"),
             ("gpt_oss_20b", "model.expert_hidden=31", "ff"), ("gpt_oss_20b", "model.vocab_size=63", "vocab")]
    lines = refusals_in_one_process([(os.path.join(REPO, "configs", name, "smoke-mesh.yaml"), [override])
                                     for name, override, _ in cases], str(tmp_path))
    for line, (_, override, dim) in zip(lines, cases):
        key, value = override.split("=")
        assert line.startswith(f"error: {key}={value} does not divide over 2 devices (runtime.layout.{dim}="), line
    assert not os.listdir(tmp_path)  # refused before any run directory or log
