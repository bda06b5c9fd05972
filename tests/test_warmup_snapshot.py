"""The warm-up (compile, one step on zeros) leaves the training state exactly as initialized, and the copy
it restores from waits in host memory, not as a second copy of every weight and optimizer slot on the
device. In-process, the one-variable toy with a momentum slot."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from harness.config import RuntimeConfig
from harness.mlperf import MLPerfLog
from harness.nn.optim import SGDMomentum, poly_warmup_schedule
from harness.runtime import make_runtime
from harness.train import loop

sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
import toy  # noqa: E402

pytestmark = pytest.mark.quick


class MomentumToy(toy.ToyWorkload):
    """The toy with a momentum slot, so the optimizer state is part of what must come back."""

    def build(self) -> None:
        init = self.cfg.model.init
        self.w = self.runtime.variable("toy/w", (), (), lambda shape, dtype: tf.constant(init, dtype))
        lr = self.cfg.optimizer.learning_rate
        self.optimizer = SGDMomentum(self.runtime, self.runtime.variables(trainable=True),
                                     poly_warmup_schedule(lr, 0, 1, lr, 1.0), momentum=0.9, name="sgd_m")
        self.optimizer.build()


def test_warm_up_restores_the_initial_state_from_host_memory(tmp_path, monkeypatch):
    runtime = make_runtime(RuntimeConfig())
    cfg = toy.make(str(tmp_path), runtime, max_epochs=0.5, eval_every_epochs=0.5).cfg
    wl = MomentumToy(cfg, runtime)
    states, snapshots = [], []

    def state() -> dict:
        return {v.path: v.variable.numpy().copy() for v in runtime.variables()}

    class Recording(loop.CompiledSteps):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            inner = self.train_loop

            def train_loop(iterator, steps):
                states.append(state())
                out = inner(iterator, steps)
                states.append(state())
                return out

            self.train_loop = train_loop

    real_snapshot = loop.host_snapshot

    def snapshot(rt):
        snapshots.append(real_snapshot(rt))
        return snapshots[-1]

    monkeypatch.setattr(loop, "CompiledSteps", Recording)
    monkeypatch.setattr(loop, "host_snapshot", snapshot, raising=False)
    log = MLPerfLog(str(tmp_path / "log.txt"))
    try:
        loop.run_timed(runtime, wl, log, lambda: None)
    finally:
        log.close()
    initial, warmed, timed = states[0], states[1], states[2]
    assert any(p.startswith("sgd_m/") for p in initial), sorted(initial)  # optimizer slots are covered
    # The warm-up step really changed the state (else the check below proves nothing) ...
    assert any(not np.array_equal(initial[p], warmed[p]) for p in initial)
    # ... and the timed run starts bit for bit from the initial state.
    assert initial.keys() == timed.keys()
    for path in initial:
        assert initial[path].tobytes() == timed[path].tobytes(), path
    # The copy taken before warm-up holds host arrays, one per variable: no device tensor.
    assert len(snapshots) == 1 and len(snapshots[0]) == len(initial)
    assert all(isinstance(v, np.ndarray) and not isinstance(v, tf.Tensor) for v in snapshots[0])
