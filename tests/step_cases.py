"""Per workload, one subprocess (tests/helpers/step_case.py) whose results tests/test_workload_contract.py and
tests/test_xla_precision.py both read: each workload's model is built and stepped once per session, not
once per test file."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per workload: a small variant of its smoke config. Eval sets of 45 do not divide the eval batch of 16
# (padding is masked); batch-norm statistics over the global batch make one device and two replicas
# compute the same function; dropout is off where each replica would draw its own masks.
SMALL = {
    "resnet": ["data.train_samples=256", "data.eval_samples=45", "schedule.global_batch_size=32",
               "schedule.eval_batch_size=16", "model.bn_span=32"],
    "bert": ["data.train_samples=512", "data.eval_samples=45", "schedule.global_batch_size=16",
             "schedule.eval_batch_size=16", "model.num_layers=1"],
    "transformer": ["data.synthetic_train_pairs=400", "data.eval_samples=45", "schedule.global_batch_size=8",
                    "schedule.eval_batch_size=16", "model.layer_postprocess_dropout=0",
                    "model.attention_dropout=0", "model.relu_dropout=0", "eval.extra_decode_length=4",
                    "model.num_layers=1"],
    # Rows of 256 tokens (the smoke's 8192 are for the logged runs).
    "gpt_oss_20b": ["data.seq_length=256", "data.synthetic_train_rows=64", "data.eval_samples=45",
                    "schedule.global_batch_size=8", "schedule.eval_batch_size=16"],
    "llama31_8b": ["data.seq_length=64", "data.synthetic_train_rows=64", "data.eval_samples=45",
                   "schedule.global_batch_size=8", "schedule.eval_batch_size=16", "model.num_layers=1"],
    "ssd": ["data.train_samples=64", "data.eval_samples=45", "schedule.global_batch_size=16",
            "schedule.eval_batch_size=16", "model.bn_span=16"],
}
STEPS = 2


def _run(name: str, mode: list[str], onednn: str) -> dict:
    helper = os.path.join(REPO, "tests", "helpers", "step_case.py")
    config = os.path.join(REPO, "configs", name, "smoke.yaml")
    proc = subprocess.run([sys.executable, helper, config, json.dumps(SMALL[name]), str(STEPS), *mode],
                          cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS=onednn))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@functools.lru_cache(maxsize=None)
def step_case(name: str) -> dict:
    """The helper's RESULT for workload `name` (asserting it ran cleanly), with oneDNN's kernels forced on:
    TensorFlow turns them on by itself only on some CPUs (AVX-512 ones), and some refuse shapes the default
    kernels take (a rank-6 softmax), so every machine that runs the suite runs them."""
    return _run(name, ["overflow"] if name == "resnet" else [], "1")


@functools.lru_cache(maxsize=None)
def step_case_onednn_off(name: str) -> dict:
    """One device's plain train steps and eval of `name` with oneDNN forced off (TensorFlow's default kernels,
    what AVX2-only CPUs run)."""
    return _run(name, ["plain"], "0")
