"""The loop itself, driven in-process by a one-variable toy workload (tests/helpers/toy.py): target,
budget, non-finite loss, per-example eval outputs gathered in order, retrace detection, gradient
accumulation; and across 2 logical CPUs and 2 processes, where only the chief's verdict stops the run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, free_ports
from harness.review import logparse
from harness.train.loop import CompiledSteps, eval_input, run_timed, train_input, training_seed
from harness.mlperf import MLPerfLog
from harness.runtime import make_runtime
from harness.runtime.base import InputContext
from harness.config import RuntimeConfig

sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
import toy  # noqa: E402


def run_toy(tmp_path, name: str, **kw):
    runtime = make_runtime(RuntimeConfig())
    wl = toy.make(str(tmp_path), runtime, **kw)
    log = MLPerfLog(str(tmp_path / f"{name}.txt"))
    try:
        result = run_timed(runtime, wl, log, lambda: None)
    finally:
        log.close()
    return wl, result, logparse.parse_log(str(tmp_path / f"{name}.txt"))


def test_target_reached_stops_with_success_and_per_example_metrics(tmp_path):
    wl, result, events = run_toy(tmp_path, "target")
    assert result.status == "success" and result.reason.startswith("reached closeness")
    assert result.evals[-1]["score"] >= 0.99 and len(result.evals) < 4
    # Every eval counted the 37 examples once (eval_finalize asserts the order), and the other metric
    # the workload reports is kept beside the main one.
    assert all(e["counted"] == 37 for e in result.evals)
    assert "mean_prediction" in result.evals[-1]["metrics"]
    stop = [e for e in events if e.key == "run_stop"]
    assert stop and stop[0].metadata["status"] == "success"
    # Epochs are numbered from 1: the first block starts in epoch 1 even at a fractional cadence.
    starts = [e.metadata["first_epoch_num"] for e in events if e.key == "block_start"]
    assert starts[0] == 1
    assert result.traces == {"train": 1, "eval": 1}


def test_budget_spent_is_aborted(tmp_path):
    wl, result, _ = run_toy(tmp_path, "budget", target=1.5)
    assert result.status == "aborted" and "budget spent at step" in result.reason and "(epoch 2)" in result.reason
    assert [e["epoch_num"] for e in result.evals] == [0.5, 1, 1.5, 2]


def test_non_finite_loss_aborts_with_reason(tmp_path):
    wl, result, _ = run_toy(tmp_path, "nan", optimizer={"learning_rate": 1e30})
    assert result.status == "aborted" and "non-finite training loss" in result.reason
    assert len(result.evals) == 1  # the block is cut short and evaluated, then the run stops


def test_retrace_inside_the_timed_run_is_counted(tmp_path):
    # The warm-up traces a feature length of 1; the real data has length 2, so the train loop retraces.
    wl, result, _ = run_toy(tmp_path, "retrace", data={"ragged_train": True})
    assert result.traces["train"] == 2


def test_eval_positions_are_never_before_the_end_of_their_epoch(tmp_path):
    runtime = make_runtime(RuntimeConfig())
    # 100 samples per epoch at batch 8: 12.5 steps, so epoch 1 ends inside step 13.
    wl = toy.make(str(tmp_path), runtime, data={"train_samples": 100}, max_epochs=3.0, eval_every_epochs=1.0,
                  global_batch_size=8)
    points = wl.eval_schedule().points
    assert [p.step for p in points] == [13, 25, 38]
    assert all(p.samples >= p.epoch_num * 100 for p in points)


def trained_w(tmp_path, steps: int, **schedule) -> float:
    runtime = make_runtime(RuntimeConfig())
    wl = toy.make(str(tmp_path), runtime, **schedule)
    wl.build()
    compiled = CompiledSteps(runtime, wl)
    it = iter(train_input(runtime, wl, wl.cfg.schedule.global_batch_size, 0))
    compiled.train_loop(it, tf.constant(steps))
    return float(wl.w.numpy())


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    one = trained_w(tmp_path, 3, global_batch_size=8)
    two = trained_w(tmp_path, 3, global_batch_size=8, gradient_accumulation_steps=2)
    four = trained_w(tmp_path, 3, global_batch_size=8, gradient_accumulation_steps=4)
    np.testing.assert_allclose([two, four], [one, one], rtol=1e-6)
    # Not trivially equal: half the batch alone gives another update.
    assert abs(trained_w(tmp_path, 3, global_batch_size=4) - one) > 1e-3


def test_training_seeds_differ_per_step_replica_and_micro_batch():
    seeds = {(r, st, rep, m): tuple(training_seed(r, tf.constant(st, tf.int64), tf.constant(rep), m).numpy())
             for r in (1, 2) for st in (0, 1, 16) for rep in (0, 1) for m in (0, 1)}
    assert len(set(seeds.values())) == len(seeds)
    masks = {k: tf.random.stateless_uniform([64], v).numpy() < 0.5 for k, v in seeds.items()}
    first = masks[(1, 0, 0, 0)]
    assert all(not np.array_equal(first, m) for k, m in masks.items() if k != (1, 0, 0, 0))
    # Deterministic: the same coordinates give the same seed.
    assert tuple(training_seed(1, tf.constant(0, tf.int64), tf.constant(0), 0).numpy()) == seeds[(1, 0, 0, 0)]


def run_py(script: str, env: dict | None = None, timeout: float = 300) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})))


def results_of(proc: subprocess.Popen, timeout: float = 300) -> list[dict]:
    """Every RESULT line the script printed, in order (at least one; the script exited 0)."""
    out, err = proc.communicate(timeout=timeout)
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-2000:] + err[-4000:]
    return [json.loads(l[len("RESULT "):]) for l in lines]


def result_of(proc: subprocess.Popen, timeout: float = 300) -> dict:
    return results_of(proc, timeout)[-1]


TOY_RUN = """
    import json, os, sys
    sys.path.insert(0, os.path.join(os.getcwd(), "tests", "helpers"))
    import toy
    from harness.config import RuntimeConfig
    from harness.train.loop import run_timed
    from harness.mlperf import MLPerfLog
    from harness.runtime import make_runtime
    os.makedirs(os.environ["OUT"], exist_ok=True)
    runtime = make_runtime(RuntimeConfig({runtime}))
    wl = toy.make(os.environ["OUT"], runtime, {kw})
    wl.chief_only_metric = {chief_only}
    log = MLPerfLog(os.path.join(os.environ["OUT"], "log.txt") if runtime.is_chief else None)
    r = run_timed(runtime, wl, log, lambda: None)
    log.close()
    print("RESULT " + json.dumps(dict(status=r.status, steps=r.steps, evals=[e["score"] for e in r.evals],
                                      counted=[e["counted"] for e in r.evals], replicas=runtime.num_replicas,
                                      chief=runtime.is_chief)))
"""


def test_two_replicas_train_and_evaluate_like_one(tmp_path):
    """Both runs in one process of 2 logical CPUs (one TensorFlow start): the one-device run on the first."""
    script = "import os\nfrom harness.runtime.distribute import configure_logical_cpus\nconfigure_logical_cpus(2)\n"
    for name, rt in (("one", "kind='default'"), ("two", "kind='mirrored', cpu_devices=2")):
        script += f"os.environ['OUT'] = {str(tmp_path / name)!r}\n" + textwrap.dedent(TOY_RUN).format(
            runtime=rt, kw="max_epochs=1.0", chief_only=False)
    results = results_of(run_py(script))
    assert len(results) == 2, results
    runs = dict(zip(("one", "two"), results))
    assert runs["one"]["replicas"] == 1 and runs["two"]["replicas"] == 2
    assert runs["one"]["steps"] == runs["two"]["steps"]
    np.testing.assert_allclose(runs["two"]["evals"], runs["one"]["evals"], rtol=1e-6)
    assert all(c == 37 for c in runs["two"]["counted"])


def test_two_processes_stop_at_the_chief_verdict(tmp_path):
    """Only the chief's metric says the target is reached; both processes still stop at that eval."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(run_py(TOY_RUN.format(runtime="kind='multi_worker', cpu_devices=1", kw="", chief_only=True),
                            env={"OUT": str(tmp_path / f"w{i}"), "TF_CONFIG": tf_config}))
    try:
        chief, other = (result_of(p) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert chief["chief"] and not other["chief"]
    assert chief["status"] == other["status"] == "success"
    assert chief["steps"] == other["steps"] and chief["evals"] == other["evals"]
    assert len(chief["evals"]) < 4  # stopped early, at the target, not at the budget


def test_progress_lines_and_tensorboard_scalars(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from harness.train.progress import Progress

    runtime = make_runtime(RuntimeConfig())
    wl = toy.make(str(tmp_path), runtime, log_every_steps=2, steps_per_loop=5)
    tb = str(tmp_path / "tensorboard")
    log = MLPerfLog(str(tmp_path / "log.txt"))
    result = run_timed(runtime, wl, log, lambda: None, Progress(True, tb, "epoch", wl.METRIC, wl.target))
    log.close()
    lines = capsys.readouterr().out.splitlines()
    steps = [l for l in lines if l.strip().startswith("step ")]
    # A line every 2 steps (chunks of 5 are cut to end on them), with loss, rate and learning rate.
    assert [int(l.split()[1]) for l in steps] == list(range(2, result.steps + 1, 2))
    assert all("loss" in l and "lr 0.3" in l and "samples/s" in l and "next eval in" in l for l in steps)
    acc = EventAccumulator(tb, size_guidance={"tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])  # TF2 summaries store scalars as tensors of the scalars plugin
    assert {"train/loss", "train/learning_rate", "train/samples_per_s", "eval/closeness",
            "eval/mean_prediction"} <= tags
    closeness = [float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("eval/closeness")]
    assert len(closeness) == len(result.evals)
    assert closeness[-1] == pytest.approx(result.evals[-1]["score"], rel=1e-6)
    # One train point per compiled chunk (chunks end at log steps and at evals), the last at the end.
    train_steps = [e.step for e in acc.Tensors("train/loss")]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == result.steps


class _HostPipeline:
    """A runtime that hands back the host's tf.data pipeline itself, to read its options."""

    def distribute_dataset(self, dataset_fn, global_batch: int, seed: int) -> tf.data.Dataset:
        return dataset_fn(InputContext(num_hosts=1, host_id=0, batch_size=global_batch, seed=seed))


def test_input_pipelines_run_no_autotune_thread(tmp_path):
    # Destroying an iterator joins its autotune thread, which can sleep out a period of up to 60 s
    # first: a run's iterators would hold its end. The workload's training options ask for autotune.
    wl = toy.make(str(tmp_path), make_runtime(RuntimeConfig()))
    pipelines = [train_input(_HostPipeline(), wl, 10, 0), train_input(_HostPipeline(), wl, 10, 0, dummy=True),
                 eval_input(_HostPipeline(), wl, 10, 0), eval_input(_HostPipeline(), wl, 10, 0, dummy=True)]
    assert [p.options().autotune.enabled for p in pipelines] == [False] * 4
