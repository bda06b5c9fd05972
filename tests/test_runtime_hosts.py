"""Accelerator and multi-host honesty, checked on CPU: the multi-replica XLA step traced as a GPU host
would build it, the multi-host methods with hosts stood in, a flat thread count under the collective
timeout, and one `error:` line for hardware that is not there. Helpers run in subprocesses where logical
devices or a cluster are needed; outcomes are asserted, never durations."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.runtime import make_runtime

from conftest import REPO, TINY_RESNET, free_ports

HELPERS = os.path.join(REPO, "tests", "helpers")
# 4 pretend GPUs, 8 examples each; bn_span 16 pools statistics over groups of 2 replicas: strictly between
# one replica and all, the grouped sum that must not merge_call inside a per-replica XLA function.
RESNET_SMALL = ["data.train_samples=256", "data.eval_samples=45", "schedule.global_batch_size=32",
                "schedule.eval_batch_size=16", "model.bn_span=16",
                # what is traced is the replica context (merge calls, group batch norm), not the depth
                *TINY_RESNET]
SSD_SMALL = ["data.train_samples=64", "data.eval_samples=32", "schedule.global_batch_size=32",
             "schedule.eval_batch_size=16", "model.bn_span=16"]
WAIT_S = 900  # generous: only a hang reaches it (the machine may be shared)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def run_helper(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(HELPERS, name), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=WAIT_S, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def test_pretend_gpu_trace_has_no_merge_call_and_no_cross_device_update():
    """Replicated weights and slots with ONLY_FIRST_REPLICA make every replica-context
    assign a merge_call, which raises inside a per-replica XLA function on GPUs; NONE traces cleanly.
    Batch norm over a group of replicas between one and all (ResNet, SSD) must
    not merge_call either (it went through ReplicaContext.all_gather)."""
    spec = {"cases": {"resnet": [os.path.join(REPO, "configs", "resnet", "smoke.yaml"), RESNET_SMALL],
                      "ssd": [os.path.join(REPO, "configs", "ssd", "smoke.yaml"), SSD_SMALL]},
            "only_first_replica": "resnet"}
    out = result_of(run_helper("pretend_gpu_trace.py", json.dumps(spec)))
    for name in ("resnet", "ssd"):
        none = out[name]
        assert none["replicas"] == 4 and none["bn_group"] == 2, none
        assert none["error"] is None, none
        assert none["edges"] == [], none["edges"][:5]
        assert none["xla_calls"] >= 8, none  # train and eval, each compiled once per replica
    first = out["only_first_replica"]
    assert first["error"] and "merge_call" in first["error"], first


def test_multi_host_methods_with_two_hosts_stood_in():
    proc = run_helper("hosts_stand_in.py")
    out = result_of(proc)
    for kind in ("mirrored", "mesh"):
        r = out[kind]
        assert r["replicas"] == 2
        assert r["chief_broadcast"] == [0.75, 1.0]
        assert r["other_broadcast"] == [0.0, 0.0]  # the chief's (here absent) value, never its own
        assert r["gathered"] == [2.0 * i for i in range(8)]
    # A CPU mesh says that jit_compile does not apply there instead of ignoring it.
    assert "runtime: jit_compile does not apply on a CPU mesh" in proc.stdout


def test_collective_timeout_does_not_cost_a_thread_per_collective():
    """TensorFlow's per-collective timeout grew threads by ~40 a step here; the runtime's
    watchdog keeps the count flat (a few threads of slack for TensorFlow's own pools)."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    procs = []
    try:
        for i in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            env = dict(os.environ, TF_CONFIG=tf_config, TF_CPP_MIN_LOG_LEVEL="2")
            procs.append(subprocess.Popen([sys.executable, os.path.join(HELPERS, "mw_threads.py")], cwd=REPO,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=WAIT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for stdout, stderr in outputs:
        lines = [l for l in stdout.splitlines() if l.startswith("THREADS ")]
        assert lines, stdout + stderr[-3000:]
        after_5, after_45, watchdog = lines[0].split()[1:]
        assert watchdog == "watchdog=True"
        # 40 more steps x 20 all-reduces: 800 collectives, and the thread count stays put.
        assert int(after_45) - int(after_5) < 10, lines[0]


@pytest.mark.parametrize("cfg,message", [
    (RuntimeConfig(kind="mirrored", gpus=8), "error: runtime.gpus=8 but TensorFlow sees no GPU"),
    (RuntimeConfig(kind="mirrored"), "error: runtime.kind=mirrored but TensorFlow sees no GPU"),
    (RuntimeConfig(kind="mirrored", cpu_devices=2, jit_compile=True),
     "error: runtime.jit_compile=true with runtime.kind=mirrored over 2 CPU replicas"),
    (RuntimeConfig(kind="tpu", tpu=""), "error: runtime.kind=tpu with runtime.tpu='' (this host's TPU) but "
                                        "TensorFlow sees no TPU here"),
])
def test_hardware_that_is_not_there_is_one_line(cfg, message, monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(HarnessError) as e:
        make_runtime(cfg)
    text = f"error: {e.value}"
    assert text.startswith(message) and "\n" not in text
