"""`plan`'s layouts: per-chip memory checked against the chip (refused in one line naming the smallest change
that fits, never projected), experts split with the all-to-all in the step, frozen weights, micro-batches
and remat, the sweep's batches inside the RCP table, MFU on useful FLOPs only, the precision's peak."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from harness.plan import layout as layouts, planner
from harness.plan.system import load_system

from conftest import REPO, cli_in_process

DSV3 = os.path.join(REPO, "configs", "deepseekv3_671b", "reference.yaml")
LLAMA8 = os.path.join(REPO, "configs", "llama31_8b", "reference.yaml")
LORA = os.path.join(REPO, "configs", "llama2_70b_lora", "gpu-8x-h100.yaml")


def _plan(config: str, system: str, **kw) -> planner.Plan:
    return planner.build(config, [], system, [], None, None, False, **kw)


@pytest.fixture(scope="module")
def dsv3() -> planner.Plan:
    return _plan(DSV3, "gb300-nvl72")


def test_deepseek_at_256_chips_projects_with_experts_split_and_fits(dsv3):
    p = dsv3.at(256, 16384)
    lay, mem = dsv3.layout_at(256), dsv3.memory_at(256, 16384)
    assert lay.expert_axis == 256 and lay.alltoall and lay.fsdp and lay.remat and lay.micro_batches == 64
    assert mem.fits and mem.total < layouts.HEADROOM * load_system("gb300-nvl72").hbm_bytes
    # every chip owns 1 of the 256 experts of each MoE layer: ~2.6 B expert + ~0.07 B dense parameters
    assert 2.5e9 < (mem.weights / 4) < 2.8e9
    assert p.step.alltoall > 0 and p.step.alltoall_bytes > 0 and p.step.recompute > 0
    text = "\n".join(planner.format_projection(dsv3, p))
    assert "all-to-all (experts)" in text and "experts split over 256 chips" in text
    assert "memory per chip" in text and "useful FLOPs only" in text and "(bf16 peak)" in text


def test_deepseek_where_it_cannot_fit_is_one_line_naming_the_smallest_change(dsv3):
    with pytest.raises(layouts.DoesNotFit) as e:
        dsv3.at(32, 16384)
    msg = str(e.value)
    assert "\n" not in msg and "does not fit 32 x gb300-nvl72" in msg and "not projected" in msg
    assert "The smallest change that fits: --chips 64 " in msg
    # the chips it names fit
    assert dsv3.memory_at(64, 16384).fits


def test_a_refusal_through_the_cli_is_one_error_line():
    proc = cli_in_process("plan", LLAMA8, "--system", "dgx-h100", "--chips", "1")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1, proc.stderr[-800:]
    assert "llama31_8b does not fit 1 x dgx-h100" in lines[0] and "--chips 4" in lines[0]


def test_fsdp_splits_weights_gradients_and_optimizer_state():
    plan = _plan(LLAMA8, "dgx-h100")
    on = layouts.memory(plan.cfg, plan.module, plan.cost, plan.system, plan.layout_at(8), 16)
    off = layouts.memory(plan.cfg, plan.module, plan.cost, plan.system,
                         dataclasses.replace(plan.layout_at(8), fsdp=False), 16)
    assert on.weights == pytest.approx(plan.cost.params * 4 / 8) and off.weights == pytest.approx(plan.cost.params * 4)
    assert off.optimizer == pytest.approx(2 * off.weights)  # AdamW's two float32 slots from its 28 B of traffic
    assert on.gathered > 0 and off.gathered == 0
    # more micro-batches: fewer rows of activations at a time; remat keeps less
    half = layouts.memory(plan.cfg, plan.module, plan.cost, plan.system,
                          dataclasses.replace(plan.layout_at(8), micro_batches=2), 16)
    assert half.activations == pytest.approx(on.activations / 2)


def test_frozen_weights_have_no_gradients_nor_optimizer_state_and_are_never_reduced():
    plan = _plan(LORA, "dgx-h100")
    mem = plan.memory_at(8, 8)
    assert mem.frozen == pytest.approx(plan.cost.frozen_bytes / 8) and mem.gradients < mem.frozen / 100
    p = plan.at(8, 8)
    # only the adapters' gradients are reduced: the frozen base's bytes never enter the reduction
    assert p.step.allreduce < 1e-3


def test_the_sweep_keeps_every_batch_inside_the_rcp_table():
    plan = _plan(LLAMA8, "dgx-h100")
    table = [b for b, _ in planner._table_points(plan)]
    points = planner.sweep_points(plan, 8, 16)
    assert points and all(min(table) <= b <= max(table) for _, b in points), (points, table)
    assert (8, 16) in points


def test_mfu_counts_useful_flops_and_a_compiled_count_is_its_own_figure(tmp_path):
    base = _plan(LLAMA8, "dgx-h100")
    path = tmp_path / "cost.json"
    compiled = dataclasses.replace(base.cost, train_flops_per_sample=1.36 * base.cost.train_flops_per_sample)
    path.write_text(json.dumps(compiled.to_dict()))
    plan = planner.build(LLAMA8, [], "dgx-h100", [], None, str(path), False)
    p, q = plan.at(8, 16), base.at(8, 16)
    assert p.step.compute == pytest.approx(1.36 * q.step.compute)
    assert p.model_flops_per_s == pytest.approx(base.cost.train_flops_per_sample * 16 / p.step.total)
    assert p.compiled_flops_per_s == pytest.approx(1.36 * p.model_flops_per_s) and q.compiled_flops_per_s == 0
    text = "\n".join(planner.format_projection(plan, p))
    assert "compiled FLOP/s" in text and "1.36x the useful FLOPs), not MFU" in text


def test_the_projection_names_its_precision_and_uses_that_peak():
    bf16, fp8 = _plan(LLAMA8, "b200"), _plan(LLAMA8, "b200", precision="fp8")
    assert fp8.system.peak_flops == 2 * bf16.system.peak_flops
    assert fp8.at(8, 16).step.compute == pytest.approx(bf16.at(8, 16).step.compute / 2)
    head = "\n".join(planner.header(fp8))
    assert "dense fp8 peak" in head and "no fp8 yet" in head
    proc = cli_in_process("plan", LLAMA8, "--system", "tpu-v5e", "--chips", "8", "--precision", "fp8")
    assert proc.returncode == 2 and "tpu-v5e states no fp8 peak" in proc.stderr
