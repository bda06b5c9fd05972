"""The loop itself, driven in-process by a one-variable toy workload (tests/helpers/toy.py): target,
budget, non-finite loss, per-example eval outputs gathered in order, retrace detection, gradient
accumulation; and across 2 logical CPUs and 2 processes, where only the chief's verdict stops the run."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from harness import logparse
from harness.loop import CompiledSteps, run_timed, train_input
from harness.mlperf import MLPerfLog
from harness.runtime import make_runtime
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
    assert result.status == "aborted" and "budget of 2 epochs spent" in result.reason
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


def run_py(script: str, env: dict | None = None, timeout: float = 300) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})))


def result_of(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-2000:] + err[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


TOY_RUN = """
    import json, os, sys
    sys.path.insert(0, os.path.join(os.getcwd(), "tests", "helpers"))
    import toy
    from harness.config import RuntimeConfig
    from harness.loop import run_timed
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
    runs = {}
    for name, rt in (("one", "kind='default'"), ("two", "kind='mirrored', cpu_devices=2")):
        runs[name] = result_of(run_py(TOY_RUN.format(runtime=rt, kw="max_epochs=1.0", chief_only=False),
                                      env={"OUT": str(tmp_path / name)}))
    assert runs["two"]["replicas"] == 2
    assert runs["one"]["steps"] == runs["two"]["steps"]
    np.testing.assert_allclose(runs["two"]["evals"], runs["one"]["evals"], rtol=1e-6)
    assert all(c == 37 for c in runs["two"]["counted"])


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_two_processes_stop_at_the_chief_verdict(tmp_path):
    """Only the chief's metric says the target is reached; both processes still stop at that eval."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(run_py(TOY_RUN.format(runtime="kind='multi_worker'", kw="", chief_only=True),
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
