"""One replica's train and eval steps compiled under XLA here, at the sizes its config gives.

The real run's devices are not here, so one CPU device stands in for one replica (`standin.py`): it compiles
what the loop compiles on each replica (`CompiledSteps.train_step`, and the eval replica step) at the real
run's per-replica batch, with the real replica count and model-axis size answering every config check. Why not
logical CPU devices: MirroredStrategy over CPUs makes one XLA cluster of all replicas (it compiles per replica
only on GPUs), and a DTensor CPU mesh ignores `jit_compile`, so neither would show what an accelerator
compiles. What this cannot show is said in the report's notes: cross-replica collectives are identities here,
and a replica split over several devices (mesh model axis, TPU spatial partitioning) is compiled whole,
unpartitioned. No data set, checkpoint or MLPerf log is touched.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import tensorflow as tf

from harness import config as config_lib
from harness.dryrun.memory import memory_per_device
from harness.dryrun.report import CompileReport, stage
from harness.dryrun.standin import DevicePlan, StandInRuntime, standin_checked
from harness.dryrun.xla import compile_step
from harness.errors import HarnessError
from harness.plan import mfu
from harness.train.loop import CompiledSteps
from harness.train.preflight import Checked
from harness.train.workload import COUNT, INDEX, MASK


def _with_batch(spec: dict[str, tf.TensorSpec], batch: int) -> dict[str, tf.TensorSpec]:
    for k, s in spec.items():
        if not s.shape.is_fully_defined():
            raise HarnessError(f"input {k!r} has shape {s.shape}: a compiled step needs static shapes")
    return {k: tf.TensorSpec([batch] + s.shape.as_list(), s.dtype, name=k) for k, s in spec.items()}


def eval_replica_fn(steps: CompiledSteps) -> tuple[Callable, str | None]:
    """The eval computation one replica runs: the loop's own when it exposes it, else the smallest
    equivalent (the workload's eval_step plus the example count), said in the second value."""
    own = getattr(steps, "eval_replica_step", None)
    if own is not None:
        return own, None

    def replica(batch: dict[str, tf.Tensor]) -> Any:
        batch = dict(batch)
        mask, index = batch.pop(MASK), batch.pop(INDEX)
        out = dict(steps.workload.eval_step(batch, mask))
        out[COUNT] = tf.reduce_sum(mask)
        out[INDEX] = index
        return out

    return replica, ("eval step: the loop's per-replica eval function is nested in this version, so the "
                     "workload's eval_step plus the mask count is compiled")


def useful_train_flops(cfg: config_lib.Config, per_replica_batch: int) -> float:
    """What the workload's cost module counts as useful for one replica's train step (0: no cost module), so
    the report can show how much more the compiled step does (dense MoE dispatch, padding, recompute)."""
    return mfu.train_flops_per_sample(cfg) * per_replica_batch


def compile_replica(config_path: str, cfg: config_lib.Config, optimize: bool = True,
                    full: config_lib.Config | None = None,
                    checked: tuple[Checked, StandInRuntime, DevicePlan] | None = None) -> CompileReport:
    """Builds the model of `cfg` (loaded from `config_path`) on a stand-in replica at the sizes it gives and
    compiles its steps (`optimize=False`: trace and count only, no XLA HLO passes, so no peak memory).
    `checked`: the run's pre-log checks already made on the stand-in (`standin_checked`); `full`: the config
    a smaller compile stands in for (`Workload.stand_in_for`)."""
    checked, runtime, plan = checked or standin_checked(cfg)
    workload = checked.workload
    if full is not None:
        workload.stand_in_for(full)
    train_spec, eval_spec, data_notes = checked.dry_run_inputs
    own_experts = workload.experts_stay_put() and runtime.hold_own_experts()
    stage(f"building {cfg.workload}" + (f" (stand-in for {full.workload})" if full is not None else ""))
    with runtime.scope():
        workload.build()
    steps = CompiledSteps(runtime, workload)

    gbs = cfg.schedule.global_batch_size
    ebs = cfg.schedule.eval_batch_size or gbs
    per_replica, eval_per_replica = gbs // plan.replicas, ebs // plan.replicas
    train_batch = _with_batch(train_spec, per_replica)
    eval_batch = _with_batch(dict(eval_spec, **{MASK: tf.TensorSpec([], tf.float32),
                                                INDEX: tf.TensorSpec([], tf.int64)}), eval_per_replica)
    stage("compiling the train step" + ("" if optimize else " (trace only)"))
    train = compile_step(steps.train_step, train_batch, cfg.workload, "train", optimize)
    eval_fn, eval_note = eval_replica_fn(steps)
    stage("compiling the eval step" + ("" if optimize else " (trace only)"))
    evaluation = compile_step(eval_fn, eval_batch, cfg.workload, "eval", optimize)

    model_vars = [v for v in runtime.variables() if not v.path.startswith(f"{workload.optimizer.name}/")]
    opt_vars = [v for v in runtime.variables() if v.path.startswith(f"{workload.optimizer.name}/")]

    def per_device(infos: list, fsdp: bool | None = None) -> int:  # the model's variables as laid out
        return int(sum(math.prod(v.shape) * v.variable.dtype.size / runtime.layout_shards(v.dims, v.shape, fsdp)
                       for v in infos))

    def whole(infos: list) -> int:  # what this replica's program holds (its own experts only, where it holds so)
        return int(sum(v.variable.shape.num_elements() * v.variable.dtype.size for v in infos))

    trainable = runtime.variables(trainable=True)
    memory = memory_per_device(
        train.peak_bytes, evaluation.peak_bytes, plan.model_axis,
        state=(whole(model_vars) + whole(opt_vars), per_device(model_vars) + per_device(opt_vars)),
        eval_state=(whole(model_vars), per_device(model_vars)),
        gradients=(whole(trainable), per_device(trainable)))
    notes = list(plan.notes) + [
        "one CPU device compiled one replica's program at its per-replica batch; cross-replica sums "
        "(gradients, loss counts, batch-norm groups) are identities there, so no collective is compiled",
        "the warm-up's copy of the initial state is kept in host memory, not on the devices"]
    if own_experts:
        n = runtime.local_experts
        notes.append(f"expert parallelism {n}: the device holds its own 1/{n} of each layer's experts (weights, "
                     f"gradients, optimizer state) and runs them on the slots every device sends it; the "
                     f"all-to-all there and back is a local transpose of its own slots (same shapes and work, "
                     f"its own tokens standing in for the other devices'), so no traffic is compiled")
    if plan.model_axis > 1:
        notes.append(f"each replica spans {plan.model_axis} devices: FLOPs are the whole replica's (work the "
                     f"devices repeat is counted once); bytes of weights, optimizer state and gradients per "
                     f"device divide each variable by its layout; activations are an estimate (memory source)")
    fsdp: dict[str, int] = {}
    if runtime.fsdp:
        data = runtime.sizes[runtime.rules["batch"]]
        everything = model_vars + opt_vars + trainable  # state, then gradients (split as their variables)
        fsdp = dict(fsdp_data_axis=data,
                    fsdp_saved_bytes_per_device=per_device(everything, False) - per_device(everything),
                    fsdp_replicated_bytes=int(sum(
                        math.prod(v.shape) * v.variable.dtype.size for v in model_vars + opt_vars
                        if runtime.layout_shards(v.dims, v.shape, True)
                        == runtime.layout_shards(v.dims, None, False)
                        and runtime.rules["batch"] not in runtime.mesh_dims_used(v.dims))))
        kept = ("kept for the backward pass, or gathered again in a recomputed layer (model.remat)"
                if getattr(workload.cfg.model, "remat", False) else "kept for the backward pass")
        notes.append(f"FSDP: weights, optimizer state and gradients per device are split over data={data} as "
                     f"the mesh runtime lays them out; each weight is also gathered whole where it is used "
                     f"(an all-gather per weight per step, {kept}), which this compile of whole variables does "
                     f"not show apart")
    notes += data_notes + ([eval_note] if eval_note else []) + (workload.dry_run_notes() if full is None else [])
    if workload.cfg.schedule.gradient_accumulation_steps > 1:
        notes.append(f"train step: {workload.cfg.schedule.gradient_accumulation_steps} accumulated micro-batches")
    return CompileReport(
        workload=cfg.workload, config=config_path, replicas=plan.replicas, model_axis=plan.model_axis,
        per_replica_batch=per_replica, global_batch=gbs, eval_per_replica_batch=eval_per_replica,
        params=int(sum(math.prod(v.shape) for v in trainable)),
        replica_params=int(sum(v.variable.shape.num_elements() for v in trainable)),
        train_flops_per_replica_step=train.flops, eval_flops_per_replica_step=evaluation.flops,
        useful_train_flops_per_replica_step=useful_train_flops(cfg, per_replica),
        flops_source="counted (from the HLO module TensorFlow gives XLA: dot/convolution 2 per multiply-add, "
                     "elementwise 1 per element, while-loop bodies once; XLA's HloCostAnalysis is not exposed "
                     "by TensorFlow's Python API)",
        weight_bytes_per_device=per_device(model_vars), optimizer_bytes_per_device=per_device(opt_vars),
        gradient_bytes=whole(trainable), gradient_bytes_per_device=per_device(trainable),
        activation_bytes_per_device=memory.activations, peak_bytes_per_device=memory.peak,
        eval_peak_bytes_per_device=memory.eval_peak, memory_source=memory.source,
        compile_seconds={"train": round(train.seconds, 2), "eval": round(evaluation.seconds, 2)},
        runtime_kind=cfg.runtime.kind, precision=cfg.runtime.precision, stand_in=notes, **fsdp,
        traced={"train": train.traced, "eval": evaluation.traced})
