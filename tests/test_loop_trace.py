"""The host train loop never makes a step wait on the previous one:
in the traced loop no batch fetch reaches a loop-carried value (the previous step's loss, learning rate or
a clock read after it), and the cross-replica reductions run once per call, after the loop, not per step.
Traced, never timed: the default runtime in-process and MirroredStrategy over 2 logical CPUs in a
subprocess (the logical devices must exist before TensorFlow starts)."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
import loop_trace  # noqa: E402


def check(found: dict) -> None:
    assert found["fetch_ancestors"], "no batch fetch found in the traced loop: the check would prove nothing"
    for body, reached in found["fetch_ancestors"].items():
        assert reached == [], f"{body}: the batch fetch waits on loop-carried {reached}"
    assert found["reduce_graphs"], "no cross-replica reduction traced: the check would prove nothing"
    inside = [g for g in found["reduce_graphs"] if "while" in g]
    assert not inside, f"cross-replica reductions traced inside the step loop: {inside}"


def test_default_runtime_loop_has_no_per_step_host_stall():
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    check(loop_trace.trace(make_runtime(RuntimeConfig())))


def test_mirrored_loop_has_no_per_step_host_stall():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "helpers", "loop_trace.py"), "mirrored"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    import json

    found = json.loads(lines[-1][len("RESULT "):])
    assert found["replicas"] == 2
    check(found)
