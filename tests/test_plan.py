"""`mlperf-harness plan`: each term on hand-worked numbers (collectives, RCP interpolation, eval cadence,
calibration from a synthetic log), the analytic model costs against XLA's HLO on tiny models, bad input
as one error line, and a plan for every reference config."""
from __future__ import annotations

import json
import os
import re
import types

import pytest

from harness.errors import HarnessError
from harness.plan import collectives, converge, cost as costs, planner
from harness.plan.calibrate import chips_from_platform, measure
from harness.plan.project import solve_efficiency, step_time
from harness.plan.system import available, load_system

from conftest import REPO, cli_in_process, stderr_error_lines

LAST_LINE = re.compile(r"^projected time to train: ([0-9.]+) min on (\d+) x (\S+) \(global batch (\d+)\)$")


# ------------------------------------------------------------------------------------------ collectives

def test_ring_allreduce_of_known_bytes_on_a_known_ring():
    # 100 MB over 4 members at 10 GB/s, 1 us a step: 2 * 3/4 * 1e8 / 1e10 = 15 ms, plus 6 steps of 1 us
    assert collectives.ring_allreduce(100e6, 4, 10e9, 1e-6) == pytest.approx(0.015006)
    assert collectives.ring_allreduce(100e6, 1, 10e9) == 0.0


def test_torus_allreduce_reduces_each_dimension_on_the_previous_shard():
    # 4x4 torus, 64 MB, 10 GB/s links (20 GB/s both ways): 2*3/4*64e6/2e10 = 4.8 ms, then 16 MB: 1.2 ms
    assert collectives.torus_allreduce(64e6, [4, 4], 10e9) == pytest.approx(0.006)


def test_hierarchical_allreduce_scatters_in_the_host_and_rings_between_hosts():
    # 2 hosts x 8 GPUs, 80 MB: NVLink scatter + gather 2 * 7/8 * 80e6 / 1e11 = 1.4 ms; each GPU's 10 MB
    # shard on a ring of 2 hosts at 10 GB/s: 2 * 1/2 * 1e7 / 1e10 = 1 ms
    assert collectives.hierarchical_allreduce(80e6, 16, 8, 100e9, 10e9) == pytest.approx(0.0024)
    assert collectives.hierarchical_allreduce(80e6, 8, 8, 100e9, 10e9) == pytest.approx(
        collectives.ring_allreduce(80e6, 8, 100e9))


def test_torus_dims_are_balanced_factorizations():
    assert collectives.torus_dims(4096, 2) == [64, 64]
    dims = collectives.torus_dims(3456, 3)
    assert len(dims) == 3 and dims[0] * dims[1] * dims[2] == 3456 and max(dims) <= 24


# ------------------------------------------------------------------------------------------ convergence

def test_interpolation_inside_below_and_above_the_table():
    pts = [(1000, 40.0), (2000, 50.0), (4000, 70.0)]
    assert converge.interpolate(pts, 1500) == (45.0, True, "interpolated between 1000 and 2000")
    assert converge.interpolate(pts, 2000)[:2] == (50.0, True)
    value, inside, how = converge.interpolate(pts, 500)
    assert (value, inside) == (40.0, False) and "below" in how
    value, inside, how = converge.interpolate(pts, 5000)
    assert (value, inside) == (80.0, False) and "extrapolated" in how


def test_rcp_table_of_the_checker_interpolates_between_its_batches():
    # mlperf-logging's resnet 4.0.0 RCPs: batch 4096 -> 40 epochs, 8192 -> 42 epochs (means of their runs)
    c = converge.to_converge("resnet", "4.0.0", 6144, "epochs", None)
    assert c.value == pytest.approx(41.0) and c.in_range and "RCP table resnet 4.0.0" in c.source
    far = converge.to_converge("resnet", "4.0.0", 200000, "epochs", None)
    assert not far.in_range and far.note


def test_a_run_stops_at_the_first_eval_past_the_table_value():
    from harness.config import load_config

    cfg = load_config(os.path.join(REPO, "configs", "resnet", "reference.yaml"))
    positions = costs.workload_cost_model("resnet").eval_positions(cfg, 35.2, 3264)  # evals at 3, 7, ..., 35, 39
    assert positions[0] == 3 and positions[-1] == 39 and len(positions) == 10
    c = converge.at_evals(converge.Convergence(35.2, "epochs", "t", True), positions)
    assert (c.stop, c.evals) == (39, 10)


# ------------------------------------------------------------------------------------------ calibration

def _mllog(t_ms: int, key: str, value=None, kind: str = "POINT_IN_TIME", **meta) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t_ms, "event_type": kind, "key": key,
                                     "value": value, "metadata": meta})


def synthetic_log(path: str) -> None:
    """2 epochs of 1,000 images at global batch 100 (20 steps) in a 42 s run: one synchronous 2 s eval and
    one asynchronous 5 s eval (an epoch_stop inside it) that the run waits 4 s for after training's last
    event, so training took 36 s: 1.8 s a step."""
    lines = [
        _mllog(0, "init_start", kind="INTERVAL_START"),
        _mllog(1, "submission_benchmark", "resnet"), _mllog(1, "submission_platform", "1xNVIDIA DGX A100"),
        _mllog(1, "global_batch_size", 100), _mllog(1, "train_samples", 1000),
        _mllog(5000, "init_stop", kind="INTERVAL_END"), _mllog(5000, "run_start", kind="INTERVAL_START"),
        _mllog(5000, "epoch_start", kind="INTERVAL_START", epoch_num=1),
        _mllog(20000, "epoch_stop", kind="INTERVAL_END", epoch_num=1),
        _mllog(20000, "eval_start", kind="INTERVAL_START", epoch_num=1),
        _mllog(22000, "eval_accuracy", 0.5, epoch_num=1),
        _mllog(22000, "eval_stop", kind="INTERVAL_END", epoch_num=1),
        _mllog(22000, "epoch_start", kind="INTERVAL_START", epoch_num=2),
        _mllog(40000, "eval_start", kind="INTERVAL_START", epoch_num=2),
        _mllog(41000, "epoch_stop", kind="INTERVAL_END", epoch_num=2),
        _mllog(45000, "eval_accuracy", 0.76, epoch_num=2),
        _mllog(45000, "eval_stop", kind="INTERVAL_END", epoch_num=2),
        _mllog(47000, "run_stop", kind="INTERVAL_END", status="success"),
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def test_calibration_from_a_synthetic_log(tmp_path):
    synthetic_log(str(tmp_path / "result_0.txt"))
    system = load_system("dgx-a100")
    m = measure([str(tmp_path)], "epochs", 999, system.chips_per_host, system.cores_per_chip)
    assert (m.benchmark, m.chips, m.global_batch, m.runs) == ("resnet", 8, 100, 1)  # 1 host x 8 GPUs
    assert m.step_seconds == pytest.approx(1.8)
    assert (m.eval_mode, m.eval_seconds, m.evals, m.steps) == ("async", pytest.approx(5.0), 2, 20)
    assert m.init_seconds == pytest.approx(5.0)
    # One chip: no all-reduce. 1.56e12 FLOPs a sample x 100 = 0.5 s at peak (312 TFLOP/s); the optimizer
    # moves 1e6 params x 20 B over 1555 GB/s = 12.86 us; the fixed step cost is 7.34 ms (dgx-a100.yaml).
    # So 1.8 s = 0.5 / eff + 12.86 us + 7.34 ms.
    cost = costs.ModelCost("resnet", "hand", 1.56e12, 0.0, 10**6, 4e6, 20.0, 1000, 0, "image")
    eff = solve_efficiency(cost, system, 1, 100, m.step_seconds)
    assert eff == pytest.approx(0.5 / (1.8 - 2e7 / 1555e9 - 7.34e-3), rel=1e-6)
    assert step_time(cost, system, 1, 100, eff).total == pytest.approx(1.8, rel=1e-6)
    with pytest.raises(HarnessError, match="shorter than the model's step at 100% of peak"):
        solve_efficiency(cost, system, 1, 100, 0.1)


def test_chips_from_platform_names():
    assert chips_from_platform("8xNVIDIA DGX A100", 8, 1) == 64
    assert chips_from_platform("tpu-v3-8192", 4, 2) == 4096
    assert chips_from_platform("my-cluster", 8, 1) is None


# ------------------------------------------------------------------------------------------ model costs

def _forward_hlo_flops(fn, *args) -> float:
    import tensorflow as tf

    from harness.plan.hlo_flops import hlo_flops

    return hlo_flops(tf.function(fn, jit_compile=True).experimental_get_compiler_ir(*args)(stage="hlo"))


def test_hlo_flops_counts_a_conv_and_a_matmul_by_hand():
    import tensorflow as tf

    w, m = tf.ones([3, 3, 3, 8]), tf.ones([8, 5])
    flops = _forward_hlo_flops(lambda x: tf.matmul(tf.reduce_mean(tf.nn.conv2d(x, w, 2, "SAME"), [1, 2]), m),
                               tf.zeros([2, 32, 32, 3]))
    assert flops == 2 * (2 * 16 * 16 * 8 * 27 + 2 * 8 * 5)


def _runtime():
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    return make_runtime(RuntimeConfig(kind="default"))


def test_resnet_and_ssd_counts_match_xla_on_tiny_models():
    import tensorflow as tf

    from benchmarks.resnet.config import ModelConfig as ResNetModel
    from benchmarks.resnet.cost import forward_macs_and_params as resnet_count
    from benchmarks.resnet.model import ResNet
    from benchmarks.ssd import anchors as A
    from benchmarks.ssd.config import ModelConfig as SSDModel
    from benchmarks.ssd.cost import forward_macs_and_params as ssd_count
    from benchmarks.ssd.model import SSD

    rcfg = types.SimpleNamespace(model=ResNetModel(blocks=[1, 1, 1, 1], width=4),
                                 data=types.SimpleNamespace(image_size=64, num_classes=10))
    runtime = _runtime()
    with runtime.scope():
        net = ResNet(runtime, 1, rcfg.model, 10, 1)
    got = _forward_hlo_flops(lambda x: net(x, training=False), tf.zeros([2, 64, 64, 3]))
    macs, params = resnet_count(rcfg)
    assert got == pytest.approx(2 * 2 * macs, rel=0.02)  # 2 images, 2 FLOPs a multiply-add
    assert params == sum(v.variable.shape.num_elements() for v in runtime.variables() if v.variable.trainable)

    tiny = SSDModel(image_size=64, width=2, blocks=[1, 1, 1], extra_channels=[[4, 8]] * 3, num_classes=3,
                    **{k: [list(v) if isinstance(v, tuple) else v for v in A.TINY64[k]]
                       for k in ("feature_sizes", "steps", "scales", "aspect_ratios")})
    runtime = _runtime()
    with runtime.scope():
        ssd = SSD(runtime, 0, tiny, 1)
    got = _forward_hlo_flops(lambda x: ssd(x, training=False), tf.zeros([2, 64, 64, 3]))
    macs, params = ssd_count(types.SimpleNamespace(model=tiny))
    assert got == pytest.approx(2 * 2 * macs, rel=0.02)
    assert params == sum(v.variable.shape.num_elements() for v in runtime.variables() if v.variable.trainable)


def test_bert_and_transformer_counts_match_xla_on_tiny_models():
    import tensorflow as tf

    from benchmarks.bert.config import ModelConfig as BertModel
    from benchmarks.bert.cost import forward_macs_and_params as bert_count
    from benchmarks.bert.model import Bert
    from benchmarks.transformer.config import ModelConfig as TModel
    from benchmarks.transformer.cost import forward_macs_and_params as t_count
    from benchmarks.transformer.model import Transformer

    bm = BertModel(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, ff_size=64, max_position=32,
                   hidden_dropout=0.0, attention_dropout=0.0)
    s, p = 16, 4
    runtime = _runtime()
    with runtime.scope():
        bert = Bert(runtime, 0, bm)
    batch = {"input_ids": tf.zeros([2, s], tf.int32), "input_mask": tf.ones([2, s], tf.int32),
             "segment_ids": tf.zeros([2, s], tf.int32), "masked_lm_positions": tf.zeros([2, p], tf.int32)}
    got = _forward_hlo_flops(lambda b: bert(b, training=False), batch)
    macs, _ = bert_count(types.SimpleNamespace(model=bm, data=types.SimpleNamespace(seq_length=s, max_predictions=p)))
    assert got == pytest.approx(2 * 2 * macs, rel=0.05)

    tm = TModel(vocab_size=40, hidden_size=32, num_layers=2, num_heads=4, filter_size=64, max_position=64,
                layer_postprocess_dropout=0.0, attention_dropout=0.0, relu_dropout=0.0)
    runtime = _runtime()
    with runtime.scope():
        tr = Transformer(runtime, 0, tm, 40)
    row = 16
    z = tf.ones([2, row], tf.int32)
    batch = {"inputs": z, "targets": z, "inputs_segmentation": z, "targets_segmentation": z,
             "inputs_position": tf.zeros([2, row], tf.int32), "targets_position": tf.zeros([2, row], tf.int32)}
    got = _forward_hlo_flops(lambda b: tr(b), batch)
    macs, _ = t_count(types.SimpleNamespace(model=tm, data=types.SimpleNamespace(row_length=row,
                                                                                 max_sequence_length=row)))
    assert got == pytest.approx(2 * 2 * macs, rel=0.05)


# ------------------------------------------------------------------------------------------ systems, errors

def test_every_system_file_loads_with_its_figures():
    names = available()
    assert {"tpu-v3", "tpu-v4", "dgx-a100", "dgx-h100"} <= set(names)
    for name in names:
        s = load_system(name)
        assert s.peak_flops > 1e13 and s.hbm_bandwidth > 1e11 and s.chips_per_host >= 1


def test_bad_system_file_and_bad_chip_counts_are_one_error_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkind: gpu\ntopology: ring\n")
    ref = os.path.join(REPO, "configs", "resnet", "reference.yaml")
    for args, want in [(["--system", str(bad), "--chips", "8"], "missing peak_flops"),
                       (["--system", "tpu-v9", "--chips", "8"], "unknown system 'tpu-v9'"),
                       (["--system", "tpu-v3", "--chips", "0"], "positive number of chips"),
                       (["--system", "dgx-a100", "--chips", "12"], "multiple of 8")]:
        proc = cli_in_process("plan", ref, *args)
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1 and want in lines[0], (args, proc.stderr[-500:])


@pytest.mark.parametrize("batch", ["0", "-4"])
def test_a_non_positive_global_batch_is_refused(batch):
    proc = cli_in_process("plan", os.path.join(REPO, "configs", "resnet", "reference.yaml"), "--system", "tpu-v3",
                          "--chips", "8", "--global_batch", batch)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: --global_batch {batch}: give a positive global batch (leave it "
                                        "out for the config's)"]


def test_chips_beyond_the_tables_largest_batch_are_refused_not_projected_past_the_cap(capsys):
    ref = os.path.join(REPO, "configs", "resnet", "reference.yaml")
    plan = planner.build(ref, [], "tpu-v3", [], None, None, False)
    cap = int(max(b for b, _ in planner._table_points(plan)))  # the RCP table's largest batch
    # At the cap the projection uses the batch its note states.
    assert planner.main(ref, [], "tpu-v3", cap, None, [], None, False, False, None, False, None) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(f"capped at the convergence table's largest batch {cap}" in line for line in out)
    assert LAST_LINE.match(out[-1]).group(4) == str(cap)
    for chips in (cap + 1, 99999999999):
        with pytest.raises(HarnessError) as e:
            planner.main(ref, [], "tpu-v3", chips, None, [], None, False, False, None, False, None)
        assert str(e.value) == (f"--chips {chips}: {chips} data-parallel replicas need a global batch of at least "
                                f"{chips}, above the convergence table's largest batch {cap} (the config's is "
                                f"{plan.cfg.schedule.global_batch_size}); use at most {cap} chips, or --global_batch N "
                                f"(N >= {chips}) to project beyond the table")
    # Asked for explicitly, a batch past the table is projected, flagged as outside it.
    assert planner.main(ref, [], "tpu-v3", cap + 1, cap + 1, [], None, False, False, None, False, None) == 0
    out = capsys.readouterr().out
    assert "outside the table's range" in out and out.rstrip().endswith(f"(global batch {cap + 1})")


@pytest.mark.parametrize("content, says", [
    (b"[1, 2]", "holds an array; expected a JSON object (a ModelCost, or a dry-run compile report"),
    (b'"resnet"', "holds a string; expected a JSON object"),
    (b"null", "holds null; expected a JSON object"),
    (b'{"workload": ', "not JSON (Expecting value: line 1 column 14 (char 13)); expected a JSON object"),
    (b"\xff\xfe{}", "not UTF-8 text; expected a JSON object"),
    (b'{"workload": "resnet", "source": "x", "train_flops_per_sample": "lots"}',
     "train_flops_per_sample must be a number, not 'lots'"),
    (b'{"workload": "resnet", "params": 2.5}', "params must be a whole number, not 2.5"),
])
def test_a_model_cost_file_that_is_not_a_cost_object_is_one_line(tmp_path, content, says):
    path = tmp_path / "cost.json"
    path.write_bytes(content)
    with pytest.raises(HarnessError) as e:
        costs.from_file(str(path))
    assert str(e.value).startswith(f"--model_cost {path}: {says}")


def test_a_model_cost_list_through_the_cli(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text("[]")
    proc = cli_in_process("plan", os.path.join(REPO, "configs", "resnet", "reference.yaml"), "--system", "tpu-v3",
                          "--chips", "8", "--model_cost", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: --model_cost {path}: holds an array; expected a JSON object (a "
                                        "ModelCost, or a dry-run compile report from run --dry_run --report_json)"]
    with pytest.raises(HarnessError, match="a directory; expected a JSON object"):
        costs.from_file(str(tmp_path))


# ------------------------------------------------------------------------------------------ whole plans

CONFIGS = ["bert/reference.yaml", "resnet/reference.yaml", "ssd/reference.yaml", "transformer/reference.yaml",
           "transformer/tpu-v3-32-mp4.yaml", "gpt_oss_20b/reference.yaml", "llama31_8b/reference.yaml"]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_plan_for_every_reference_config(config, capsys):
    system = {"bert": "dgx-a100", "ssd": "dgx-a100", "gpt_oss_20b": "dgx-h100",
              "llama31_8b": "tpu-v5p"}.get(config.split("/")[0], "tpu-v3")
    chips = 8 if config.startswith("gpt_oss") else 32  # gpt_oss_20b's reference batch is 16 rows
    path = os.path.join(REPO, "configs", config)
    assert planner.main(path, [], system, chips, None, [], None, False, False, None, False, None) == 0
    out = capsys.readouterr().out.splitlines()
    m = LAST_LINE.match(out[-1])
    assert m and float(m.group(1)) > 0 and m.group(2) == str(chips) and m.group(3) == system, out[-1]
    assert any("NOT calibrated" in line for line in out)
    assert any(line.strip().startswith("model FLOP/s") and "MFU" in line for line in out)
    assert any(line.strip().startswith("eval ") and "device" in line and "host scoring" in line for line in out)
    if "mp4" in config:
        assert any("8 data-parallel, model axis 4" in line for line in out)


def test_calibrated_sweep_json_and_png(tmp_path, capsys):
    synthetic_log(str(tmp_path / "result_0.txt"))
    path = os.path.join(REPO, "configs", "resnet", "reference.yaml")
    planner.main(path, [], "dgx-a100", 64, 4096, [str(tmp_path)], 8, True, True, None, False, str(tmp_path))
    data = json.loads(capsys.readouterr().out)
    assert data["efficiency_source"].startswith("calibrated on 1 log(s) at 8 chips")
    assert data["projection"]["chips"] == 64 and data["projection"]["eval"]["host"] >= 0
    assert 0 < data["projection"]["mfu"] < 1
    with open(data["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    chips = [p["chips"] for p in data["sweep"]]
    assert chips == sorted(chips) and 64 in chips
    # ResNet's model-parallel traffic (spatial halos) is not modelled: no model axis is suggested
    assert data["model_axis"] == 1 and data["model_parallel"] == []
    bert = os.path.join(REPO, "configs", "bert", "reference.yaml")
    planner.main(bert, [], "tpu-v4", 256, 4096, [], None, True, True, None, False, str(tmp_path))
    data = json.loads(capsys.readouterr().out)
    assert data["model_axis"] in planner.MODEL_AXES and data["model_parallel"]
    assert all(p["model_axis"] == data["model_axis"] for p in data["model_parallel"])


def test_model_cost_file_round_trips(tmp_path, capsys):
    from harness.config import load_config

    path = os.path.join(REPO, "configs", "bert", "reference.yaml")
    cost = costs.analytic(load_config(path))
    f = tmp_path / "cost.json"
    f.write_text(json.dumps(cost.to_dict()))
    planner.main(path, [], "tpu-v4", 64, None, [], None, False, False, None, False, None)
    analytic = capsys.readouterr().out.splitlines()[-1]
    planner.main(path, [], "tpu-v4", 64, None, [], None, False, False, str(f), False, None)
    assert capsys.readouterr().out.splitlines()[-1] == analytic


def test_model_cost_from_a_dry_run_compile_report():
    """The dry run's CompileReport (dict form) gives per-sample FLOPs; dataset sizes come from the base."""
    base = costs.ModelCost("bert", "counted", 1.0, 1.0, 1, 4.0, 36.0, 1000, 10, "sequence", eval_fixed_seconds=0.5)
    report = {"workload": "bert", "config": "c", "replicas": 8, "model_axis": 1, "per_replica_batch": 4,
              "global_batch": 32, "eval_per_replica_batch": 2, "params": 100, "train_flops_per_replica_step": 8e9,
              "eval_flops_per_replica_step": 1e9, "flops_source": "xla cost analysis",
              "weight_bytes_per_device": 400, "optimizer_bytes_per_device": 800, "gradient_bytes": 200,
              "peak_bytes_per_device": None, "compile_seconds": {}}
    c = costs.from_compile_report_dict(report, base)
    assert (c.train_flops_per_sample, c.eval_flops_per_sample, c.params, c.gradient_bytes) == (2e9, 5e8, 100, 200)
    assert (c.train_samples, c.eval_fixed_seconds) == (1000, 0.5) and c.source.startswith("xla cost analysis")
    with pytest.raises(HarnessError, match="compile report"):
        costs.from_compile_report_dict({"workload": "bert"}, base)


def test_plan_compile_is_the_dry_runs_compile_handed_in_by_the_cli(monkeypatch):
    """`plan --compile` costs the model from the compile cli.py hands it (plan/ does not import the dry run):
    the dry run's `compile_report` on the same config and overrides, read as a dry-run cost."""
    from harness.dryrun import command

    path = os.path.join(REPO, "configs", "resnet", "reference.yaml")
    calls = []

    def fake_compile(config_path, overrides):
        calls.append((config_path, overrides))
        return types.SimpleNamespace(to_dict=lambda: {
            "workload": "resnet", "per_replica_batch": 4, "eval_per_replica_batch": 4, "params": 100,
            "train_flops_per_replica_step": 8e9, "eval_flops_per_replica_step": 4e9, "gradient_bytes": 400,
            "flops_source": "fake compile"})

    monkeypatch.setattr(command, "compile_report", fake_compile)
    proc = cli_in_process("plan", path, "--system", "tpu-v3", "--chips", "32", "--compile", "--json",
                          "--set", "seed=3")
    assert proc.returncode == 0, proc.stderr
    assert calls == [(path, ["seed=3"])]
    out = json.loads(proc.stdout)
    assert out["model_cost"]["source"] == "fake compile (dry run)"
    assert out["model_cost"]["train_flops_per_sample"] == 2e9


def test_deepseek_plan_reads_its_rcps_counts_its_flops_and_names_a_batch_with_no_rcp(capsys):
    """deepseekv3_671b's plan: samples to converge from the checker's RCP table (batches 15360, 16384, 18432),
    the FLOPs per row from cost.py's count (about 1068 TFLOP per sample, NVIDIA's figure); above 18432 the
    table has no RCP and the plan says a result there needs new ones."""
    from benchmarks.deepseekv3_671b import cost
    from harness.config import load_config

    path = os.path.join(REPO, "configs", "deepseekv3_671b", "gpu-256x-h200.yaml")
    macs, _ = cost.forward_macs_and_params(load_config(path))
    assert 6 * macs / 1e12 == pytest.approx(1068, rel=0.001)
    for batch, source in ((16384, "at batch 16384"), (17408, "interpolated between 16384 and 18432")):
        assert planner.main(path, [], "dgx-h100", 256, batch, [], None, False, False, None, False, None) == 0
        out = capsys.readouterr().out
        assert f"{6 * macs / 1e9:,.1f} GFLOP per training row of 4096 tokens" in out
        assert f"[RCP table deepseekv3_671b 6.0.0 (mlperf-logging), {source}]" in out and "RCPs" not in out
    assert planner.main(path, [], "dgx-h100", 256, 20480, [], None, False, False, None, False, None) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "RCP" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "** outside the table's range: no RCP above batch 18432, a result at batch 20480 needs new RCPs (the RCP "
        "checker reports them missing) **")
