"""Workloads, small, in one process with 2 logical CPUs: the steps every per-workload step test reads.

- `one` / `two`: two train steps and an eval on one device and on 2 mirrored replicas (the workload
  contract, tests/test_workload_contract.py);
- `xla_*`: the per-replica train and eval steps under XLA against the plain ones from the same weights,
  then a `bfloat16` run of the same steps, with mode `float16` a `float16` (dynamic loss scaling) run too,
  and with `overflow` the float16 steps again from a loss scale that overflows (tests/test_xla_precision.py);
- `mesh_draws` (flux1 only): its training draws on a 2-device DTensor mesh, a rerun and one device
  (tests/helpers/flux1_mesh_draws.py; no model compiled).

With mode `plain` only the one-device plain steps run (the oneDNN-off case: the caller sets
TF_ENABLE_ONEDNN_OPTS, which TensorFlow reads at start-up). Every RESULT says whether oneDNN was on.

Several workloads run in one process, one after another (one TensorFlow start for all of them): the 2
logical CPUs are set once, before TensorFlow starts, and every workload's mirrored contract runs on them.
Prints one `RESULT <name> <json>` line per workload, or `FAILED <name> <json traceback>` for a workload
that raised (the others still run). Shared through tests/step_cases.py.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402
from tensorflow.python.util import _pywrap_util_port  # noqa: E402

from benchmarks import registry  # noqa: E402
from harness import config as C  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402
from harness.train import loop  # noqa: E402


def build(config: str, overrides: list[str]):
    cfg = C.load_config(config, overrides + ["submission.division=open"])
    rt = make_runtime(cfg.runtime)
    wl = registry.get(cfg.workload)(cfg, rt)
    wl.validate()
    with rt.scope():
        wl.build()
    return cfg, rt, wl


def train(steps: loop.CompiledSteps, cfg, n: int) -> list[float]:
    it = iter(loop.train_input(steps.runtime, steps.workload, cfg.schedule.global_batch_size, cfg.seed))
    return [float(steps.train_loop(it, tf.constant(1))["loss"]) for _ in range(n)]


def evaluate(steps: loop.CompiledSteps, cfg) -> tuple[float, int]:
    ebs = cfg.schedule.eval_batch_size or cfg.schedule.global_batch_size  # 0: the global batch, as the loop
    metrics, counted = loop.evaluate(steps, loop.eval_input(steps.runtime, steps.workload, ebs, cfg.seed),
                                     loop.eval_steps_for(steps.workload.eval_samples, ebs))
    return float(metrics[steps.workload.METRIC]), counted


def contract_run(cfg, rt, wl, n: int) -> dict:
    steps = loop.CompiledSteps(rt, wl)
    losses = train(steps, cfg, n)
    score, counted = evaluate(steps, cfg)
    return dict(losses=losses, counted=counted, eval_samples=wl.eval_samples, replicas=rt.num_replicas,
                score=score)


def plain_only(config: str, small: list[str], train_steps: int) -> dict:
    cfg, rt, wl = build(config, small + ["runtime.kind=default", "runtime.cpu_devices=0",
                                         "runtime.jit_compile=false"])
    steps = loop.CompiledSteps(rt, wl)
    losses = train(steps, cfg, train_steps)
    return {"plain_losses": losses, "plain_eval": evaluate(steps, cfg)[0]}


def case(config: str, small: list[str], train_steps: int, mode: list[str]) -> dict:
    """One workload's results: `plain` (oneDNN-off runs), else the contract, XLA and bfloat16 steps, with
    `float16` the float16 steps, and with `overflow` (after `float16`) the float16 overflow too."""
    if mode == ["plain"]:
        out = plain_only(config, small, train_steps)
        out["onednn"] = bool(_pywrap_util_port.IsMklEnabled())
        return out
    out: dict = {"onednn": bool(_pywrap_util_port.IsMklEnabled())}
    # The contract: 2 mirrored replicas (first, while the logical devices can still be set), then one device.
    cfg, rt, wl = build(config, small + ["runtime.kind=mirrored", "runtime.cpu_devices=2",
                                         "runtime.jit_compile=false"])
    out["two"] = contract_run(cfg, rt, wl, train_steps)
    if cfg.workload == "flux1":
        import flux1_mesh_draws  # tests/helpers, this script's directory

        out["mesh_draws"] = flux1_mesh_draws.mesh_draws(config, small)

    # float32, one device, the same weights: plain steps (the contract's one-device run), then XLA's.
    cfg, rt, wl = build(config, small + ["runtime.kind=default", "runtime.cpu_devices=0",
                                         "runtime.jit_compile=false"])
    init = [v.variable.read_value() for v in rt.variables()]
    plain = loop.CompiledSteps(rt, wl)
    rt.jit_compile = True
    xla = loop.CompiledSteps(rt, wl)
    out["plain_losses"] = train(plain, cfg, train_steps)
    out["plain_eval"], counted = evaluate(plain, cfg)
    out["one"] = dict(losses=out["plain_losses"], counted=counted, eval_samples=wl.eval_samples,
                      replicas=rt.num_replicas, score=out["plain_eval"])
    out["xla_eval_same_weights"], _ = evaluate(xla, cfg)
    for v, value in zip(rt.variables(), init):
        v.variable.assign(value)
    out["xla_losses"] = train(xla, cfg, train_steps)
    # The replica functions the loop runs are tf.functions with jit_compile=True.
    out["xla_compiled"] = all(getattr(f, "_jit_compile", False) for f in (xla._train_replica, xla._eval_replica))

    for precision in ["bfloat16"] + ["float16"] * ("float16" in mode):
        cfg, rt, wl = build(config, small + ["runtime.kind=default", "runtime.cpu_devices=0",
                                             f"runtime.precision={precision}", "runtime.jit_compile=false",
                                             "runtime.loss_scale_growth_steps=1"])
        steps = loop.CompiledSteps(rt, wl)
        losses = train(steps, cfg, train_steps)
        out[precision] = {
            "losses": losses, "eval": evaluate(steps, cfg)[0],
            "variable_dtypes": sorted({v.variable.dtype.name for v in rt.variables() if not v.frozen}),
            "frozen_dtypes": sorted({v.variable.dtype.name for v in rt.variables() if v.frozen}),
            "loss_scale": steps.loss_scale_state(),
            "optimizer_step": int(wl.optimizer.step.numpy()),
        }
    if "overflow" in mode:
        # The float16 steps again (traced once: the scale is a variable), from a loss scale that overflows
        # float16 in the backward pass: every step is skipped, the scale halves. Counts are this run's.
        ls, start = steps.loss_scale, wl.optimizer.step.numpy()
        ls.scale.assign(1e38)
        skipped = ls.skipped.numpy()
        before = [v.variable.numpy() for v in rt.variables(trainable=True)]
        losses = train(steps, cfg, train_steps)
        after = [v.variable.numpy() for v in rt.variables(trainable=True)]
        state = steps.loss_scale_state()
        out["float16_overflow"] = {
            "losses": losses, "loss_scale": dict(state, skipped_steps=state["skipped_steps"] - int(skipped)),
            "optimizer_step": int(wl.optimizer.step.numpy() - start),
            "weights_unchanged": all(np.array_equal(a, b) for a, b in zip(before, after))}
    return out


def main(cases: dict, train_steps: int) -> None:
    """`cases`: workload name -> [smoke config, small overrides, mode]."""
    for name, (config, small, mode) in cases.items():
        try:
            out = case(config, small, train_steps, mode)
        except Exception:  # noqa: BLE001 - reported per workload; the caller's test fails on it
            print(f"FAILED {name} " + json.dumps(traceback.format_exc()), flush=True)
            continue
        print(f"RESULT {name} " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]))
