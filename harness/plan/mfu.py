"""A finished run's model FLOP/s and MFU, in the units `plan` projects them in.

Model FLOP/s is the workload's cost module's useful train FLOPs a sample times the train samples a second
(what MaxText and torchtitan print); MFU divides it by the devices' peak: `runtime.peak_tflops` where set,
else the peak of the system file (systems/*.yaml, read by `system.load_system`) whose `device_match` names
the device. No TensorFlow here: the run passes the device's name. The run path imports this module alone
from plan/, and it imports nothing from train/.
"""
from __future__ import annotations

import re
from typing import Any

from harness.errors import HarnessError
from harness.plan import system as systems


def train_flops_per_sample(cfg: Any) -> float:
    """The useful FLOPs of training on one sample (benchmarks/<name>/cost.py); 0 without a cost module."""
    declared = cfg.cost_model
    return 0.0 if declared is None else declared.model_cost(cfg).train_flops_per_sample


def device_peak(peak_tflops: float, device_type: str, device_name: str) -> tuple[float, str]:
    """(peak FLOP/s of one device, where it comes from): `peak_tflops` (runtime.peak_tflops) when set, else
    the system file whose device_match names `device_name` (a GPU's name, a TPU's submission.platform);
    (0, why) when none does."""
    if peak_tflops:
        return peak_tflops * 1e12, "runtime.peak_tflops"
    if device_type not in ("GPU", "TPU"):
        return 0.0, f"no peak known for {device_type} devices (set runtime.peak_tflops)"
    for name in systems.available():
        try:
            system = systems.load_system(name)
        except HarnessError as e:  # the run's result stands; only its MFU is unknown
            return 0.0, f"{e} (set runtime.peak_tflops)"
        if system.device_match and device_name and re.search(system.device_match, device_name, re.IGNORECASE):
            # TPU v2/v3: TensorFlow sees each core as a device; v4 and later one device a chip (megacore)
            cores = system.cores_per_chip if re.search(r"v[23]\b|v[23]-", device_name) else 1
            return system.peak_flops / cores, f"harness/plan/systems/{name}.yaml ({device_name})"
    return 0.0, f"no system file's device_match names {device_name or device_type!r} (set runtime.peak_tflops)"


def model_flops(cfg: Any, samples_per_s: float, devices: int, device_type: str,
                device_name: str) -> dict[str, Any]:
    """The summary's model FLOP/s and MFU fields for a run of `devices` devices at `samples_per_s`."""
    per_sample = train_flops_per_sample(cfg)
    out: dict[str, Any] = {"model_flops_per_sample": per_sample,
                           "model_flops_per_s": per_sample * samples_per_s if per_sample else None}
    peak, source = device_peak(cfg.runtime.peak_tflops, device_type, device_name)
    out["peak_flops_per_s"] = peak * devices if peak else None
    out["peak_source"] = source
    out["mfu"] = (out["model_flops_per_s"] / out["peak_flops_per_s"]
                  if out["model_flops_per_s"] and out["peak_flops_per_s"] else None)
    out["mfu_devices"] = devices
    return out


def mfu_line(summary: dict[str, Any], synthetic: bool) -> str:
    """The run's closing line on model FLOP/s and MFU, from the summary's fields."""
    flops = summary.get("model_flops_per_s")
    if not flops:
        return f"model FLOP/s: not known ({summary['workload']} has no cost module)"
    line = (f"model FLOP/s: {flops / 1e12:.4g} TFLOP/s ({summary['model_flops_per_sample'] / 1e9:.4g} GFLOP per "
            f"sample x {summary['train_samples_per_s']:g} train samples/s"
            + (", synthetic data" if synthetic else "") + ")")
    if summary.get("mfu") is not None:
        return line + (f"; MFU {100 * summary['mfu']:.2f}% of {summary['mfu_devices']} x "
                       f"{summary['peak_flops_per_s'] / summary['mfu_devices'] / 1e12:g} TFLOP/s "
                       f"[{summary['peak_source']}]")
    return line + f"; MFU not known: {summary['peak_source']}"
