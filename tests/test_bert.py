"""BERT workload: eval cadence, TFRecord format, initial checkpoint, LAMB, and the mesh's up-front checks."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from harness import config as config_lib
from harness.benchmark_rules import bert_eval_every
from harness.train import loop
from harness.errors import HarnessError
from harness.runtime import InputContext, make_runtime

from benchmarks.bert import checkpoint, tfrecord_writer
from benchmarks.bert.data import SyntheticSource, TFRecordSource
from benchmarks.bert.workload import BertWorkload

from conftest import REPO, cli_in_process, refusals_in_one_process, stderr_error_lines

SMOKE = os.path.join(REPO, "configs", "bert", "smoke.yaml")
SMOKE_MESH = os.path.join(REPO, "configs", "bert", "smoke-mesh.yaml")
TINY = ["model.vocab_size=64", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.ff_size=64", "model.max_position=16", "data.seq_length=16", "data.max_predictions=3",
        "data.eval_samples=37", "data.train_samples=512", "schedule.global_batch_size=16"]


def workload_for(overrides: list[str]) -> BertWorkload:
    cfg = config_lib.load_config(SMOKE, overrides)
    return BertWorkload(cfg, make_runtime(cfg.runtime))


def test_eval_cadence_is_the_mlperf_formula_in_samples():
    assert bert_eval_every(448) == 150_000      # floor(0.05*(103143+3e6)/25000)*25000
    assert bert_eval_every(8192) == 225_000
    wl = workload_for(["data.eval_every_samples=0", "schedule.global_batch_size=448",
                       "data.train_samples=1000000"])
    assert wl.eval_every_samples == 150_000
    wl = workload_for(["data.eval_every_samples=1000", "schedule.global_batch_size=64",
                       "data.train_samples=3200", "schedule.max_epochs=1"])
    points = wl.eval_schedule().points
    assert [p.step for p in points] == [16, 32, 47, 50]           # ceil(k*1000/64), capped at the budget
    assert [p.epoch_num for p in points] == [1024, 2048, 3008, 3200]  # samples trained, not epochs


def test_ruleset_0_7_0_cadence_starts_at_3m_samples_then_every_500k():
    wl = workload_for(["ruleset=0.7.0", "check_rulesets=[]", "data.eval_every_samples=0",
                       "schedule.global_batch_size=448", "data.train_samples=4000000", "schedule.max_epochs=1"])
    # Marks 3.0M, 3.5M and the 4M budget, each rounded up to a whole batch of 448.
    assert [p.epoch_num for p in wl.eval_schedule().points] == [3000256, 3500224, 4000192]
    wl = workload_for(["ruleset=4.0.0", "data.eval_every_samples=0", "schedule.global_batch_size=448",
                       "data.train_samples=600000", "schedule.max_epochs=1"])
    assert [p.epoch_num for p in wl.eval_schedule().points][:2] == [150080, 300160]


def test_closed_targets_and_keys_for_every_ruleset():
    wl = workload_for([])
    assert wl.closed_target("0.7.0") == 0.712 and wl.closed_target("4.0.0") == 0.720
    assert wl.closed_target("5.0.0") == 0.720
    keys = wl.mllog_hparams()
    for k in ("opt_base_learning_rate", "opt_epsilon", "opt_lamb_epsilon", "opt_learning_rate_training_steps",
              "opt_learning_rate_warmup_steps", "num_warmup_steps", "start_warmup_step", "opt_lamb_beta_1",
              "opt_lamb_beta_2", "opt_lamb_weight_decay_rate"):
        assert k in keys


def test_synthetic_data_is_deterministic_and_well_formed():
    cfg = config_lib.load_config(SMOKE, TINY).data
    a = SyntheticSource(cfg, 64).generate(50, stream=2)
    b = SyntheticSource(cfg, 64).generate(50, stream=2)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    w = a["masked_lm_weights"] > 0
    assert w.any(axis=1).all()
    # Every prediction points at a real word whose true id is recorded.
    rows = np.nonzero(w)[0]
    pos = a["masked_lm_positions"][w]
    assert (a["input_mask"][rows, pos] == 1).all() and (a["masked_lm_ids"][w] >= 4).all()


def test_tfrecord_source_reads_the_mlperf_format_split_over_hosts(tmp_path):
    cfg = config_lib.load_config(SMOKE, TINY + [f"data.data_dir={tmp_path}", "data.source=tfrecord",
                                                "data.train_samples=40", "data.eval_samples=15"]).data
    arrays = SyntheticSource(cfg, 64).generate(40, stream=3)
    tfrecord_writer.write(str(tmp_path / "part-00000-of-00002"), tfrecord_writer.rows(arrays, 0, 20))
    tfrecord_writer.write(str(tmp_path / "part-00001-of-00002"), tfrecord_writer.rows(arrays, 20, 40))
    tfrecord_writer.write(str(tmp_path / "eval_10k"), tfrecord_writer.rows(arrays, 0, 15))
    src = TFRecordSource(cfg)
    src.validate()
    got = [src.eval_parse(r) for r in src.eval_records()]
    assert len(got) == 15
    for i, ex in enumerate(got):
        for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
            np.testing.assert_array_equal(ex[k].numpy(), arrays[k][i])
        np.testing.assert_allclose(ex["masked_lm_weights"].numpy(), arrays["masked_lm_weights"][i])
        assert int(ex["next_sentence_labels"]) == arrays["next_sentence_labels"][i, 0]
    firsts = []
    for host in (0, 1):
        ds = src.train(InputContext(num_hosts=2, host_id=host, batch_size=4, seed=0)).take(200)
        firsts.append({tuple(ex["input_ids"].numpy()) for ex in ds})
    whole = [{tuple(row) for row in arrays["input_ids"][s:s + 20]} for s in (0, 20)]
    assert firsts == whole  # each host reads exactly its own shard


def evaluate(wl: BertWorkload) -> float:
    steps = loop.CompiledSteps(wl.runtime, wl)
    dist = loop.eval_input(wl.runtime, wl, 16, 0)
    metrics, counted = loop.evaluate(steps, dist, loop.eval_steps_for(wl.eval_samples, 16))
    assert counted == wl.eval_samples
    return metrics[wl.METRIC]


def test_checkpoint_round_trip_reproduces_eval_accuracy(tmp_path):
    trained = workload_for(TINY + ["seed=3", "optimizer.base_learning_rate=0.02", "optimizer.warmup_steps=0"])
    trained.build()
    steps = loop.CompiledSteps(trained.runtime, trained)
    steps.train_loop(iter(loop.train_input(trained.runtime, trained, 16, 0)), tf.constant(30))
    accuracy = evaluate(trained)
    prefix = checkpoint.save(trained.runtime, 32, str(tmp_path / "model.ckpt-30"))
    names = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    assert names["bert/embeddings/word_embeddings"] == [64, 32]
    assert names["bert/encoder/layer_0/attention/self/query/kernel"] == [32, 32]

    fresh = workload_for(TINY + ["seed=7", f"model.init_checkpoint={prefix}"])
    fresh.validate()
    fresh.build()
    assert evaluate(fresh) == pytest.approx(accuracy, abs=1e-9)
    assert accuracy != pytest.approx(evaluate(workload_built(TINY + ["seed=7"])), abs=1e-9)

    deeper = workload_for(TINY + ["model.num_layers=2", f"model.init_checkpoint={prefix}"])
    with pytest.raises(HarnessError, match="bert/encoder/layer_1/.* is missing"):
        deeper.build()
    wider = workload_for(TINY + ["model.ff_size=48", f"model.init_checkpoint={prefix}"])
    with pytest.raises(HarnessError,
                       match=r"intermediate/dense/kernel has shape \[32, 64\], the model needs \[32, 48\]"):
        wider.build()


def workload_built(overrides: list[str]) -> BertWorkload:
    wl = workload_for(overrides)
    wl.build()
    return wl


def test_lamb_step_matches_a_numpy_reference():
    from harness.nn.optim import LAMB

    rt = make_runtime(config_lib.load_config(SMOKE, []).runtime)
    w0 = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    b0 = np.array([0.1, -0.2], np.float32)
    w = rt.variable("m/dense/kernel", w0.shape, (None, None), lambda s, d: tf.constant(w0))
    b = rt.variable("m/dense/bias", b0.shape, (None,), lambda s, d: tf.constant(b0))
    opt = LAMB(rt, rt.variables(trainable=True), lambda step: tf.constant(0.1), weight_decay=0.01,
               exclude_from_decay=[r"/bias$"], beta_1=0.9, beta_2=0.999, epsilon=1e-6)
    opt.build()
    g = [np.array([[0.1, 0.2], [-0.3, 0.4]], np.float32), np.array([0.5, -0.5], np.float32)]
    tf.function(lambda: opt.apply([tf.constant(x) for x in g]))()
    m, v = 0.1 * g[0], 0.001 * g[0] ** 2
    u = (m / 0.1) / (np.sqrt(v / 0.001) + 1e-6) + 0.01 * w0
    expect_w = w0 - 0.1 * np.linalg.norm(w0) / np.linalg.norm(u) * u
    ub = (0.1 * g[1] / 0.1) / (np.sqrt(0.001 * g[1] ** 2 / 0.001) + 1e-6)
    np.testing.assert_allclose(w.numpy(), expect_w, rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), b0 - 0.1 * ub, atol=1e-5)  # no trust ratio, no decay


def test_mesh_size_mismatch_is_one_line_exit_2(tmp_path):
    proc = cli_in_process("run", SMOKE_MESH, "--output_dir", str(tmp_path), "--set", "runtime.cpu_devices=3")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert stderr_error_lines(proc) == ["error: runtime.mesh data=2 x model=2 needs 4 devices but 3 CPU "
                                        "device(s) are available; set runtime.cpu_devices=4"]


def test_mesh_divisibility_checks_name_the_numbers(tmp_path):
    """Batch, heads and feed-forward that do not divide over the mesh fail before the log is written."""
    lines = refusals_in_one_process([(SMOKE_MESH, o) for o in (
        ["schedule.global_batch_size=63"], ["model.num_heads=1"], ["model.ff_size=511"], ["model.vocab_size=255"])],
        str(tmp_path), timeout=300)
    assert "global_batch_size=63 does not divide over 2 replicas" in lines[0]
    assert lines[1] == "error: model.num_heads=1 does not divide over 2 devices (runtime.layout.heads=model of size 2)"
    assert lines[2] == "error: model.ff_size=511 does not divide over 2 devices (runtime.layout.ff=model of size 2)"
    assert "model.vocab_size=255 does not divide over 2 devices" in lines[3]
    assert not os.path.exists(os.path.join(tmp_path, "bert")) or not any(
        f.startswith("result") for _, _, fs in os.walk(tmp_path) for f in fs)
