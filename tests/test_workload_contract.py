"""The workload contract, for every registered workload: two train steps and one eval on one device and
on 2 logical CPUs (mirrored) give finite, equal losses (so the loop's gradient reduction is right for
this workload) and count every eval example exactly once on an eval set that does not divide the batch.

Each workload runs in its own subprocess: logical devices must be configured before TensorFlow starts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from benchmarks import registry
from conftest import REPO

# Per workload: a small, fast variant of its smoke config. Batch-norm statistics over the global batch
# make one device and two replicas compute the same function.
SMALL = {
    "resnet": ["data.train_samples=256", "data.eval_samples=45", "schedule.global_batch_size=32",
               "schedule.eval_batch_size=16", "model.bn_span=32"],
    "bert": ["data.train_samples=512", "data.eval_samples=45", "schedule.global_batch_size=16",
             "schedule.eval_batch_size=16"],
    # Dropout off: each replica draws its own masks, so one device and two would differ.
    "transformer": ["data.synthetic_train_pairs=400", "data.eval_samples=45", "schedule.global_batch_size=8",
                    "schedule.eval_batch_size=16", "model.layer_postprocess_dropout=0", "model.attention_dropout=0",
                    "model.relu_dropout=0", "eval.extra_decode_length=4"],
    # Rows of 256 tokens (the smoke's 8192 are for the logged runs); 45 eval rows.
    "gpt_oss_20b": ["data.seq_length=256", "data.synthetic_train_rows=64", "data.eval_samples=45",
                    "schedule.global_batch_size=8", "schedule.eval_batch_size=16"],
    "ssd": ["data.train_samples=64", "data.eval_samples=45", "schedule.global_batch_size=16",
            "schedule.eval_batch_size=16", "model.bn_span=16"],
}

SCRIPT = """
    import json
    import tensorflow as tf
    from benchmarks import registry
    from harness import config as C
    from harness.train import loop
    from harness.runtime import make_runtime

    def run(extra):
        cfg = C.load_config({config!r}, {small!r} + ["submission.division=open"] + extra)
        rt = make_runtime(cfg.runtime)
        wl = registry.get(cfg.workload)(cfg, rt)
        wl.validate()
        with rt.scope():
            wl.build()
        steps = loop.CompiledSteps(rt, wl)
        gbs, ebs = cfg.schedule.global_batch_size, cfg.schedule.eval_batch_size
        it = iter(loop.train_input(rt, wl, gbs, cfg.seed))
        losses = [float(steps.train_loop(it, tf.constant(1))["loss"]) for _ in range(2)]
        metrics, counted = loop.evaluate(steps, loop.eval_input(rt, wl, ebs, cfg.seed),
                                         loop.eval_steps_for(wl.eval_samples, ebs))
        return dict(losses=losses, counted=counted, eval_samples=wl.eval_samples, replicas=rt.num_replicas,
                    score=metrics[wl.METRIC])

    two = run(["runtime.kind=mirrored", "runtime.cpu_devices=2"])
    one = run(["runtime.kind=default", "runtime.cpu_devices=0"])
    print("RESULT " + json.dumps(dict(one=one, two=two)))
"""


def test_every_registered_workload_has_a_contract_case():
    assert sorted(SMALL) == registry.names()


@pytest.mark.parametrize("name", registry.names())
def test_one_train_step_and_eval_on_one_and_two_replicas(name):
    config = os.path.join(REPO, "configs", name, "smoke.yaml")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT.format(config=config, small=SMALL[name]))],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    one, two = out["one"], out["two"]
    assert (one["replicas"], two["replicas"]) == (1, 2)
    assert np.all(np.isfinite(one["losses"])) and np.isfinite(one["score"])
    # The second loss follows one update: equal only if the replicas' gradients were combined right.
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert one["counted"] == two["counted"] == one["eval_samples"] == 45
    assert two["score"] == pytest.approx(one["score"], abs=1e-6)
