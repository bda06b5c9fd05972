"""`run CONFIG --dry_run`: every hardware config builds and compiles under XLA on a stand-in replica (at
reduced width here; the README gives the full-size commands), with XLA's numbers, and a step that does
not compile is one `error:` line."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from benchmarks import registry
from conftest import REPO, TINY_RESNET, run_cli, sets, stderr_error_lines
from dry_run_shared import HARDWARE_CONFIGS, REDUCED, reduced_report, workload_of
from harness import config as config_lib
from harness.errors import HarnessError
from harness.runtime import make_runtime
from harness.runtime.base import InputContext
from harness.dryrun import apart, command, extrapolate, memory, standin, xla
from harness.dryrun.report import CompileReport

# (replicas, devices per replica, per-replica batch) the real run would have.
EXPECTED_DEVICES = {
    "configs/resnet/gpu-8x.yaml": (8, 1, 408),
    "configs/resnet/tpu-v3-32.yaml": (32, 1, 128),
    "configs/ssd/reference.yaml": (8, 1, 128),
    "configs/ssd/tpu-v3-32-spatial.yaml": (8, 4, 32),
    "configs/transformer/tpu-v3-32-mp4.yaml": (8, 4, 256),
    "configs/transformer/reference.yaml": (256, 1, 8),
}


def test_the_hardware_configs_are_all_covered():
    assert set(EXPECTED_DEVICES) <= set(HARDWARE_CONFIGS)
    assert {workload_of(c) for c in HARDWARE_CONFIGS} == set(REDUCED)


@pytest.mark.parametrize("config", HARDWARE_CONFIGS)
def test_every_hardware_config_compiles_at_reduced_width(config):
    r = reduced_report(config)
    if config in EXPECTED_DEVICES:
        assert (r.replicas, r.model_axis, r.per_replica_batch) == EXPECTED_DEVICES[config]
    assert r.per_replica_batch * r.replicas == r.global_batch
    # float32 gradients of what the replica holds: every parameter, or its own experts only (deepseekv3_671b)
    assert 0 < r.replica_params <= r.params and r.gradient_bytes == 4 * r.replica_params
    # Sharded variables take 1/model_axis of their bytes at most (1/devices where a layout also splits a
    # weight over the data axis, as experts are, or runtime.fsdp does); weights hold at least the parameters.
    cfg = config_lib.load_config(os.path.join(REPO, config), REDUCED[workload_of(config)])
    rt = cfg.runtime
    over_data = rt.kind == "mesh" and (rt.fsdp or any(dim != "batch" and axis == rt.layout.get("batch")
                                                      for dim, axis in rt.layout.items()))
    ways = r.model_axis * (r.replicas if over_data else 1)
    # A fine-tune's frozen base is held besides its parameters (ModelCost.frozen_bytes, whole at most).
    frozen = registry.cost_model(cfg.workload).model_cost(cfg).frozen_bytes
    assert 4 * r.params / ways <= r.weight_bytes_per_device <= 4 * r.params * 1.1 + 2**20 + frozen
    assert r.optimizer_bytes_per_device > 0
    assert r.train_flops_per_replica_step > 2 * r.params * r.per_replica_batch  # at least a forward pass
    assert r.eval_flops_per_replica_step > 0
    assert r.flops_source.startswith("counted")
    assert any("one CPU device compiled one replica's program" in n for n in r.stand_in)
    json.dumps(r.to_dict())


def test_flops_are_counted_as_xla_counts_them_on_a_hand_checked_step():
    w = tf.Variable(tf.ones([256, 512]))
    k = tf.Variable(tf.ones([3, 3, 16, 32]))

    def step(batch):
        return tf.matmul(batch["x"], w), tf.nn.conv2d(batch["image"], k, 1, "VALID")

    specs = {"x": tf.TensorSpec([64, 256]), "image": tf.TensorSpec([8, 32, 32, 16])}
    compiled = xla.compile_step(step, specs, "toy", "train", optimize=True)
    matmul = 2 * 64 * 256 * 512
    conv = 2 * (8 * 30 * 30 * 32) * (3 * 3 * 16)
    assert compiled.flops == matmul + conv
    # XLA's memory plan holds at least the inputs, weights and outputs.
    floats = 64 * 256 + 8 * 32 * 32 * 16 + 256 * 512 + 3 * 3 * 16 * 32 + 64 * 512 + 8 * 30 * 30 * 32
    assert compiled.peak_bytes >= 4 * floats


def test_a_step_that_does_not_compile_is_one_line_naming_the_op():
    def step(batch):
        return tf.strings.length(tf.strings.as_string(batch["x"]))  # strings: no XLA kernel

    with pytest.raises(HarnessError) as e:
        xla.compile_step(step, {"x": tf.TensorSpec([4])}, "toy", "eval")
    message = str(e.value)
    assert message.startswith("toy eval step does not compile under XLA: AsString"), message
    assert "\n" not in message and "test_dry_run.py" in message
    assert xla.xla_compile_error(ValueError("shapes differ"), "toy", "train") is None


@pytest.mark.parametrize("workload", sorted(REDUCED))
def test_dry_run_inputs_match_what_the_data_gives(workload):
    small = {"transformer": ["data.synthetic_train_pairs=200", "data.eval_samples=8", "data.train_samples=8"],
             "ssd": ["data.train_samples=8", "data.eval_samples=8", "submission.division=open"]}.get(workload, [])
    cfg = config_lib.load_config(os.path.join(REPO, "configs", workload, "smoke.yaml"), small)
    runtime = make_runtime(cfg.runtime)
    w = registry.get(workload)(cfg, runtime)
    if workload == "transformer":  # a dry run takes the vocabulary's size from the config
        cfg.model.vocab_size = w.vocab_size
    train, evaluation, _ = registry.get(workload)(cfg, runtime).dry_run_inputs()
    ctx = InputContext(num_hosts=1, host_id=0, batch_size=2, seed=0)
    assert w.train_dataset(ctx).element_spec == train
    parsed = w.eval_records(ctx).map(w.eval_parse).element_spec
    if workload == "transformer":  # eval inputs stood in at data.max_sequence_length, not the longest
        parsed = {k: tf.TensorSpec([8 * -(-cfg.data.max_sequence_length // 8)], s.dtype) for k, s in parsed.items()}
    assert parsed == evaluation


def test_device_plans_come_from_the_config_or_are_refused():
    cfg = config_lib.load_config(os.path.join(REPO, "configs/resnet/tpu-v3-32.yaml"), [])
    assert standin.device_plan(cfg).replicas == 32
    cfg.submission.platform, cfg.runtime.tpu = "my-pod", "my-tpu"
    with pytest.raises(HarnessError, match="cannot tell how many TPU cores"):
        standin.device_plan(cfg)
    assert standin.tpu_devices("tpu-v4-32") == 16 and standin.tpu_devices("v5litepod-16") == 16


def test_cli_dry_run_prints_the_report_writes_json_and_no_log(tmp_path):
    # The CLI's path, not the model, is under test: a one-stage ResNet (four stages at width 8, the other
    # tests' reduced size, took 54 CPU-s here with XLA's HLO passes; this one 19).
    out, js = tmp_path / "runs", tmp_path / "report.json"
    proc = run_cli("run", "configs/resnet/gpu-8x.yaml", "--dry_run", "--report_json", str(js),
                   *sets(*TINY_RESNET, f"output_dir={out}"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FLOPs per train step (one replica):" in proc.stdout
    assert re.search(r"peak memory per device \(XLA:CPU buffer assignment, train step\): \d+\.\d+ GiB", proc.stdout)
    assert "stood in: runtime.gpus=8 GPUs" in proc.stdout
    report = json.loads(js.read_text())
    assert report["replicas"] == 8 and report["peak_bytes_per_device"] > 0
    assert not out.exists()


@pytest.mark.parametrize("mode", [["--dry_run"], ["--set", "runtime.jit_compile=true"]], ids=["dry_run", "run"])
def test_cli_compile_failure_is_one_error_line(tmp_path, mode):
    # A real workload whose training loss gains an op with no XLA kernel (a helper patches it in); the
    # real run meets it at its warm-up compile, before run_start.
    helper = os.path.join(REPO, "tests", "helpers", "broken_step.py")
    proc = subprocess.run([sys.executable, helper, "run", "configs/resnet/smoke.yaml", *mode, *sets(*TINY_RESNET),
                           "--set", f"output_dir={tmp_path / 'runs'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert stderr_error_lines(proc) == [l for l in proc.stderr.splitlines() if l.strip()][-1:]
    line = stderr_error_lines(proc)[0]
    assert line.startswith("error: resnet train step does not compile under XLA: AsString"), line
    assert "broken_step.py" in line  # where the op was created
    assert "Traceback" not in proc.stderr
    if mode == ["--dry_run"]:
        assert not (tmp_path / "runs").exists()
    else:  # no result log: the log that was opened is kept as incomplete
        assert not list((tmp_path / "runs").rglob("result_*.txt"))
        assert list((tmp_path / "runs").rglob("incomplete_result_*.log"))


def test_gpt_oss_counted_cost_is_the_compiled_models_params_and_a_lower_bound_of_its_flops():
    """The planner's analytic count (benchmarks/gpt_oss_20b/cost.py) against the reduced reference the dry run
    compiles: the same parameters exactly; its useful FLOPs (k active experts, causal half of full
    attention) at most what XLA is handed, which adds the einsum dispatch and whole attention blocks."""
    from benchmarks.gpt_oss_20b import cost

    config = os.path.join("configs", "gpt_oss_20b", "reference.yaml")
    r = reduced_report(config)
    counted = cost.model_cost(config_lib.load_config(os.path.join(REPO, config), REDUCED["gpt_oss_20b"]))
    assert counted.params == r.params
    assert 0 < counted.train_flops_per_sample * r.per_replica_batch <= r.train_flops_per_replica_step
    assert 0 < counted.eval_flops_per_sample * r.eval_per_replica_batch <= r.eval_flops_per_replica_step
    # The report shows the compiled step against that useful count (the MoE dispatch's waste is visible).
    useful = counted.train_flops_per_sample * r.per_replica_batch
    assert r.useful_train_flops_per_replica_step == pytest.approx(useful)
    ratio = f"compiled / useful = {r.train_flops_per_replica_step / useful:.2f}"
    assert [line for line in r.lines() if line.startswith("useful FLOPs") and line.endswith(ratio)]


MESH_CONFIG = "configs/bert/smoke-mesh.yaml"  # data 2 x model 2; reduced width, 8 examples per replica
MESH_OVERRIDES = REDUCED["bert"] + ["schedule.global_batch_size=16", "schedule.eval_batch_size=16"]


def _layout_split_bytes(trainable_only: bool = False) -> tuple[int, int, int]:
    """(bytes of the model's variables a model-axis layout splits, of the others, model ways), from the
    config's own layout and the built model's variables, independently of the dry run's arithmetic."""
    cfg = config_lib.load_config(os.path.join(REPO, MESH_CONFIG), MESH_OVERRIDES)
    checked, runtime, _ = standin.standin_checked(cfg)
    workload = checked.workload
    with runtime.scope():
        workload.build()
    layout, model = cfg.runtime.layout, "model"
    sharded = whole = 0
    for v in runtime.variables(trainable=True if trainable_only else None):
        if v.path.startswith(f"{workload.optimizer.name}/"):
            continue
        size = v.variable.shape.num_elements() * v.variable.dtype.size
        if any(d is not None and layout.get(d) == model for d in v.dims):
            sharded += size
        else:
            whole += size
    return sharded, whole, int(cfg.runtime.mesh[model])


def test_dry_run_reports_memory_per_device_on_a_model_axis():
    """A mesh with a model axis: weights, optimizer state, gradients and an
    activation estimate per device, and a peak that is their sum; weights split as the layout says."""
    r = command.compile_report(os.path.join(REPO, MESH_CONFIG), MESH_OVERRIDES, optimize=True)
    assert r.model_axis == 2
    assert r.peak_bytes_per_device is not None and r.activation_bytes_per_device is not None
    sharded, whole, ways = _layout_split_bytes()
    assert sharded > 0 and ways == 2
    assert r.weight_bytes_per_device == whole + sharded // ways
    t_sharded, t_whole, _ = _layout_split_bytes(trainable_only=True)  # float32: gradient = weight
    assert r.gradient_bytes_per_device == t_whole + t_sharded // ways < r.gradient_bytes
    assert r.activation_bytes_per_device > 0
    assert r.peak_bytes_per_device == (r.weight_bytes_per_device + r.optimizer_bytes_per_device
                                       + r.gradient_bytes_per_device + r.activation_bytes_per_device)
    assert r.eval_peak_bytes_per_device is not None and r.eval_peak_bytes_per_device > r.weight_bytes_per_device
    assert r.memory_source.startswith("estimate: ") and "split evenly over its 2 devices" in r.memory_source
    lines = "\n".join(r.lines())
    assert "peak memory per device (estimate, train step): " in lines and "not reported" not in lines
    assert "activations and other temporaries per device (estimate, train step): " in lines


def test_fsdp_divides_state_and_gradients_by_the_data_axis_where_a_dimension_allows():
    """runtime.fsdp=true on the same mesh: each variable's bytes per device divide by data=2 too where one
    of its dimensions not on the model axis is even (the mesh runtime's rule); the report says what it saves."""
    path = os.path.join(REPO, MESH_CONFIG)
    plain = command.compile_report(path, MESH_OVERRIDES, optimize=False)
    r = command.compile_report(path, MESH_OVERRIDES + ["runtime.fsdp=true"], optimize=False)
    cfg = config_lib.load_config(path, MESH_OVERRIDES)
    checked, runtime, _ = standin.standin_checked(cfg)
    workload = checked.workload
    with runtime.scope():
        workload.build()
    layout, data, model = cfg.runtime.layout, int(cfg.runtime.mesh["data"]), int(cfg.runtime.mesh["model"])
    expect = {"weights": 0, "optimizer": 0, "gradients": 0, "whole": 0}
    for v in runtime.variables():
        shape, size = v.variable.shape.as_list(), v.variable.shape.num_elements() * v.variable.dtype.size
        on_model = [d is not None and layout.get(d) == "model" for d in v.dims]
        if any(on_model):
            size //= model
            first = on_model.index(True)  # a mesh dimension splits one dimension of a tensor
            on_model = [i == first for i in range(len(on_model))]
        if any(not m and n % data == 0 for m, n in zip(on_model, shape)):
            size //= data
        else:
            expect["whole"] += v.variable.shape.num_elements() * v.variable.dtype.size
        optimizer = v.path.startswith(f"{workload.optimizer.name}/")
        expect["optimizer" if optimizer else "weights"] += size
        expect["gradients"] += size if v.trainable and not optimizer else 0
    assert r.weight_bytes_per_device == expect["weights"] < plain.weight_bytes_per_device
    assert r.optimizer_bytes_per_device == expect["optimizer"] < plain.optimizer_bytes_per_device
    assert r.gradient_bytes_per_device == expect["gradients"] < plain.gradient_bytes_per_device
    assert r.gradient_bytes == plain.gradient_bytes  # what a replica's step produces before it is reduced
    saved = sum(getattr(plain, k) - getattr(r, k) for k in
                ("weight_bytes_per_device", "optimizer_bytes_per_device", "gradient_bytes_per_device"))
    assert (r.fsdp_data_axis, r.fsdp_saved_bytes_per_device, r.fsdp_replicated_bytes) == (data, saved, expect["whole"])
    assert saved > 0 and expect["whole"] > 0  # the LAMB step counter, at least, cannot be split
    line = [x for x in r.lines() if x.startswith("FSDP over data=2: saves ")]
    assert len(line) == 1 and f"({saved:,} bytes) per device" in line[0], r.lines()
    assert not [x for x in plain.lines() if x.startswith("FSDP")]


def test_spatial_replica_memory_splits_activations_not_weights():
    """TPU spatial partitioning (a replica over 4 cores, weights whole on each): the estimate splits the
    plan's activations over the cores and keeps every core's full state and gradients."""
    m = memory.memory_per_device(peak=1000, eval_peak=500, devices=4, state=(300, 300), eval_state=(100, 100),
                                 gradients=(100, 100))
    assert (m.activations, m.peak, m.eval_peak) == (150, 300 + 100 + 150, 100 + 100)
    assert m.source.startswith("estimate: ")
    one = memory.memory_per_device(peak=1000, eval_peak=500, devices=1, state=(300, 300), eval_state=(100, 100),
                                   gradients=(100, 100))
    assert (one.activations, one.peak, one.eval_peak) == (600, 1000, 500)  # XLA's own plan, as it is
    assert one.source.startswith("XLA:CPU buffer assignment")
    none = memory.memory_per_device(None, None, 4, (300, 300), (100, 100), (100, 100))
    assert none.peak is None and none.activations is None


def test_stand_in_extrapolation_is_exact_for_a_model_whose_layers_and_experts_multiply(monkeypatch):
    """gpt_oss_20b's full-size dry run compiles small models and extrapolates: parameters = layers x expert
    hidden units x per-unit + layers x per-layer + vocabulary x per-token is bilinear in (layers, expert
    hidden), so the pair's extra compile must make the extrapolation exact (additive slopes miss 23 layers'
    expert weights)."""
    def params(c):
        return c["model.num_layers"] * (c["model.expert_hidden"] * 1000 + 77) + c["model.vocab_size"] * 3 + 5

    def fake_compile(path, overrides, optimize, full):
        assert full is cfg
        c = dict(o.split("=") for o in overrides)
        c = {k: int(v) for k, v in c.items()}
        n = params(c)
        return CompileReport(
            workload="gpt_oss_20b", config=path, replicas=1, model_axis=1, per_replica_batch=2, global_batch=2,
            eval_per_replica_batch=2, params=n, train_flops_per_replica_step=6.0 * n,
            eval_flops_per_replica_step=2.0 * n,
            flops_source="fake", weight_bytes_per_device=4 * n, optimizer_bytes_per_device=8 * n, gradient_bytes=4 * n,
            peak_bytes_per_device=16 * n, compile_seconds={"train": 1.0, "eval": 1.0})

    monkeypatch.setattr(apart, "compile_here", fake_compile)
    monkeypatch.setattr(apart, "COMPILE_APART", False)  # the fake lives in this process
    path = os.path.join(REPO, "configs", "gpt_oss_20b", "reference.yaml")
    cfg = config_lib.load_config(path)
    wl = registry.get("gpt_oss_20b")
    full = {"model.num_layers": 24, "model.expert_hidden": 2880, "model.vocab_size": 128256}
    report = extrapolate.linear_stand_in(path, [], True, cfg, wl.DRY_RUN_LINEAR, wl.DRY_RUN_PAIRS)
    assert report.params == params(full) and report.train_flops_per_replica_step == 6.0 * params(full)
    assert "together" in report.stand_in[0] and report.compile_seconds["train"] == 5.0
    additive = extrapolate.linear_stand_in(path, [], True, cfg, wl.DRY_RUN_LINEAR)
    assert additive.params < params(full)  # what the stand-in printed before the pair's compile


def test_a_stood_in_vocabulary_keeps_the_full_vocabularys_loss_blocks():
    """llama31_8b's dry run compiles vocabularies of 512 and 1024 for 128,256: the loss's budgets shrink with
    the vocabulary, so its blocks span the positions the full size's do (the loss memory then extrapolates
    linearly), instead of one kept block of all the logits."""
    from harness.config import RuntimeConfig
    from harness.nn import cross_entropy
    from harness.runtime import make_runtime

    path = os.path.join(REPO, "configs", "llama31_8b", "reference.yaml")
    full = config_lib.load_config(path)
    seq = full.data.seq_length
    want = cross_entropy.block_length(1, seq, full.model.vocab_size)
    assert want < seq  # the full vocabulary runs in blocks
    for vocab in (512, 1024):
        small = config_lib.load_config(path, [f"model.vocab_size={vocab}"])
        wl = registry.get("llama31_8b")(small, make_runtime(RuntimeConfig()))
        wl.stand_in_for(full)
        budget = int(cross_entropy.BLOCK_ELEMENTS * wl.loss_budget_scale)
        assert 1 * seq * vocab > int(cross_entropy.KEEP_ELEMENTS * wl.loss_budget_scale)  # not one kept block
        assert cross_entropy.block_length(1, seq, vocab, budget) == want


def test_a_model_compiled_smaller_is_checked_at_its_own_sizes(monkeypatch):
    """The dry run of a model too big for the host compiles it at smaller sizes, but the run's pre-log checks
    see the config as given: a vocabulary of 1001 does not split over a model axis of 2 (the stand-ins'
    512 and 1024 would), here as in `run`."""
    monkeypatch.setattr(memory, "HOST_MEMORY_SHARE", 0.0)  # every model counts as too big for the host
    with pytest.raises(HarnessError, match="vocab_size"):
        command.compile_report("configs/llama31_8b/smoke-mesh.yaml", ["model.vocab_size=1001"], optimize=False)


DEEPSEEK = "configs/deepseekv3_671b/gpu-256x-h200.yaml"


def test_deepseek_device_holds_its_own_experts_and_a_256th_of_the_rest():
    """The 256-device DeepSeek-V3 mesh at reduced width: the stand-in device holds its own expert of each MoE
    layer (the all-to-all dispatch never gathers them) and everything else whole; per device, FSDP and the
    expert split leave 1/256 of every variable. Counted here from the config, apart from the dry run."""
    from benchmarks.deepseekv3_671b import cost

    r = reduced_report(DEEPSEEK)
    cfg = config_lib.load_config(os.path.join(REPO, DEEPSEEK), REDUCED["deepseekv3_671b"])
    m, n = cfg.model, 256
    total = cost.forward_macs_and_params(cfg)[1]
    moe_layers = m.num_layers - m.first_dense_layers + m.mtp_layers
    experts = moe_layers * m.num_experts * 3 * m.hidden_size * m.expert_hidden
    assert (r.replicas, r.per_replica_batch, m.num_experts) == (n, 2, n)
    assert r.params == total
    assert r.replica_params == total - experts + experts // n
    bias = moe_layers * m.num_experts  # each MoE layer's float32 expert bias, not trained
    assert r.weight_bytes_per_device == 4 * (total + bias) // n
    assert r.gradient_bytes_per_device == 4 * total // n
    assert r.optimizer_bytes_per_device == 2 * 4 * total // n + 8  # AdamW's two slots, the int64 step whole
    assert r.fsdp_replicated_bytes == 8
    assert any(s.startswith("expert parallelism 256: the device holds its own 1/256") for s in r.stand_in)


def test_the_stand_ins_all_to_all_hands_each_device_its_experts_block():
    """One device's side of the all-to-all: experts [2d, 2d + 2) of its 2 rows arrive as rows [2d, 2d + 2)
    of device d's slots, and the way back restores the batch-split buffer; variables split over `experts`
    hold the device's share and keep the model's shape as declared."""
    cfg = config_lib.load_config(os.path.join(REPO, DEEPSEEK), REDUCED["deepseekv3_671b"])
    _, runtime, _ = standin.standin_checked(cfg)
    assert runtime.hold_own_experts() and runtime.local_experts == 256
    x = tf.reshape(tf.range(2 * 512 * 3 * 4), [2, 512, 3, 4])
    y = runtime.place(x, (None, "experts", None, None))
    assert y.shape == [512, 2, 3, 4]
    for d in (0, 5, 255):
        assert tf.reduce_all(y[2 * d:2 * d + 2] == x[:, 2 * d:2 * d + 2])
    assert tf.reduce_all(runtime.place(y, ("batch", None, None, None)) == x)
    with runtime.scope():
        v = runtime.variable("t/experts", (512, 4), ("experts", None), lambda s, d: tf.zeros(s, d))
    assert v.shape == [2, 4] and runtime.variables()[-1].shape == (512, 4)
    llama = config_lib.load_config(os.path.join(REPO, "configs/llama31_8b/smoke-mesh.yaml"))
    _, plain, _ = standin.standin_checked(llama)
    assert not plain.hold_own_experts() and plain.local_experts == 1


def test_a_step_of_many_micro_batches_is_extrapolated_from_one_and_two(monkeypatch):
    """GA 64 is unrolled 64 times in the train step, too long to compile at full width: the step is compiled
    with 1 micro-batch (FLOPs only) and 2, and its FLOPs are the optimizer's plus 64 micro-batches' exactly;
    its memory is the 2-micro-batch step's."""
    def fake_compile(path, overrides, optimize, full):
        c = {k: int(v) for k, v in (o.split("=") for o in overrides)}
        k, layers = c["schedule.gradient_accumulation_steps"], c["model.num_layers"]
        assert c["schedule.global_batch_size"] == 256 * k and c["schedule.eval_batch_size"] == 1024
        assert optimize == (k == 2)  # the 1-micro-batch step for its FLOPs alone
        return CompileReport(
            workload="deepseekv3_671b", config=path, replicas=256, model_axis=1, per_replica_batch=k,
            global_batch=256 * k, eval_per_replica_batch=4, params=layers, train_flops_per_replica_step=1000.0 * layers
            + k * 77.0 * layers, eval_flops_per_replica_step=5.0 * layers, flops_source="fake",
            weight_bytes_per_device=4 * layers, optimizer_bytes_per_device=8 * layers, gradient_bytes=4 * layers,
            peak_bytes_per_device=(10 + 3 * k) * layers, compile_seconds={"train": 1.0, "eval": 1.0})

    monkeypatch.setattr(apart, "compile_here", fake_compile)
    monkeypatch.setattr(apart, "COMPILE_APART", False)  # the fake lives in this process
    path = os.path.join(REPO, DEEPSEEK)
    cfg = config_lib.load_config(path, ["schedule.eval_batch_size=1024"])
    report = extrapolate.micro_batched_stand_in(path, [], True, cfg, {"model.num_layers": (1, 2)})
    assert report.train_flops_per_replica_step == 1000.0 * 61 + 64 * 77.0 * 61
    assert report.peak_bytes_per_device == 16 * 61 and report.eval_flops_per_replica_step == 5.0 * 61
    assert (report.per_replica_batch, report.global_batch) == (64, 16384)
    assert report.stand_in[0].startswith("train step: 64 accumulated micro-batches of 1 row(s) per replica")


def test_the_all_to_all_bytes_are_printed_from_the_full_config():
    """What one device cannot show, from the config: a micro-batch's 4096 tokens x 8 experts x 7168 bfloat16
    values each way per MoE layer (0.94 GB there and back), over 59 MoE layers, 64 micro-batches
    and 3 passes (remat recomputes the forward)."""
    cfg = config_lib.load_config(os.path.join(REPO, DEEPSEEK))
    checked, _, _ = standin.standin_checked(cfg)
    [note] = checked.workload.dry_run_notes()
    one_way = 4096 * 8 * 7168 * 2
    slots = 256 * 256 * 7168 * 2  # capacity factor 2: 256 slots per expert
    assert f"sends {one_way / 1e9:.3f} GB" in note and f"{2 * one_way / 1e9:.3f} GB in all" in note
    assert f"{slots / 1e9:.3f} GB each way (256 experts x 256 slots" in note
    assert f"= {2 * one_way * 59 * 64 * 3 / 1e12:.2f} TB per device per step" in note


def test_a_stood_in_compile_frees_its_model_before_the_next():
    """A recomputed layer (tf.recompute_grad) traced in a graph registers its gradient process-wide and keeps
    the layers, and so every variable, alive: the stand-in's compiles, one after another at full width, would
    hold every model built so far. `_model_freed_after` drops the registration once the compile is done."""
    import gc

    def runtimes_alive() -> int:
        gc.collect()
        return sum(isinstance(o, standin.StandInRuntime) for o in gc.get_objects())

    path = os.path.join(REPO, "configs", "deepseekv3_671b", "smoke.yaml")
    # One recomputed dense layer and short rows: the registration, not the model's size, is under test.
    small = ["model.remat=true", "model.num_layers=1", "model.first_dense_layers=1", "model.mtp_layers=0",
             "data.seq_length=32"]
    before = runtimes_alive()
    report = command.compile_report(path, small, optimize=False, stand_in=False)
    report.traced = {}
    assert runtimes_alive() == before + 1  # kept by the gradient registry, not by the report
    with apart._model_freed_after():
        report = command.compile_report(path, small, optimize=False, stand_in=False)
        report.traced = {}
    assert runtimes_alive() == before + 1  # the first still held (its registration predates the block)


def test_a_stood_in_compile_runs_apart_and_brings_its_report_or_error_back():
    """The full-size dry run compiles each small model in a process of its own (memory handed back when it
    ends): the report arrives whole, and a config the child refuses is the same one-line HarnessError."""
    from benchmarks.deepseekv3_671b import cost

    path = os.path.join(REPO, "configs", "deepseekv3_671b", "smoke.yaml")
    full = config_lib.load_config(path)
    small = ["model.mtp_layers=0", "model.num_layers=2", "model.first_dense_layers=1", "data.seq_length=32"]
    report = apart._compile_apart(path, small, False, full)
    assert report.params == cost.forward_macs_and_params(config_lib.load_config(path, small))[1]
    assert report.train_flops_per_replica_step > 0 and report.traced == {}
    with pytest.raises(HarnessError, match="model.groups_per_token=3 exceeds model.expert_groups=2"):
        apart._compile_apart(path, ["model.groups_per_token=3"], False, full)


def test_an_extrapolated_activation_below_zero_takes_the_kept_floor():
    """flux1 on 64 devices extrapolated its train activations to -1.3 GiB from 1- and 2-block compiles: the
    report then takes what the backward pass keeps at least, raises the peak by as much and says so; a
    positive estimate is left as XLA planned it."""
    gib = 2**30
    report = CompileReport(
        workload="flux1", config="c.yaml", replicas=64, model_axis=1, per_replica_batch=32, global_batch=2048,
        eval_per_replica_batch=32, params=10, train_flops_per_replica_step=1.0, eval_flops_per_replica_step=1.0,
        flops_source="fake", weight_bytes_per_device=gib, optimizer_bytes_per_device=2 * gib, gradient_bytes=gib,
        peak_bytes_per_device=3 * gib - gib // 2, compile_seconds={"train": 1.0, "eval": 1.0},
        activation_bytes_per_device=-gib // 2)
    floored = memory.floor_activations(report, 5 * gib)
    assert floored.activation_bytes_per_device == 5 * gib
    assert floored.peak_bytes_per_device == 8 * gib
    assert "-0.500 GiB" in floored.stand_in[-1] and "5.000 GiB" in floored.stand_in[-1]
    positive = memory.floor_activations(dataclasses.replace(report, activation_bytes_per_device=gib), 5 * gib)
    assert positive.activation_bytes_per_device == gib and positive.stand_in == []
