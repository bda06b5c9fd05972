"""A run's MFU line (harness/plan/mfu.py): the device's peak from the system files as plan's strict loader
reads them, and the summary fields and line built from it. No TensorFlow: the device name is given."""
from __future__ import annotations

import types

import pytest

from harness.plan import mfu
from harness.plan import system as systems

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("kind, name, peak, source", [
    ("GPU", "NVIDIA A100-SXM4-40GB", 312e12, "harness/plan/systems/dgx-a100.yaml (NVIDIA A100-SXM4-40GB)"),
    ("GPU", "NVIDIA H100 80GB HBM3", 989e12, "harness/plan/systems/dgx-h100.yaml (NVIDIA H100 80GB HBM3)"),
    # TPU v3: TensorFlow sees each of a chip's two cores as a device; v4: one device a chip (megacore).
    ("TPU", "tpu-v3-32", 123e12 / 2, "harness/plan/systems/tpu-v3.yaml (tpu-v3-32)"),
    ("TPU", "tpu-v4-16", 275e12, "harness/plan/systems/tpu-v4.yaml (tpu-v4-16)"),
])
def test_the_peak_comes_from_the_system_file_naming_the_device(kind, name, peak, source):
    assert mfu.device_peak(0.0, kind, name) == (pytest.approx(peak), source)


def test_a_configured_peak_wins_and_unknown_devices_say_why():
    assert mfu.device_peak(0.5, "CPU", "") == (0.5e12, "runtime.peak_tflops")
    assert mfu.device_peak(0.0, "CPU", "") == (0.0, "no peak known for CPU devices (set runtime.peak_tflops)")
    peak, why = mfu.device_peak(0.0, "GPU", "Some Other GPU")
    assert peak == 0.0 and why.startswith("no system file's device_match names 'Some Other GPU'")


def test_system_files_are_read_by_the_strict_loader(tmp_path, monkeypatch):
    """A system file the planner would refuse leaves the MFU unknown with the loader's reason; the run's
    result stands."""
    (tmp_path / "broken.yaml").write_text("name: broken\nkind: gpu\npeak_flops: lots\ndevice_match: A100\n")
    monkeypatch.setattr(systems, "SYSTEMS_DIR", str(tmp_path))
    peak, why = mfu.device_peak(0.0, "GPU", "NVIDIA A100-SXM4-40GB")
    assert peak == 0.0 and "system file" in why and "broken.yaml" in why and "missing" in why


def test_model_flops_and_the_line(monkeypatch):
    monkeypatch.setattr(mfu, "train_flops_per_sample", lambda cfg: 2e9)
    cfg = types.SimpleNamespace(workload="toy", runtime=types.SimpleNamespace(peak_tflops=1.0))
    out = mfu.model_flops(cfg, samples_per_s=100.0, devices=4, device_type="CPU", device_name="")
    assert out["model_flops_per_s"] == pytest.approx(2e11) and out["peak_flops_per_s"] == pytest.approx(4e12)
    assert out["mfu"] == pytest.approx(0.05) and out["mfu_devices"] == 4
    summary = dict(out, workload="toy", train_samples_per_s=100.0)
    assert mfu.mfu_line(summary, synthetic=True) == (
        "model FLOP/s: 0.2 TFLOP/s (2 GFLOP per sample x 100 train samples/s, synthetic data); "
        "MFU 5.00% of 4 x 1 TFLOP/s [runtime.peak_tflops]")
    cfg.runtime.peak_tflops = 0.0
    unknown = dict(mfu.model_flops(cfg, 100.0, 4, "CPU", ""), workload="toy", train_samples_per_s=100.0)
    assert unknown["mfu"] is None
    assert mfu.mfu_line(unknown, synthetic=False).endswith("; MFU not known: no peak known for CPU devices "
                                                           "(set runtime.peak_tflops)")
    monkeypatch.setattr(mfu, "train_flops_per_sample", lambda cfg: 0.0)
    none = dict(mfu.model_flops(cfg, 100.0, 4, "CPU", ""), workload="toy", train_samples_per_s=100.0)
    assert mfu.mfu_line(none, synthetic=False) == "model FLOP/s: not known (toy has no cost module)"
