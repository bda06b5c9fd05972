"""weights_initialization: the names come from the installed checker, every mapped path is a real
variable of the model, and a model that cannot name every required tensor is refused before any log."""
from __future__ import annotations

import os

import pytest

from benchmarks import registry
from harness import config as config_lib
from harness.train import weights_init
from harness.errors import HarnessError

from conftest import REPO, cli_in_process, sets, stderr_error_lines

pytestmark = pytest.mark.quick

# Reference configs at tiny widths on one device: the variable structure (what the map names) is the
# reference's.
TINY_RESNET = ["runtime.kind=default", "model.width=4", "data.image_size=16", "data.num_classes=10"]
TINY_BERT = ["runtime.kind=default", "model.hidden_size=32", "model.num_heads=2", "model.ff_size=64",
             "model.vocab_size=64", "model.max_position=32", "data.seq_length=32", "data.max_predictions=4",
             "model.init_checkpoint="]
CONFIGS = [("resnet/smoke.yaml", []), ("resnet/reference.yaml", TINY_RESNET),
           ("bert/smoke.yaml", []), ("bert/reference.yaml", TINY_BERT)]


def workload_for(config: str, overrides: list[str]):
    from harness.runtime import make_runtime

    cfg = config_lib.load_config(os.path.join(REPO, "configs", config), overrides)
    return registry.get(cfg.workload)(cfg, make_runtime(cfg.runtime))


def test_required_names_come_from_the_installed_checker():
    for ruleset in ("1.1.0", "2.0.0", "2.1.0"):
        resnet = weights_init.required_tensors("resnet", ruleset, "closed")
        bert = weights_init.required_tensors("bert", ruleset, "closed")
        assert len(resnet) == 161 and "stage4_unit3_conv3_weight" in resnet and "conv0_weight" in resnet
        assert len(bert) == 398 and "bert/encoder/layer_23/output/LayerNorm/beta" in bert
    for benchmark in ("resnet", "bert"):
        assert weights_init.required_tensors(benchmark, "4.0.0", "closed") is None
        assert weights_init.required_tensors(benchmark, "2.1.0", "open") is None  # open: not checked
    names, asking = weights_init.required_for_run("resnet", ["4.0.0", "0.7.0", "2.0.0", "2.1.0"], "closed")
    assert len(names) == 161 and asking == ["2.0.0", "2.1.0"]


@pytest.mark.parametrize("config,overrides", CONFIGS, ids=[c for c, _ in CONFIGS])
def test_every_mapped_path_is_a_variable_of_the_built_model(config, overrides):
    workload = workload_for(config, overrides)
    mapping = workload.weights_initialization_map()
    workload.build()
    paths = {v.path for v in workload.runtime.variables(trainable=True)}
    assert mapping and not set(mapping.values()) - paths, sorted(set(mapping.values()) - paths)
    if config.endswith("reference.yaml"):  # the reference structure names every required tensor
        planned = weights_init.plan(workload, ["2.1.0"], "closed")
        assert len(planned) == len(weights_init.required_tensors(workload.MLPERF_KEY, "2.1.0", "closed"))
        assert set(planned.values()) <= paths


def test_smaller_model_is_refused_naming_the_missing_tensors():
    workload = workload_for("resnet/smoke.yaml", [])  # 3 stages of one block, not ResNet-50's 3-4-6-3
    with pytest.raises(HarnessError, match=r"ruleset 2\.1\.0 requires .* 161 tensors .* cannot name 120 of "
                                           r"them \(stage1_unit2_bn1_beta, .* and 114 more\)"):
        weights_init.plan(workload, ["2.1.0"], "closed")
    assert weights_init.plan(workload, ["4.0.0", "0.7.0"], "closed") == {}
    assert weights_init.plan(workload, ["2.1.0"], "open") == {}


def test_refusal_is_one_error_line_before_any_log(tmp_out):
    proc = cli_in_process("run", os.path.join(REPO, "configs", "resnet", "smoke.yaml"), "--output_dir", tmp_out,
                          *sets(ruleset="2.1.0", submission__division="closed"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = stderr_error_lines(proc)
    assert len(lines) == 1 and "weights_initialization" in lines[0]
    assert "161 tensors" in lines[0] and "cannot name 120 of them (stage1_unit2_" in lines[0]
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_out)
