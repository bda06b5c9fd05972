"""`plan` at scale: the eval split into device / host / fixed parts recovered from one scale's logs, a
device-side eval staying a small share 512x past its calibration, asynchronous evals, the fixed per-step
cost (and its derivation from two held-out points), and the MFU a projection implies. No TensorFlow."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys

import pytest

from harness.errors import HarnessError
from harness.plan import converge, cost as costs
from harness.plan.calibrate import measure
from harness.plan.project import EvalTime, calibrate, eval_time, project, solve_efficiency, step_time
from harness.plan.system import load_system

from conftest import REPO

pytestmark = pytest.mark.quick

A, B = 0.3, 24.0     # the synthetic family's eval: A + B / chips seconds
EVAL_SAMPLES = 5000


def _mllog(t_ms: float, key: str, value=None, kind: str = "POINT_IN_TIME", **meta) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": int(t_ms), "event_type": kind, "key": key,
                                     "value": value, "metadata": meta})


def family_log(path: str, chips_hosts: int, step_s: float, eval_s: float, epochs: int = 3) -> None:
    """A run of `epochs` epochs of 1,000 images at global batch 100 (10 steps of step_s each) with one
    synchronous eval of eval_s after each epoch."""
    t = 1000.0
    lines = [_mllog(0, "init_start", kind="INTERVAL_START"), _mllog(1, "submission_benchmark", "ssd"),
             _mllog(1, "submission_platform", f"{chips_hosts}xNVIDIA DGX A100"), _mllog(1, "global_batch_size", 100),
             _mllog(1, "train_samples", 1000), _mllog(t, "init_stop", kind="INTERVAL_END"),
             _mllog(t, "run_start", kind="INTERVAL_START")]
    for e in range(1, epochs + 1):
        lines.append(_mllog(t, "epoch_start", kind="INTERVAL_START", epoch_num=e))
        t += 10 * step_s * 1000
        lines.append(_mllog(t, "epoch_stop", kind="INTERVAL_END", epoch_num=e))
        lines.append(_mllog(t, "eval_start", kind="INTERVAL_START", epoch_num=e))
        t += eval_s * 1000
        lines.append(_mllog(t, "eval_accuracy", 0.1 * e, epoch_num=e))
        lines.append(_mllog(t, "eval_stop", kind="INTERVAL_END", epoch_num=e))
    lines.append(_mllog(t, "run_stop", kind="INTERVAL_END", status="success"))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def family_cost(host_per_sample: float = 0.0) -> costs.ModelCost:
    return costs.ModelCost("ssd", "hand", 1e12, 3e11, 10**6, 2e6, 20.0, 1000, EVAL_SAMPLES, "image",
                           eval_host_seconds_per_sample=host_per_sample,
                           eval_fixed_seconds=A - host_per_sample * EVAL_SAMPLES)


def test_eval_a_plus_b_over_chips_is_recovered_from_one_scales_logs(tmp_path):
    """The family's eval takes A + B/chips: A on the host (what the workload states), B/chips on the devices.
    Logs at 8 chips alone give B; the projection reproduces A + B/chips at 64 and 1024 chips."""
    system = dataclasses.replace(load_system("dgx-a100"), step_overhead_seconds=0.0)
    family_log(str(tmp_path / "result_0.txt"), 1, 0.05, A + B / 8)
    m = measure([str(tmp_path)], "epochs", 1000, system.chips_per_host, system.cores_per_chip)
    assert (m.chips, m.eval_mode, m.evals) == (8, "sync", 3) and m.eval_seconds == pytest.approx(A + B / 8)
    assert m.step_seconds == pytest.approx(0.05)
    for host_per_sample in (0.0, 4e-5):  # A as a fixed cost per eval, or as host scoring per sample
        cal = calibrate(family_cost(host_per_sample), system, m.chips, m.global_batch, m.step_seconds,
                        m.eval_seconds, m.eval_mode, m.evals, m.steps)
        assert cal.eval_device_seconds * 8 == pytest.approx(B)
        for chips in (64, 1024):
            ev = eval_time(family_cost(host_per_sample), system, chips, 1024, cal.efficiency, cal)
            assert ev.one == pytest.approx(A + B / chips) and ev.device == pytest.approx(B / chips)
            assert ev.host == pytest.approx(host_per_sample * EVAL_SAMPLES)


def test_a_device_side_eval_stays_a_small_share_512x_past_its_calibration():
    """ResNet calibrated at 8 GPUs (the public DGX A100 v0.7 figures: 146.6 ms steps, 2.28 s synchronous
    evals) and projected at 4,096: the eval is device work, so it shrinks with the chips."""
    from harness.config import load_config

    cfg = load_config(os.path.join(REPO, "configs", "resnet", "reference.yaml"))
    module = costs.workload_cost_model("resnet")
    cost, system = costs.analytic(cfg), load_system("dgx-a100")
    cal = calibrate(cost, system, 8, 3264, 0.1466, 2.284, "sync", 11, 11 * 392.5)
    conv = converge.to_converge("resnet", cfg.ruleset, 65536, "epochs", None)
    conv = converge.at_evals(conv, module.eval_positions(cfg, conv.value, 65536))
    far = project(cost, system, conv, 4096, 65536, cal.efficiency, 1, cal)
    assert far.evals >= 10 and far.eval_total_seconds / far.total_seconds < 0.05
    assert far.eval.device == pytest.approx(cal.eval_device_seconds * 8 / 4096)
    # the eval seconds a stated-host split would have kept (the whole 2.28 s) would be a large share
    assert far.evals * 2.284 / (far.train_seconds + far.evals * 2.284) > 0.3


def test_asynchronous_evals_cost_their_device_part_each_time_and_the_last_ones_scoring():
    ev = EvalTime(device=0.5, host=3.0, fixed=0.1, mode="async")
    assert ev.total(6) == pytest.approx(6 * 0.5 + 3.1)
    assert dataclasses.replace(ev, mode="sync").total(6) == pytest.approx(6 * 3.6)
    # calibrating on asynchronous evals: the interval bounds the host part; the device part leaves the step
    system = load_system("dgx-a100")
    cost = costs.ModelCost("ssd", "hand", 1e12, 3e11, 10**6, 2e6, 20.0, 1000, EVAL_SAMPLES, "image",
                           eval_host_seconds_per_sample=1e-3)  # 5 s of scoring stated; the logs' 2 s bound it
    cal = calibrate(cost, system, 8, 100, 0.5, 2.0, "async", 4, 100)
    assert cal.eval_mode == "async" and cal.eval_host_seconds + cal.eval_fixed_seconds == pytest.approx(2.0)
    cost = dataclasses.replace(cost, eval_host_seconds_per_sample=2e-4)  # 1 s stated: fits in the interval
    cal = calibrate(cost, system, 8, 100, 0.5, 2.0, "async", 4, 100)
    assert cal.eval_host_seconds == pytest.approx(1.0)
    plain = calibrate(cost, system, 8, 100, 0.5)
    assert cal.efficiency > plain.efficiency  # the same step had eval work inside it


def test_fixed_step_cost_bounds_small_per_chip_batches_and_is_derived_from_two_points():
    cost = costs.ModelCost("ssd", "hand", 2e11, 7e10, 20 * 10**6, 4e7, 20.0, 117266, 5000, "image")
    system = dataclasses.replace(load_system("dgx-a100"), step_overhead_seconds=0.008)
    # at 2 images a chip the step cannot fall below the fixed cost, however many chips
    small = step_time(cost, system, 1024, 2048, 0.4)
    assert small.fixed == 0.008 and small.total > 0.008
    eff = solve_efficiency(cost, system, 8, 912, 0.093)
    assert step_time(cost, system, 8, 912, eff).total == pytest.approx(0.093, rel=1e-6)
    # two steps the model gives at 8 ms and efficiency 0.4 give back 8 ms and 0.4
    a = (8, 912, step_time(cost, system, 8, 912, 0.4).total)
    b = (512, 2048, step_time(cost, system, 512, 2048, 0.4).total)
    fixed, eff = _validate_plan().derive_overhead(cost, dataclasses.replace(system, step_overhead_seconds=0.0), a, b)
    assert fixed == pytest.approx(0.008, rel=1e-4) and eff == pytest.approx(0.4, rel=1e-4)


def _validate_plan():
    spec = importlib.util.spec_from_file_location("validate_plan", os.path.join(REPO, "scripts", "validate_plan.py"))
    vp = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = vp
    spec.loader.exec_module(vp)
    return vp


def test_convergence_by_schedule_keeps_the_calibrations_share_of_its_learning_rate_schedule():
    # calibration runs needed 3.0M samples of a 3.5M-sample schedule (6/7); a run whose schedule is 5.25M
    # samples needs 6/7 of it, 4.5M, whatever an RCP table of another target says
    conv = converge.by_schedule(3.0e6, 3.5e6, 5.25e6, "samples")
    assert conv.value == pytest.approx(4.5e6) and conv.in_range and "0.857" in conv.source
    with pytest.raises(HarnessError):
        converge.by_schedule(3.0e6, 0.0, 5.25e6, "samples")


def test_padding_factor_is_derived_from_an_unpadded_and_a_padded_step():
    system = dataclasses.replace(load_system("dgx-2h"), allreduce_overlap=0.0)
    cost = costs.ModelCost("bert", "hand", 1e12, 3e11, 3 * 10**8, 6e8, 36.0, 10**6, 0, "sequence")
    a = (16, 432, step_time(cost, system, 16, 432, 0.5).total)
    padded = dataclasses.replace(cost, train_flops_per_sample=1.3e12)
    b = (512, 9216, step_time(padded, system, 512, 9216, 0.5).total)
    factor, eff = _validate_plan().derive_padding(cost, system, a, b)
    assert factor == pytest.approx(1.3, rel=1e-4) and eff == pytest.approx(0.5, rel=1e-4)


def test_a_projection_reports_the_mfu_it_implies():
    system = dataclasses.replace(load_system("dgx-a100"), step_overhead_seconds=0.0)
    cost = costs.ModelCost("bert", "hand", 2.4e12, 8e11, 10**6, 2e6, 0.0, 10**6, 0, "sequence")
    conv = converge.Convergence(10**6, "samples", "t", True, evals=0)
    p = project(cost, system, conv, 1, 100, 0.5)
    # one chip, nothing but compute: MFU is the efficiency; model FLOP/s = FLOPs a sample x samples/s
    assert p.mfu == pytest.approx(0.5) and p.model_flops_per_s == pytest.approx(0.5 * 312e12)


def test_fsdp_gathers_the_weights_and_reduce_scatters_the_gradients():
    # a ring of 4 at 10 GB/s, nothing hidden: a full all-reduce of 8 GB is 2 * 3/4 * 8e9 / 1e10 = 1.2 s
    system = dataclasses.replace(load_system("tpu-v4"), topology="ring", link_bandwidth=10e9, link_latency=0.0,
                                 allreduce_overlap=0.0, step_overhead_seconds=0.0)
    cost = costs.ModelCost("gpt_oss_20b", "hand", 1e12, 3e11, 2 * 10**9, 8e9, 28.0, 1000, 0, "row")
    plain = step_time(cost, system, 4, 4, 0.5)
    sharded = step_time(dataclasses.replace(cost, fsdp_gather_bytes=8e9), system, 4, 4, 0.5)
    assert plain.allreduce == pytest.approx(1.2) and plain.fsdp_gather == 0.0
    # a reduce-scatter of the gradients (half the all-reduce) and two gathers of the weights (forward,
    # backward), each half an all-reduce of 8 GB
    assert sharded.allreduce == pytest.approx(0.6) and sharded.fsdp_gather == pytest.approx(1.2)
    assert sharded.fsdp_gather_total == pytest.approx(1.2)
    assert sharded.other == pytest.approx(plain.other / 4)  # each chip updates its quarter of the state
    once = step_time(dataclasses.replace(cost, fsdp_gather_bytes=8e9, fsdp_gathers_per_step=1), system, 4, 4, 0.5)
    assert once.fsdp_gather == pytest.approx(0.6)


def test_fsdp_gathers_hide_under_their_own_pass():
    # compute 1e12 x 1 / (1e12 x 0.5) = 2 s: forward 2/3 s, backward 4/3 s, everything overlappable
    system = dataclasses.replace(load_system("tpu-v4"), topology="ring", link_bandwidth=10e9, link_latency=0.0,
                                 allreduce_overlap=1.0, step_overhead_seconds=0.0, peak_flops=1e12)
    cost = costs.ModelCost("gpt_oss_20b", "hand", 1e12, 3e11, 2 * 10**9, 8e9, 0.0, 1000, 0, "row",
                           fsdp_gather_bytes=8e9)
    s = step_time(cost, system, 4, 4, 0.5)
    # reduce-scatter 0.6 s hides in the backward pass; the forward gather 0.6 s in the forward pass; the
    # backward gather 0.6 s in what the backward pass leaves (4/3 - 0.6): nothing exposed
    assert s.compute == pytest.approx(2.0) and s.allreduce_exposed == 0 and s.fsdp_gather == pytest.approx(0.0)
    # 16 GB of weights: each gather 1.2 s; the forward one exposes 1.2 - 2/3, the backward one what the
    # backward pass leaves after the reduce-scatter (4/3 - 0.6) short of 1.2
    big = step_time(dataclasses.replace(cost, fsdp_gather_bytes=16e9), system, 4, 4, 0.5)
    assert big.fsdp_gather == pytest.approx((1.2 - 2 / 3) + (1.2 - (4 / 3 - 0.6)))


def test_gpt_oss_cost_follows_the_mesh_and_splits_its_eval():
    from harness.config import load_config

    path = os.path.join(REPO, "configs", "gpt_oss_20b", "reference.yaml")
    plain = costs.analytic(load_config(path))
    fsdp = costs.analytic(load_config(path, ["runtime.fsdp=true"]))
    assert plain.fsdp_gather_bytes == 0 and fsdp.fsdp_gather_bytes == pytest.approx(4.0 * plain.params)
    assert fsdp.fsdp_gathers_per_step == 2
    assert plain.eval_host_seconds_per_sample == 0 and plain.mp_bytes_per_sample > 0
    system = load_system("dgx-h100")
    conv = converge.Convergence(1024, "samples", "t", True, evals=1)
    p = project(fsdp, system, conv, 16, 16, 0.4)
    assert p.step.fsdp_gather > 0 and p.eval.host == 0 and p.eval.device > 0 and 0 < p.mfu < 0.4
    assert project(plain, system, conv, 16, 16, 0.4).step.fsdp_gather == 0


def test_the_decoder_lms_share_one_cost_and_the_rules_eval_cadence():
    from harness.config import load_config
    from benchmarks.gpt_oss_20b import cost as gpt_oss_cost
    from benchmarks.lm import cost as lm_cost
    from benchmarks.llama31_8b import cost as llama_cost

    for module, name in ((llama_cost, "llama31_8b"), (gpt_oss_cost, "gpt_oss_20b")):
        cfg = load_config(os.path.join(REPO, "configs", name, "reference.yaml"),
                          ["runtime.fsdp=true", "data.eval_every_samples=0"])
        c = module.model_cost(cfg)
        assert module.COST.converge_unit == "samples"
        assert c.gradient_bytes == 4.0 * c.params and c.fsdp_gather_bytes == lm_cost.FSDP_WEIGHT_BYTES * c.params
        assert c.fsdp_gathers_per_step == 2 and c.train_flops_per_sample == pytest.approx(3 * c.eval_flops_per_sample)
        # the rules' cadence: ceil(12288 / gbs) * gbs samples, through the first eval at or past the value
        assert module.COST.eval_positions(cfg, 40000, 5000) == [15000, 30000, 45000]
        assert module.COST.eval_positions(cfg, 24576, 16) == [12288, 24576]
