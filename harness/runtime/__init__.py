"""Picks the runtime a config asks for (see base.Runtime for the interface)."""
from __future__ import annotations

from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.runtime.base import InputContext, Runtime, VariableInfo, check_spatial_partition

__all__ = ["InputContext", "Runtime", "VariableInfo", "make_runtime"]


def make_runtime(cfg: RuntimeConfig, platform: str = "") -> Runtime:
    """The runtime `cfg` asks for; `platform` (submission.platform) lets a TPU found on this host alone be
    refused when the config declares a larger slice."""
    from harness.runtime import distribute

    # Before any device is touched, so a refused split costs nothing and no run directory exists yet.
    spatial = check_spatial_partition(cfg.spatial_partition, cfg.kind)
    if cfg.kind == "default":
        if cfg.cpu_devices > 1:
            raise HarnessError("runtime.cpu_devices > 1 needs runtime.kind=mirrored (or mesh)")
        return distribute.make_default(cfg.precision, cfg.jit_compile)
    if cfg.kind == "mirrored":
        return distribute.make_mirrored(cfg.cpu_devices, cfg.gpus, cfg.precision, cfg.jit_compile)
    if cfg.kind == "multi_worker":
        return distribute.make_multi_worker(cfg.precision, cfg.jit_compile, cfg.collective_timeout_s,
                                            cfg.cpu_devices, cfg.slurm_port_base)
    if cfg.kind == "tpu":
        return distribute.make_tpu(cfg.tpu, cfg.tpu_timeout_s, cfg.precision, cfg.jit_compile, spatial,
                                   platform)
    if cfg.kind == "mesh":
        try:
            from harness.runtime import mesh
        except ImportError as e:
            raise HarnessError(f"runtime.kind=mesh is not available: {e}") from None
        runtime = mesh.make_mesh(cfg)
        if runtime.device_type == "GPU":
            import tensorflow as tf

            distribute.warn_bfloat16_without_math(cfg.precision, tf.config.list_physical_devices("GPU"))
        return runtime
    raise HarnessError(f"unknown runtime.kind {cfg.kind!r}")
