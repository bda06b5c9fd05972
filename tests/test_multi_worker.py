"""Two harness processes on 127.0.0.1 as a MultiWorkerMirroredStrategy cluster: the normal run, a fixed
run_id (only the chief may judge the run directory), and the faults a cluster meets: a worker killed,
stopped, or alive but hung. Outcomes are asserted (exit code, one `error:` line, log renamed), never
how long anything took; timeouts below only stop a test that would otherwise hang."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from harness.review import logparse

from conftest import REPO, SMOKE, TINY_RESNET, free_ports, read_summary, sets

# What these tests check is the cluster's mechanics (who writes, who reports a lost peer), not the model:
# conftest's TINY_RESNET.
# A short two-process run: 4 epochs of 2 steps, one eval at the end (the closed ResNet cadence).
QUICK = sets(*TINY_RESNET, data__train_samples=256, data__eval_samples=101, schedule__max_epochs=4,
             schedule__eval_every_epochs=4)
# A run that cannot end by itself before the fault: target out of reach (open division), long budget.
ENDLESS = sets(*TINY_RESNET, data__train_samples=256, data__eval_samples=101, schedule__max_epochs=1000,
               schedule__eval_every_epochs=4, submission__division="open", schedule__target=0.999,
               runtime__collective_timeout_s=20)
WAIT_S = 300  # generous: only a hang reaches it


def tf_configs(n: int = 2) -> list[str]:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(n)]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(n)]


def slurm_envs(n: int = 2) -> tuple[list[dict], int]:
    """The variables srun sets for n tasks on one node (here 127.0.0.1), one dict per task, and the port
    base. No TF_CONFIG: the runtime reads the cluster from these."""
    common = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": str(n), "SLURM_STEP_NUM_TASKS": str(n),
              "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_NNODES": "1",
              "SLURM_TASKS_PER_NODE": str(n), "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURM_NODEID": "0"}
    tasks = [dict(common, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)) for i in range(n)]
    return tasks, free_ports(n, consecutive=True)[0]


def start_workers(out: str, *overrides: str, launcher: str = "tf_config") -> list[subprocess.Popen]:
    procs = []
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    if launcher == "slurm":
        tasks, port = slurm_envs()
        envs = [dict(base, **task) for task in tasks]
        overrides = (*overrides, *sets(runtime__slurm_port_base=port))
    else:
        envs = [dict(base, TF_CONFIG=tf_config) for tf_config in tf_configs()]
    for env in envs:
        env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "harness", "run", SMOKE, "--output_dir", out,
               *sets(runtime__kind="multi_worker", runtime__cpu_devices=1, run_id="mw"), *overrides]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.communicate()


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_two_processes_fixed_run_id_only_chief_writes(tmp_out):
    """Both hosts use run_id 'mw': the non-chief must never judge the directory the chief just filled. The
    cluster comes from the variables srun sets (no TF_CONFIG); a TF_CONFIG cluster is the one the lost-worker
    tests below train on, and tests/test_loop.py's two processes run one to the chief's verdict."""
    procs = start_workers(tmp_out, *QUICK, launcher="slurm")
    try:
        outputs = [p.communicate(timeout=WAIT_S) for p in procs]
    finally:
        stop_all(procs)
    codes = [p.returncode for p in procs]
    assert codes[0] in (0, 1) and codes[0] == codes[1], outputs
    files = set(os.listdir(os.path.join(tmp_out, "resnet", "mw"))) - {"harness_changes.diff"}  # a dirty checkout's
    assert sorted(files) == ["config.yaml", "requirements.txt", "result_1.txt", "summary.json"]
    summary = read_summary(tmp_out)
    assert summary["num_replicas"] == 2 and "2 host(s)" in summary["runtime"]
    assert "time to train" in outputs[0][0] and "time to train" not in outputs[1][0]
    keys = [e.key for e in logparse.parse_log(summary["log"])]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1  # one writer, no duplicates


def wait_for_block(procs: list[subprocess.Popen], log: str) -> None:
    """Until the chief's log shows the timed run under way (both workers are then in collectives)."""
    while not (os.path.exists(log) and "block_start" in open(log).read()):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.2)


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP", "SIGTERM"])
def test_lost_worker_fails_the_survivor_with_one_line(tmp_out, fault):
    """Worker 1 killed (dies), stopped (stops answering) or sent SIGTERM (stops itself, as preemption asks)
    mid-run: the chief exits non-zero with one error line naming worker 1, no traceback, and its log
    renamed incomplete."""
    procs = start_workers(tmp_out, *ENDLESS)
    run_dir = os.path.join(tmp_out, "resnet", "mw")
    try:
        wait_for_block(procs, os.path.join(run_dir, "incomplete_result_1.log"))  # its name until the run ends
        procs[1].send_signal(getattr(signal, fault))
        stdout, stderr = procs[0].communicate(timeout=WAIT_S)
        if fault == "SIGTERM":  # the worker itself says why it stopped
            _, worker_stderr = procs[1].communicate(timeout=WAIT_S)
            assert procs[1].returncode == 143 and error_lines(worker_stderr) == ["error: interrupted by SIGTERM"], \
                worker_stderr
    finally:
        stop_all(procs)
    assert procs[0].returncode not in (0, None), stdout + stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: lost contact with worker 1 (127.0.0.1:"), lines
    assert "Traceback" not in stderr
    assert sorted(os.listdir(run_dir)) == ["config.yaml", "incomplete_result_1.log"]


def test_hung_peer_ends_at_the_collective_timeout():
    """A peer alive but never joining a collective (heartbeats still flowing) is caught by
    runtime.collective_timeout_s, which TensorFlow enforces on CPU ring collectives."""
    helper = os.path.join(REPO, "tests", "helpers", "hung_peer.py")
    procs = []
    try:
        for i, tf_config in enumerate(tf_configs()):
            env = dict(os.environ, TF_CONFIG=tf_config, TF_CPP_MIN_LOG_LEVEL="2")
            procs.append(subprocess.Popen([sys.executable, helper, str(i), "5"], cwd=REPO, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        stdout, stderr = procs[0].communicate(timeout=WAIT_S)
    finally:
        stop_all(procs)
    assert "first all-reduce: 2" in stdout, stdout + stderr
    # The deadline cannot know who stopped answering: it says how long the call waited, lists the peers.
    assert ("DeadlineExceededError: error: a collective call waited more than 5s "
            "(runtime.collective_timeout_s) for its peers (worker 1 (127.0.0.1:" in stdout), stdout + stderr


@pytest.mark.parametrize("error,peer,why", [
    ("UnavailableError", "worker 1 (127.0.0.1:1001)", "stopped sending heartbeats"),
    ("InternalError", "worker 1 (127.0.0.1:1001)", "InternalError in a collective"),
])
def test_lost_peer_error_names_the_peer_from_tf_config(monkeypatch, error, peer, why):
    """The collective errors TensorFlow raises on the survivor become one line naming the peer."""
    import tensorflow as tf

    from harness.runtime.distribute import lost_peer_error

    cluster = {"worker": ["127.0.0.1:1000", "127.0.0.1:1001"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    text = {"UnavailableError": "Graph execution error:\n\nCollective ops is aborted by: Error reported from "
                                "/job:worker/task:1: The following tasks are unhealthy (stopped sending "
                                "heartbeats):\n/job:worker/replica:0/task:1\n",
            "InternalError": "Collective ops is aborted by: something"}[error]
    lost = lost_peer_error(getattr(tf.errors, error)(None, None, text), 20)
    assert lost is not None and str(lost).startswith(f"lost contact with {peer}: ") and why in str(lost)
    assert "\n" not in str(lost)
    # Errors that are not about a peer stay what they are.
    assert lost_peer_error(tf.errors.InternalError(None, None, "matmul shape mismatch"), 20) is None
    assert lost_peer_error(ValueError("no"), 20) is None


def test_lost_chief_is_named_by_the_non_chief(monkeypatch):
    import tensorflow as tf

    from harness.runtime.distribute import lost_peer_error

    cluster = {"worker": ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    text = ("Collective ops is aborted by: Failed to send RPC to coordination service. Additional GRPC error "
            "information from remote target /job:worker/replica:0/task:0 while calling "
            "/tensorflow.CoordinationService/Heartbeat: failed to connect to all addresses")
    lost = lost_peer_error(tf.errors.UnavailableError(None, None, text), 600)
    assert str(lost) == ("lost contact with worker 0 (127.0.0.1:1000): it cannot be reached (crashed or cut "
                         "off); this run is incomplete")
    # Three workers and a timeout naming nobody: say which peers it may be.
    lost = lost_peer_error(tf.errors.UnavailableError(None, None, "Collective ops is aborted by: socket "
                                                                  "closed"), 600)
    assert "a peer (one of worker 0 (127.0.0.1:1000), worker 2 (127.0.0.1:1002))" in str(lost)


@pytest.mark.parametrize("text", [
    "collective watchdog: a compiled call waited more than 5s (runtime.collective_timeout_s) for its peers",
    # Whatever a deadline's text happens to name, it does not know who stopped answering.
    "Collective ops is aborted by: collective watchdog: ... /job:worker/replica:0/task:1",
])
def test_a_deadline_blames_no_peer(monkeypatch, text):
    """On a 2-worker cluster a collective deadline must not name the only other worker as lost: it may be
    healthy and this call merely slow."""
    import tensorflow as tf

    from harness.runtime.distribute import lost_peer_error

    cluster = {"worker": ["127.0.0.1:1000", "127.0.0.1:1001"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    line = str(lost_peer_error(tf.errors.DeadlineExceededError(None, None, text), 5))
    assert line == ("a collective call waited more than 5s (runtime.collective_timeout_s) for its peers (worker 1 "
                    "(127.0.0.1:1001)): one of them stopped answering (hung, stopped or cut off), or the call "
                    "is slower than the timeout (then raise runtime.collective_timeout_s); this run is "
                    "incomplete")
    assert "lost contact" not in line


def test_a_call_that_compiles_runs_without_the_deadline():
    """The deadline covers calls that run compiled code, not those that trace and compile it: the first
    call of a function (tracing, XLA compilation on first execution, that execution) is unguarded, the
    next is guarded. Read from inside the calls, so no timing is involved."""
    import tensorflow as tf

    from harness.runtime.distribute import StrategyRuntime
    from harness.runtime.watchdog import CollectiveWatchdog

    watchdog = CollectiveWatchdog(600)
    runtime = StrategyRuntime("multi_worker", tf.distribute.get_strategy(), "CPU", "float32", False,
                              watchdog=watchdog)
    seen = []

    def armed() -> float:
        seen.append(("run", watchdog.armed))
        return 0.0

    def chunk(x):
        seen.append(("trace", watchdog.armed))
        return x + tf.py_function(armed, [], tf.float32)

    guarded = runtime.function(chunk)
    for value in (1.0, 2.0, 3.0):
        guarded(tf.constant(value))
    assert seen == [("trace", False), ("run", False), ("run", True), ("run", True)]
    guarded(tf.constant([1.0, 2.0]))  # a new shape: traced again, unguarded again
    assert seen[4:] == [("trace", False), ("run", False)]
    assert not watchdog.armed and not watchdog.fired
