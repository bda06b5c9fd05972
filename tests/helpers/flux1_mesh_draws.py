"""flux1's training draws on a DTensor mesh of 2 data-parallel CPU devices against one device's, for the
step case's process (tests/helpers/step_case.py, which has set 2 logical CPUs): no model is built or
compiled, only the input pipeline and the workload's `draws` (benchmarks/flux1/workload.py) run.

Returns, for the first two steps' global batches: each sample's slot and the first normals of its noise and
VAE sample and its t, on the mesh per data-parallel replica (the device shards, in mesh order), the mesh
again from a fresh pipeline (a rerun), and one device (tests/test_workload_contract.py reads them).
"""
from __future__ import annotations

import numpy as np
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf
from tensorflow.experimental import dtensor

from benchmarks import registry
from benchmarks.flux1 import flow
from harness import config as C
from harness.runtime import make_runtime
from harness.train import loop

STEPS = 2
ELEMENTS = 8   # normals compared per sample (the first of its latent)


def _draws(rt, wl, cfg, step: int, batch) -> dict[str, tf.Tensor]:
    d = wl.draws(batch, loop.position_seed(cfg.seed, tf.constant(step, tf.int64)))
    shape = [ELEMENTS]
    return {"slot": batch["slot"], "t": d["t"], "noise": flow.normal(d["noise_keys"], shape),
            "vae": flow.normal(d["vae_keys"], shape)}


def _run(config: str, overrides: list[str]) -> list[list[dict[str, list]]]:
    """Per step, per replica (one on one device): the draws as lists."""
    cfg = C.load_config(config, overrides + ["submission.division=open"])
    rt = make_runtime(cfg.runtime)
    wl = registry.get(cfg.workload)(cfg, rt)
    draws = rt.function(lambda step, batch: _draws(rt, wl, cfg, step, batch))
    it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
    out = []
    for step in range(STEPS):
        got = draws(step, next(it))
        shards = {k: dtensor.unpack(v) if dtensor.is_dtensor(v) else [v] for k, v in got.items()}
        replicas = len(shards["slot"])
        out.append([{k: np.asarray(shards[k][r]).tolist() for k in shards} for r in range(replicas)])
    return out


def mesh_draws(config: str, small: list[str]) -> dict:
    mesh = small + ["runtime.kind=mesh", "runtime.cpu_devices=2", "runtime.mesh={data: 2, model: 1}"]
    return {"mesh": _run(config, mesh), "mesh_rerun": _run(config, mesh),
            "one": _run(config, small + ["runtime.kind=default", "runtime.cpu_devices=0"])}
