"""The loop names an input-bound run: the share of training time its steps waited for data, measured on
the real loop (in-process, the one-variable toy workload with a heavier step) fed once by a pipeline whose
map does ten times the step's compute per batch and once from memory. Shares, never absolute times, are
asserted: both sides slow down alike on a loaded machine.

The slow pipeline computes rather than sleeps: TensorFlow's test-only `sleep` dataset
(tensorflow.python.data.experimental.ops.testing) deadlocked here when its iterator was destroyed
mid-sleep (its cancellation callback waits on the mutex its GetNext holds; seen with TF 2.21 as a test
that never returned), and a Python sleep in the pipeline would need the GIL the tearing-down thread holds."""
from __future__ import annotations

import contextlib
import io
import os
import sys

import pytest
import tensorflow as tf

from conftest import REPO
from harness.config import RuntimeConfig
from harness.mlperf import MLPerfLog
from harness.runtime import make_runtime
from harness.train.loop import run_timed
from harness.train.progress import INPUT_BOUND_SHARE, Progress

sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
import toy  # noqa: E402

pytestmark = pytest.mark.quick

STEP_MATMULS = 8      # the step's compute: this many 384x384 matmuls
INPUT_MATMULS = 8     # per example, so a batch of 10 is ten times the step's


class BusyToy(toy.ToyWorkload):
    """The toy with tens of milliseconds of real compute per step, and optionally a slow input."""

    slow = False

    def train_dataset(self, ctx):
        ds = super().train_dataset(ctx)
        return ds.map(lambda e: {"x": e["x"] + 0.0 * busy(tf.cast(e["x"], tf.int32), INPUT_MATMULS)}) \
            if self.slow else ds

    def loss(self, batch, seed):
        terms = super().loss(batch, seed)
        term = terms["squared_error"]
        return {"squared_error": toy.LossTerm(term.total + 0.0 * busy(seed[0], STEP_MATMULS), term.count)}


def busy(seed: tf.Tensor, matmuls: int) -> tf.Tensor:
    """`matmuls` 384x384 matmuls from a seeded matrix (seeded, so graph optimization cannot fold the work into
    a constant)."""
    m = tf.random.stateless_uniform([384, 384], tf.stack([tf.cast(seed, tf.int32), 7]))
    for _ in range(matmuls):
        m = tf.tanh(tf.matmul(m, m) * 0.01)
    return tf.reduce_sum(m)


def run(tmp_path, name: str, slow: bool) -> tuple[object, str]:
    """(RunResult, stdout) of a whole toy run (target above 1: the budget runs out; 12 steps slow, 36
    fast, so the pipeline's start-up does not dominate the fast run)."""
    runtime = make_runtime(RuntimeConfig())
    cfg = toy.make(str(tmp_path), runtime, log_every_steps=2, target=2.0, max_epochs=2.0 if slow else 6.0,
                   eval_every_epochs=1.0).cfg
    wl = BusyToy(cfg, runtime)
    wl.slow = slow
    log = MLPerfLog(str(tmp_path / f"{name}.txt"))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            result = run_timed(runtime, wl, log, lambda: None, progress=Progress(True, metric=wl.METRIC))
    finally:
        log.close()
    return result, out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {name: run(tmp_path_factory.mktemp(name), name, slow) for name, slow in (("slow", True),
                                                                                    ("fast", False))}


def share(result) -> float:
    return result.input_wait_s / result.train_time_s


def test_slow_pipeline_is_named_input_bound_and_fast_one_is_not(runs):
    slow, fast = share(runs["slow"][0]), share(runs["fast"][0])
    assert slow > 0.6 and fast < INPUT_BOUND_SHARE and slow > fast + 0.4, (slow, fast)


def test_progress_line_and_final_line_report_the_wait(runs):
    for name, verdict in (("slow", "input-bound: "), ("fast", "input keeps up: ")):
        result, out = runs[name]
        steps = [line for line in out.splitlines() if line.strip().startswith("step")]
        assert steps and all("| input wait " in line for line in steps), out
        final = [line for line in out.splitlines() if "of step time waiting for data" in line]
        assert len(final) == 1 and final[0].startswith(verdict), out
        assert "(data.source=synthetic, " in final[0] and " cores)" in final[0], final
        printed = int(final[0].split(": ")[1].split("%")[0])
        assert abs(printed - 100 * share(result)) <= 1, (printed, share(result))
