"""`plan`'s systems of the current round: every file loads, peaks per precision, an NVL72 rack's 72-GPU NVLink
domain, the all-to-all's two tiers, the device names a run's MFU line matches. No TensorFlow."""
from __future__ import annotations

import dataclasses

import pytest

from harness.errors import HarnessError
from harness.plan import collectives
from harness.plan.mfu import device_peak
from harness.plan.system import available, load_system

pytestmark = pytest.mark.quick

CURRENT = ("h200", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "mi300x", "mi325x", "mi355x", "tpu-v5e",
           "tpu-v6e", "tpu7x")


def test_the_current_round_s_systems_load_with_fp8_where_the_chip_has_it():
    assert set(CURRENT) <= set(available())
    for name in CURRENT:
        s = load_system(name)
        assert s.peak("bf16") == s.peak_flops > 1e14 and s.hbm_bytes > 1e10 and s.domain >= s.chips_per_host
        if name == "tpu-v5e":  # bf16 and int8 only
            with pytest.raises(HarnessError, match="no fp8 peak"):
                s.peak("fp8")
        else:
            assert s.peak("fp8") >= s.peak("bf16")
    assert load_system("gb200-nvl72").peak("fp8") == 2 * load_system("gb200-nvl72").peak("bf16")
    with pytest.raises(HarnessError, match="bf16 or fp8"):
        load_system("h200").peak("fp4")


def test_an_nvl72_rack_is_one_nvlink_domain_of_72_gpus():
    rack, node = load_system("gb200-nvl72"), dataclasses.replace(load_system("gb200-nvl72"), scaleup_chips=4)
    assert rack.chips_per_host == 4 and rack.domain == 72
    gb = 1e9
    # 72 GPUs: all over NVLink in the rack; with 4-GPU domains the same all-reduce crosses the NICs
    assert collectives.allreduce_seconds(rack, gb, 72) < collectives.allreduce_seconds(node, gb, 72) / 4
    # 512 GPUs of 72-GPU racks: 8 groups of 64 (the largest divisor that fits a rack)
    assert collectives.domain_group(rack, 512) == 64
    assert "64-GPU scale-up group" in collectives.describe(rack, 512)


def test_all_to_all_is_bounded_by_the_slower_tier():
    rack = load_system("gb200-nvl72")
    gb = 1e9
    inside = collectives.alltoall_seconds(rack, gb, 64)
    assert inside == pytest.approx(63 / 64 * gb / rack.intra_bandwidth + 63 * rack.intra_latency)
    across = collectives.alltoall_seconds(rack, gb, 144)  # half the bytes leave the rack at 50 GB/s
    assert across == pytest.approx(72 / 144 * gb / rack.inter_bandwidth + rack.inter_latency)
    assert collectives.alltoall_seconds(rack, gb, 1) == 0.0
    tpu = load_system("tpu7x")
    assert 0 < collectives.alltoall_seconds(tpu, gb, 64) < collectives.alltoall_seconds(tpu, gb, 4096)


@pytest.mark.parametrize("device,system", [("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"),
                                           ("NVIDIA GB200", "gb200-nvl72"), ("NVIDIA GB300", "gb300-nvl72"),
                                           ("NVIDIA B300 SXM6 AC", "b300"), ("AMD Instinct MI300X", "mi300x"),
                                           ("AMD Instinct MI355X", "mi355x")])
def test_a_run_s_mfu_line_finds_the_current_chips(device, system):
    peak, source = device_peak(0.0, "GPU", device)
    assert source.startswith(f"harness/plan/systems/{system}.yaml") and peak == load_system(system).peak_flops


def _validate_plan():
    import importlib.util
    import os
    import sys

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("validate_plan", os.path.join(REPO, "scripts", "validate_plan.py"))
    vp = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = vp
    spec.loader.exec_module(vp)
    return vp


def test_the_v5_llm_rows_are_projected_within_the_goal():
    vp = _validate_plan()
    rows = vp.v5_rows()
    tyche = rows[("NVIDIA", "tyche_ngpu72_ngc25.04_nemo")]  # the public olympic mean of 10 runs
    assert int(tyche["chips"]) == 72 and int(tyche["global_batch"]) == 9 and float(tyche["olympic_minutes"]) == \
        pytest.approx(1.66, abs=0.01)
    assert vp.v5_layout("tyche_ngpu72_ngc25.04_nemo", 72, 9) == (1, 8) and vp.v5_layout("x", 36, 9) == (1, 4)
    results, skipped = vp.validate_v5()
    assert not skipped and len(results) >= 10
    ratios = sorted(abs(r["ratio"] - 1) for r in results)
    assert ratios[len(ratios) // 2] <= 0.10 and all(1 / 1.5 <= r["ratio"] <= 1.5 for r in results)
    # no scored family is one a fixed per-step cost came from
    held = {(s, n) for s, _, names in vp.V5_HELD_OUT for n in names}
    assert not held & {(s, n) for s, _, names in vp.V5_FAMILIES for n in names}
