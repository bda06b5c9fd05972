"""End-to-end ResNet runs through the CLI: real small runs, real logs, the official checker on them."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from harness.review import logparse

from conftest import REPO, SMOKE, TINY_RESNET, cli_in_process, read_summary, run_cli, run_dir, runs_in_one_process, sets

# A shorter variant of the smoke run for tests that do not need to reach the target.
# One eval, on the closed cadence (every 4 epochs), after 8 steps of 128.
# The model cut to conftest's TINY_RESNET: these tests check the loop's mechanics (an abort's reason and log,
# eval counting, reduction order), not the model.
QUICK = sets(*TINY_RESNET, data__train_samples=256, data__eval_samples=301, schedule__max_epochs=4)


def official_checker(path: str, ruleset: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                           "--ruleset", ruleset, path], capture_output=True, text=True, cwd=os.path.dirname(path))


def event_keys(path: str) -> list[str]:
    return [e.key for e in logparse.parse_log(path)]


def assert_event_order(keys: list[str]) -> None:
    """cache_clear, init_start, ..., init_stop, run_start, (block, eval)+, run_stop."""
    assert keys[0] == "cache_clear" and keys[1] == "init_start"
    i_stop, r_start, r_stop = keys.index("init_stop"), keys.index("run_start"), keys.index("run_stop")
    assert i_stop < r_start < r_stop == len(keys) - 1
    for k in ("submission_org", "submission_benchmark", "seed", "global_batch_size", "train_samples",
              "eval_samples", "opt_name"):
        assert keys.index(k) < i_stop, k
    body = [k for k in keys[r_start + 1:r_stop]]
    cycle = ["block_start", "block_stop", "eval_start", "eval_accuracy", "eval_stop"]
    assert body and len(body) % len(cycle) == 0
    assert body == cycle * (len(body) // len(cycle))


ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # absl / glog's line prefix


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`make run`'s smoke as shipped (tests/test_shipped_configs.py counts on it), run once for this file."""
    out = str(tmp_path_factory.mktemp("smoke") / "runs")
    proc = run_cli("run", os.path.join(REPO, "configs", "resnet", "smoke.yaml"), "--output_dir", out)
    return proc, out


def test_smoke_run_reaches_target_and_passes_official_checker(smoke_run):
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = read_summary(out)
    assert summary["status"] == "success" and summary["compliant"]
    assert summary["evals"][-1]["score"] >= 0.759
    assert summary["synthetic_data"] is True and summary["data_source"] == "synthetic"
    assert all(v["passed"] for v in summary["compliance"].values())
    assert set(summary["compliance"]) == {"4.0.0", "0.7.0"}
    log = summary["log"]
    for ruleset in ("4.0.0", "0.7.0"):
        checked = official_checker(log, ruleset)
        assert checked.returncode == 0 and "SUCCESS" in checked.stdout + checked.stderr, checked.stderr
    assert_event_order(event_keys(log))
    events = logparse.parse_log(log)
    assert next(e.value for e in events if e.key == "harness_data_source") == "synthetic"
    assert next(e.metadata["status"] for e in events if e.key == "run_stop") == "success"
    assert os.path.exists(os.path.join(run_dir(out), "config.yaml"))
    assert "time to train:" in proc.stdout and "SYNTHETIC" in proc.stdout
    assert "compliance (official checker, ruleset 4.0.0): PASS" in proc.stdout
    # The quiet-output promise: no absl / TensorFlow line (tf.data's "Changing the value of option" once was).
    assert not [line for line in (proc.stdout + proc.stderr).splitlines() if ABSL_LINE.match(line)]
    # Each eval counts the whole eval set exactly once.
    assert all(e["counted"] == 1001 for e in summary["evals"])
    # The report reads the harness's own blocks: train time and throughput match the summary.
    run_summary = logparse.summarize(events, log)
    assert run_summary.throughput == pytest.approx(summary["train_samples_per_s"], rel=0.02)
    assert run_summary.time_to_train_min == pytest.approx(summary["time_to_train_min"], abs=0.01)
    # No function was retraced once the timed run started (warm-up compiled everything).
    assert summary["traces"] == {"train": 1, "eval": 1}


def test_smoke_run_reports_model_flops_and_no_mfu_without_a_peak(smoke_run):
    """Model FLOP/s = the cost module's train FLOPs a sample x train samples/s; a CPU has no system file,
    so without runtime.peak_tflops the run says MFU is not known (the budget-spent run below states one)."""
    from harness.config import load_config
    from harness.plan.cost import analytic

    proc, out = smoke_run
    summary = read_summary(out)
    per_sample = analytic(load_config(SMOKE)).train_flops_per_sample
    assert summary["model_flops_per_sample"] == pytest.approx(per_sample)
    assert summary["model_flops_per_s"] == pytest.approx(per_sample * summary["train_samples_per_s"], rel=1e-3)
    assert summary["mfu"] is None
    last = proc.stdout.strip().splitlines()[-3:]
    line = next(l for l in last if l.startswith("model FLOP/s: "))
    assert "synthetic data" in line and "MFU not known" in line and "runtime.peak_tflops" in line


def test_check_command_on_harness_log(smoke_run):
    _, out = smoke_run
    proc = cli_in_process("check", read_summary(out)["log"], "--ruleset", "4.0.0", "--ruleset", "0.7.0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": PASS") == 3  # two rulesets + integrity


# The QUICK runs below, one after another in one process of 2 logical CPUs (one TensorFlow start for the
# three; a one-device run takes the first CPU): conftest.runs_in_one_process.
QUICK_RUNS = {
    # runtime.peak_tflops: a CPU has no system file, so the run's MFU needs a stated peak (0.5 TFLOP/s a device)
    "budget": sets(runtime__peak_tflops=0.5),
    "non_finite": sets(optimizer__name="sgd", optimizer__base_learning_rate=1e12, optimizer__warmup_epochs=0),
    # 1001 eval examples, eval batch 64 over 2 replicas
    "two_replicas": sets(runtime__kind="mirrored", runtime__cpu_devices=2, data__eval_samples=1001,
                         schedule__eval_batch_size=64),
}


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory) -> dict:
    """name -> (its CompletedProcess, its output dir) for each of QUICK_RUNS."""
    out = str(tmp_path_factory.mktemp("quick"))
    procs = runs_in_one_process(2, [[SMOKE, *QUICK, *extra] for extra in QUICK_RUNS.values()], out)
    return {name: (proc, os.path.join(out, str(n))) for n, (name, proc) in enumerate(zip(QUICK_RUNS, procs))}


def test_budget_spent_run_is_aborted_and_compliant_apart_from_target(quick_runs):
    proc, tmp_out = quick_runs["budget"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = read_summary(tmp_out)
    assert summary["status"] == "aborted" and "budget" in summary["reason"]
    assert summary["peak_flops_per_s"] == pytest.approx(0.5e12 * summary["mfu_devices"])
    assert summary["mfu"] == pytest.approx(summary["model_flops_per_s"] / summary["peak_flops_per_s"])
    line = next(l for l in proc.stdout.splitlines() if l.startswith("model FLOP/s: "))
    assert "MFU " in line and "MFU not known" not in line and "runtime.peak_tflops" in line
    log = summary["log"]
    assert_event_order(event_keys(log))
    checked = official_checker(log, "4.0.0")
    assert checked.returncode == 1
    failures = [l for l in (checked.stdout + checked.stderr).splitlines()
                if l.startswith(("WARNING", "ERROR")) and not l.endswith("FAILED")]
    assert len(failures) == 1 and "Failed checks for eval_accuracy" in failures[0]
    # The same log as an open-division submission (no quality target) passes outright.
    open_log = os.path.join(tmp_out, "open.txt")
    with open(log) as src, open(open_log, "w") as dst:
        dst.write(src.read().replace('"value": "closed"', '"value": "open"'))
    checked = official_checker(open_log, "4.0.0")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "aborted" in proc.stdout and "quality target not reached" in proc.stdout


def test_non_finite_loss_aborts_with_reason(quick_runs):
    proc, tmp_out = quick_runs["non_finite"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = read_summary(tmp_out)
    assert summary["status"] == "aborted" and "non-finite" in summary["reason"]
    assert "non-finite" in proc.stdout
    assert_event_order(event_keys(summary["log"]))


def test_eval_counts_exactly_over_two_replicas(quick_runs):
    """1001 eval examples, eval batch 64 over 2 replicas: padding is masked, nothing counted twice."""
    proc, tmp_out = quick_runs["two_replicas"]
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    summary = read_summary(tmp_out)
    assert summary["num_replicas"] == 2
    assert [e["counted"] for e in summary["evals"]] == [1001]
    assert summary["compliance"]["4.0.0"]["verdict"].startswith(("PASS", "FAIL (quality target"))


def test_same_loss_trajectory_on_1_and_4_logical_devices():
    """Batch norm over the global batch makes the math identical; only reduction order differs. (2 replicas
    against 1: every workload's contract, tests/test_workload_contract.py.) Both runs in one process of 4
    logical CPUs (tests/helpers/loss_trajectory.py): the one-device run on the first."""
    script = os.path.join(REPO, "tests", "helpers", "loss_trajectory.py")
    # A global batch of 32 (8 a replica on 4): what is compared is the reduction, not the batch size.
    proc = subprocess.run([sys.executable, script, SMOKE, "6", "4", "schedule.global_batch_size=32",
                           "model.bn_span=32", "optimizer.warmup_epochs=0", "optimizer.base_learning_rate=1.0",
                           *TINY_RESNET], capture_output=True, text=True, cwd=REPO, timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("LOSSES ")]
    assert len(lines) == 2, proc.stderr[-3000:]
    trajectories = {r["replicas"]: r["losses"] for r in (json.loads(l[len("LOSSES "):]) for l in lines)}
    assert sorted(trajectories) == [1, 4], trajectories
    base = trajectories[1]
    assert max(base) - min(base) > 1e-3, base  # the weights are actually moving
    assert trajectories[4] == pytest.approx(base, rel=1e-4, abs=1e-5), (trajectories[4], base)
