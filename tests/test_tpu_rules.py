"""TPU rules checked on CPU: what a TPU is handed (the traced, XLA-compiled train and eval step of each
workload) takes only statically shaped tensors and holds no op that only a host can run."""
from __future__ import annotations

import glob
import math
import os

import pytest
import tensorflow as tf

from dry_run_shared import reduced_report
from harness import config as config_lib
from harness.dryrun.standin import device_plan
from harness.dryrun.xla import dynamic_inputs, host_only_ops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One hardware config per workload, the TPU one where there is one (spatial split, model axis).
CONFIGS = {"resnet": "configs/resnet/tpu-v3-32.yaml", "bert": "configs/bert/reference.yaml",
           "ssd": "configs/ssd/tpu-v3-32-spatial.yaml", "transformer": "configs/transformer/tpu-v3-32-mp4.yaml",
           "gpt_oss_20b": "configs/gpt_oss_20b/reference.yaml"}


@pytest.mark.parametrize("which", ["train", "eval"])
@pytest.mark.parametrize("workload", sorted(CONFIGS))
def test_compiled_step_takes_static_shapes_and_runs_no_host_op(workload, which):
    report = reduced_report(CONFIGS[workload])
    traced = report.traced[which]
    batch = [t for t in traced.inputs if t.dtype != tf.resource]
    assert batch, "the traced step has no batch inputs"
    leading = report.per_replica_batch if which == "train" else report.eval_per_replica_batch
    assert {t.shape[0] for t in batch} == {leading}
    assert dynamic_inputs(traced) == []
    assert host_only_ops(traced) == []


def test_the_checks_find_host_ops_nested_in_loops_and_dynamic_inputs(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    dataset = tf.data.Dataset.range(3)

    @tf.function
    def step(x):
        def body(i, acc):
            tf.print("step", i)  # inside a while body: a nested function the check must walk into
            return i + 1, acc + tf.reshape(tf.numpy_function(lambda a: a, [acc], tf.float32), [])

        _, total = tf.while_loop(lambda i, _: i < 2, body, (0, tf.reduce_sum(x)))
        with writer.as_default():
            tf.summary.scalar("total", total, step=0)
        return total + tf.cast(next(iter(dataset)), tf.float32)

    traced = step.get_concrete_function(tf.TensorSpec([None, 3], tf.float32))
    assert dynamic_inputs(traced) and "(None, 3)" in dynamic_inputs(traced)[0]
    ops = {entry.split()[0] for entry in host_only_ops(traced)}
    assert {"PrintV2", "PyFunc"} <= ops, ops
    assert any(op.startswith("Write") and "Summary" in op for op in ops), ops
    assert ops & {"IteratorGetNext", "AnonymousIteratorV3", "MakeIterator"}, ops


def _tpu_configs() -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*", "*.yaml"))
                  if config_lib.load_config(p, []).submission.platform.startswith("tpu"))


def test_tpu_configs_do_not_pad_their_batches():
    """A TPU core tiles a batch by 8 rows: a per-core training batch (tokens, for the language models) that is
    not a multiple of 8 pads every step (ResNet's 3264 on 32 cores gave 102); an eval batch much larger than needed
    pads every eval (the Transformer's 4096 for 3,003 sentences padded 36%)."""
    configs = _tpu_configs()
    assert len(configs) >= 4, configs
    for path in configs:
        cfg = config_lib.load_config(path, [])
        plan = device_plan(cfg)
        s = cfg.schedule
        # The rows a core's matmuls tile: examples, or for the language models (rows of data.seq_length
        # tokens) the tokens.
        lm = cfg.workload in ("gpt_oss_20b", "llama31_8b", "llama2_70b_lora")
        tokens = getattr(cfg.data, "seq_length", 1) if lm else 1
        assert s.global_batch_size * tokens % (8 * plan.replicas) == 0, (path, s.global_batch_size, plan.replicas)
        ebs = s.eval_batch_size or s.global_batch_size
        padded = math.ceil(cfg.data.eval_samples / ebs) * ebs
        assert padded / cfg.data.eval_samples - 1 <= 0.05, (path, ebs, cfg.data.eval_samples)
