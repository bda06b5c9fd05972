"""What a `submission.platform` name says about the devices a run has, and the checks that use it.

One place for the parsing that the dry run (device plan), the run's hardware checks and the planner need:
TPU slice names count TensorCores (v2, v3, v4, v5p) or chips (v5e, v6e), and v4/v5p chips are one device
each (megacore), so their devices are half the number in the name; GPU systems are named like `8xgpu`.
No TensorFlow here: the checks take a runtime and read its description only.
"""
from __future__ import annotations

import math
import re
from typing import Any

from harness.errors import HarnessError

_TPU_NAME = re.compile(r"(v2|v3|v4|v5p|v5e|v5litepod|v6e)-(\d+)", re.IGNORECASE)
# The dry run's reading of a GPU count ("8xgpu", "8 x A100-gpu", else any leading "Nx").
GPU_COUNT = re.compile(r"(\d+)\s*x\s*[a-z]*gpu|(\d+)x", re.IGNORECASE)
# The strict reading the closed-division check uses: the name must say GPUs ("8xgpu", "16 x a100gpu").
_GPU_EXPLICIT = re.compile(r"(\d+)\s*x\s*[a-z0-9-]*gpu", re.IGNORECASE)


def tpu_devices(name: str) -> int | None:
    """TensorFlow TPU devices in the slice a name like `tpu-v3-32` or `v4-16` declares (None: not a TPU)."""
    m = _TPU_NAME.search(name or "")
    if not m:
        return None
    generation, n = m.group(1).lower(), int(m.group(2))
    return n // 2 if generation in ("v4", "v5p") else n


# Memory of one device (what TensorFlow sees as one device) by the accelerator a platform name names, for the
# dry run's refusal. H100: the 81,559 MiB (79.6 GiB) nvidia-smi reports for the datasheet's 80 GB HBM3; H200:
# the datasheet's 141 GB HBM3e (nvidia.com/en-us/data-center/h200; what nvidia-smi reports was not sourced, so
# the datasheet's figure, the larger); TPU v5p: 95 GB HBM2e per chip (cloud.google.com/tpu/docs/v5p; one
# device per chip). Other accelerators: not known here (no refusal).
_DEVICE_MEMORY = (("h100", 81559 * 2**20, "H100 80 GB"), ("h200", 141 * 10**9, "H200 141 GB"),
                  ("v5p", 95 * 10**9, "TPU v5p chip (95 GB)"))
_GPU_KEYS = ("h100", "h200")


def device_memory(name: str) -> tuple[int, str] | None:
    """(bytes, what) of one device of the accelerator `submission.platform` names; None where it names none
    the harness knows."""
    low = (name or "").lower()
    for key, size, what in _DEVICE_MEMORY:
        if key in low and (key in _GPU_KEYS or tpu_devices(low)):
            return size, what
    return None


def gpu_count(name: str) -> int | None:
    """GPUs a name states explicitly (`8xgpu`); None where it does not say."""
    m = _GPU_EXPLICIT.search(name or "")
    return int(m.group(1)) if m else None


def platform_devices(name: str) -> tuple[int, str] | None:
    """(devices, 'TPU' or 'GPU') that `submission.platform` declares; None where the name says no count."""
    tpu = tpu_devices(name)
    if tpu:
        return tpu, "TPU"
    gpus = gpu_count(name)
    return (gpus, "GPU") if gpus else None


def devices_used(runtime: Any) -> int:
    """Devices the run computes on: every mesh device, or replicas x devices per replica (spatial split)."""
    if runtime.kind == "mesh" and runtime.sizes:
        return math.prod(runtime.sizes.values())
    return runtime.num_replicas * runtime.spatial_partition_ways


def check_local_tpu_slice(platform: str, local_devices: int) -> None:
    """A TPU reached as this host's ('local', no TPU_NAME or address) must not be smaller than the slice
    `submission.platform` declares: on one host of a pod that would train on that host's cores alone."""
    declared = tpu_devices(platform)
    if declared and declared > local_devices:
        raise HarnessError(
            f"submission.platform={platform} declares {declared} TPU devices, but with runtime.tpu='' and no "
            f"TPU_NAME this run would use this host's {local_devices} only; set runtime.tpu (or TPU_NAME) to "
            f"the slice's name, or name the platform you run on")


def check_platform_matches(runtime: Any, platform: str, division: str, allow_mismatch: bool) -> None:
    """Closed division: the devices the run uses must be the ones `submission.platform` declares (the
    system a result is filed under). `runtime.allow_platform_mismatch: true` lets experiments through."""
    declared = platform_devices(platform)
    if division != "closed" or declared is None or allow_mismatch:
        return
    count, kind = declared
    used = devices_used(runtime)
    if used != count or runtime.device_type != kind:
        raise HarnessError(
            f"submission.platform={platform} declares {count} {kind}(s) but this run has {used} "
            f"{runtime.device_type} device(s) ({runtime.description}); in the closed division the result "
            f"would be filed under the wrong system: name the platform you run on, or set "
            f"runtime.allow_platform_mismatch=true for an experiment")
