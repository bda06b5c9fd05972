"""Reference configs against mlperf-logging's RCP files, and `check --rcp` on small sets of logs."""
from __future__ import annotations

import json
import os
import zlib

import pytest

from benchmarks import registry
from harness import config as config_lib
from harness.errors import HarnessError
from harness.review.rcp import logged_key, rcp_path, rcp_report
from harness.runtime import make_runtime

from conftest import REPO, cli_in_process, stderr_error_lines

pytestmark = pytest.mark.quick

# model_bn_span depends on the device count (per-replica batch), not on the config: a system sets it.
DEVICE_DEPENDENT = ("model_bn_span",)


@pytest.mark.parametrize("config", ["configs/resnet/reference.yaml", "configs/bert/reference.yaml"])
def test_closed_reference_config_matches_an_rcp_entry(config):
    """Batch size and every optimizer hyperparameter equal those of the RCP entry at that batch size,
    for each ruleset the config checks that has RCPs (read from the JSON mlperf-logging ships)."""
    cfg = config_lib.load_config(os.path.join(REPO, config), ["runtime.kind=default"])
    assert cfg.submission.division == "closed"
    workload = registry.get(cfg.workload)(cfg, make_runtime(cfg.runtime))
    logged = dict(workload.mllog_hparams(), global_batch_size=cfg.schedule.global_batch_size,
                  gradient_accumulation_steps=cfg.schedule.gradient_accumulation_steps)
    checked = 0
    for ruleset in [cfg.ruleset] + list(cfg.check_rulesets):
        if int(ruleset.split(".")[0]) < 1:
            continue  # no RCPs before 1.0.0
        with open(rcp_path(workload.MLPERF_KEY, ruleset)) as f:
            rcps = json.load(f)
        entries = [e for e in rcps.values() if e["BS"] == logged["global_batch_size"]]
        assert entries, f"{ruleset}: no RCP at batch {logged['global_batch_size']}"
        for key, want in entries[0]["Hyperparams"].items():
            if key in DEVICE_DEPENDENT:
                continue
            name = logged_key(key, logged)
            assert name is not None, f"{ruleset}: RCP hyperparameter {key} is not logged"
            assert logged[name] == pytest.approx(want) if not isinstance(want, str) else logged[name] == want, \
                f"{ruleset}: {name}={logged[name]!r}, RCP {key}={want!r}"
        checked += 1
    assert checked >= 1


# ---------------------------------------------------------------------------------- check --rcp

def write_log(path: str, benchmark: str, batch: int, converged_at: float | None) -> str:
    """A minimal log with what the RCP reader reads: benchmark, batch, evals, run_stop status."""
    def line(key, value=None, **metadata):
        return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                         "key": key, "value": value, "metadata": metadata})

    out = [line("submission_benchmark", benchmark), line("submission_division", "closed"),
           line("global_batch_size", batch), line("opt_base_learning_rate", 10.5),
           line("seed", zlib.crc32(str(path).encode()))]  # runs differ: copies of one log are refused
    last = converged_at if converged_at is not None else 40
    out.append(line("eval_accuracy", 0.5, epoch_num=last - 4))
    out.append(line("eval_accuracy", 0.76 if converged_at is not None else 0.7, epoch_num=last))
    out.append(line("run_stop", status="success" if converged_at is not None else "aborted"))
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path


def rcp_mean(benchmark: str, ruleset: str, batch: int) -> float:
    with open(rcp_path(benchmark, ruleset)) as f:
        epochs = sorted(next(e for e in json.load(f).values() if e["BS"] == batch)["Epochs to converge"])
    return sum(epochs[1:-1]) / (len(epochs) - 2)


def test_runs_near_the_rcp_mean_pass_and_say_where_they_sit(tmp_path):
    mean = rcp_mean("resnet", "4.0.0", 3264)
    logs = [write_log(str(tmp_path / f"result_{i}.txt"), "resnet", 3264, e)
            for i, e in enumerate([35, 36, 35, 37, 36])]
    r = rcp_report([str(tmp_path)], "4.0.0")
    assert r.verdict == "PASS" and r.record == "resnet_ref_3264"
    assert r.rcp_mean == pytest.approx(mean) and r.olympic_mean == pytest.approx(35 + 2 / 3)
    assert [run.value for run in r.runs] == [35, 36, 35, 37, 36]
    proc = cli_in_process("check", "--rcp", *logs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resnet_ref_3264" in proc.stdout and "official rcp_checker: PASS" in proc.stdout
    assert f"{100 * (37 / mean - 1):+.1f}% vs the RCP mean" in proc.stdout


def test_runs_much_faster_than_the_rcp_fail(tmp_path):
    for i in range(5):
        write_log(str(tmp_path / f"result_{i}.txt"), "resnet", 3264, 24)
    r = rcp_report([str(tmp_path)], "4.0.0")
    assert r.verdict == "FAIL" and r.olympic_mean < r.fastest_allowed < r.rcp_mean
    proc = cli_in_process("check", "--rcp", str(tmp_path))
    assert proc.returncode == 1 and "faster than allowed" in proc.stdout


def test_bert_samples_interpolated_and_few_runs_report_positions_only(tmp_path):
    one = write_log(str(tmp_path / "result_0.txt"), "bert", 500, 2_400_000)
    r = rcp_report([one], "4.0.0")
    assert r.verdict == "n/a" and r.unit == "samples" and r.record.startswith("interpolated between batch 448")
    assert r.runs[0].value == 2_400_000 and r.rcp_mean is not None


def test_bad_input_is_one_error_line(tmp_path):
    a = write_log(str(tmp_path / "result_0.txt"), "resnet", 3264, 35)
    b = write_log(str(tmp_path / "result_1.txt"), "resnet", 1632, 35)
    for args in (["check", "--rcp", a, b], ["check", "--rcp", a, "--ruleset", "0.7.0"],
                 ["check", "--rcp", str(tmp_path / "missing")]):
        proc = cli_in_process(*args)
        assert proc.returncode == 2 and len(stderr_error_lines(proc)) == 1, proc.stderr
    with pytest.raises(HarnessError, match="one global_batch_size"):
        rcp_report([a, b], "4.0.0")


def test_lora_rcp_hyperparameters_are_read_from_the_log_keys_that_hold_them():
    """llama2_70b_lora's RCP files name the reference's arguments (lora_r, opt_max_grad_norm, max_steps); the
    log holds them as lora_rank, opt_gradient_clip_norm and opt_learning_rate_training_steps."""
    from harness.review import rcp

    _, entry = rcp.rcp_entry("llama2_70b_lora", "5.0.0", 8)
    logged = {"opt_base_learning_rate": 0.0004, "opt_gradient_clip_norm": 0.3, "gradient_accumulation_steps": 1,
              "lora_rank": 16, "lora_alpha": 32, "opt_learning_rate_training_steps": 1024}
    missing = rcp.hparam_mismatches(entry, logged)
    assert all("not logged" in m for m in missing) and not any(k in " ".join(missing) for k in (
        "lora_r", "opt_max_grad_norm", "max_steps")), missing
    assert "lora_r: RCP 16, logged lora_rank=8" in rcp.hparam_mismatches(entry, dict(logged, lora_rank=8))
