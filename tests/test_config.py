"""Config loading: inheritance, overrides, and strict validation with helpful messages."""
from __future__ import annotations

import os

import pytest

from harness import config as config_lib
from harness.errors import HarnessError

from conftest import SMOKE

pytestmark = pytest.mark.quick


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_smoke_config_inherits_reference_and_overrides_apply():
    cfg = config_lib.load_config(SMOKE, ["schedule.max_epochs=3", "optimizer.base_learning_rate=1e-1",
                                        "model.blocks=[2, 2]"])
    assert cfg.workload == "resnet"
    assert cfg.schedule.max_epochs == 3.0 and isinstance(cfg.schedule.max_epochs, float)
    assert cfg.optimizer.base_learning_rate == pytest.approx(0.1)
    assert cfg.model.blocks == [2, 2]
    assert cfg.data.source == "synthetic"          # from smoke.yaml
    assert cfg.optimizer.end_learning_rate == 0.0001  # from reference.yaml
    assert cfg.check_rulesets == ["0.7.0"]


def test_unknown_key_names_path_and_closest_keys():
    with pytest.raises(HarnessError) as e:
        config_lib.load_config(SMOKE, ["schedule.global_bacth_size=64"])
    msg = str(e.value)
    assert "schedule.global_bacth_size" in msg and "'global_batch_size'" in msg


def test_unknown_top_level_and_workload_section_keys(tmp_path):
    path = write(tmp_path, "c.yaml", f"base: {SMOKE}\nsed: 3\n")
    with pytest.raises(HarnessError, match=r"unknown key 'sed'.*'seed'"):
        config_lib.load_config(path)
    with pytest.raises(HarnessError, match=r"unknown key 'optimizer.momentun'.*'momentum'"):
        config_lib.load_config(SMOKE, ["optimizer.momentun=0.8"])


def test_wrong_type_names_path_and_expected_type():
    with pytest.raises(HarnessError, match=r"schedule.global_batch_size: expected int, got 'big'"):
        config_lib.load_config(SMOKE, ["schedule.global_batch_size=big"])
    with pytest.raises(HarnessError, match=r"model.blocks\[1\]: expected int"):
        config_lib.load_config(SMOKE, ["model.blocks=[1, x]"])
    with pytest.raises(HarnessError, match=r"model.zero_init_residual: expected bool"):
        config_lib.load_config(SMOKE, ["model.zero_init_residual=3"])


def test_out_of_range_and_choices():
    with pytest.raises(HarnessError, match=r"schedule.global_batch_size: 0 is below the minimum 1"):
        config_lib.load_config(SMOKE, ["schedule.global_batch_size=0"])
    with pytest.raises(HarnessError, match=r"runtime.kind: 'gpu' is not one of"):
        config_lib.load_config(SMOKE, ["runtime.kind=gpu"])
    with pytest.raises(HarnessError, match=r"optimizer.name: 'adam' is not one of lars, sgd"):
        config_lib.load_config(SMOKE, ["optimizer.name=adam"])


def test_run_id_is_one_directory_name():
    """run_id names a directory under <output_dir>/<workload>: a path would put the run elsewhere."""
    for bad in ("/abs/path", "..", "a/b", "../up", ".hidden", "a\\b", "x y"):
        with pytest.raises(HarnessError) as e:
            config_lib.load_config(SMOKE, [f"run_id={bad}"])
        assert str(e.value).startswith(f"config run_id: {bad!r} is not a directory name; use letters"), e.value
    for good in ("seed1-20261126-090000", "run_0_seed1_attempt2", "v1.2"):
        assert config_lib.load_config(SMOKE, [f"run_id={good}"]).run_id == good


def test_missing_base_file(tmp_path):
    path = write(tmp_path, "c.yaml", "base: nowhere.yaml\nseed: 1\n")
    with pytest.raises(HarnessError, match=r"base file not found: .*nowhere.yaml"):
        config_lib.load_config(path)


def test_missing_config_and_bad_yaml(tmp_path):
    with pytest.raises(HarnessError, match="config file not found"):
        config_lib.load_config(str(tmp_path / "none.yaml"))
    path = write(tmp_path, "bad.yaml", "workload: [resnet\n")
    with pytest.raises(HarnessError, match="invalid YAML"):
        config_lib.load_config(path)


def test_unknown_workload_and_ruleset(tmp_path):
    path = write(tmp_path, "c.yaml", "workload: resnt\n")
    with pytest.raises(HarnessError, match=r"unknown workload 'resnt'; did you mean resnet"):
        config_lib.load_config(path)
    with pytest.raises(HarnessError, match=r"ruleset: '9.9.9' is not one of"):
        config_lib.load_config(SMOKE, ["ruleset=9.9.9"])
    with pytest.raises(HarnessError, match=r"4.1.0 is not supported for resnet"):
        config_lib.load_config(SMOKE, ["ruleset=4.1.0"])


def test_circular_base(tmp_path):
    a = write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: a.yaml\n")
    with pytest.raises(HarnessError, match="circular"):
        config_lib.load_config(a)


def test_bad_override_syntax():
    with pytest.raises(HarnessError, match="expected key=value"):
        config_lib.load_config(SMOKE, ["schedule.max_epochs"])


def test_resolved_config_round_trips(tmp_path):
    cfg = config_lib.load_config(SMOKE, ["seed=7"])
    out = str(tmp_path / "config.yaml")
    config_lib.dump_config(cfg, out)
    again = config_lib.load_config(out)
    assert config_lib.to_dict(again) == config_lib.to_dict(cfg)


def test_every_shipped_config_loads():
    root = os.path.join(os.path.dirname(SMOKE), "..")
    for workload in os.listdir(root):
        for name in os.listdir(os.path.join(root, workload)):
            if name.endswith(".yaml"):
                config_lib.load_config(os.path.join(root, workload, name))


def test_check_rulesets_regexes_and_non_finite_numbers_fail_at_load():
    with pytest.raises(HarnessError, match=r"check_rulesets\[0\]: 4.1.0 is not supported for resnet"):
        config_lib.load_config(SMOKE, ['check_rulesets=["4.1.0"]'])
    with pytest.raises(HarnessError, match=r"optimizer.exclude_from_decay\[0\]: invalid regex"):
        config_lib.load_config(SMOKE, ['optimizer.exclude_from_decay=["["]'])
    for bad in (".inf", ".nan"):
        with pytest.raises(HarnessError, match=r"schedule.max_epochs: expected a finite number"):
            config_lib.load_config(SMOKE, [f"schedule.max_epochs={bad}"])
