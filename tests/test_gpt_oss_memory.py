"""XLA's memory plan of gpt_oss_20b's whole train step (gpu-8x-h100.yaml at a tiny width: remat, chunked
expert blocks, two accumulated micro-batches): the expert weight gradients' float32 sums are made one chunk at a
time, not one buffer per chunk x layer x micro-batch live at once.

That was the 2,588 GiB of train activations the config's dry run estimated: each chunk's weight gradient was a
scatter (unsorted_segment_sum) into a zero-filled [experts, m, h] buffer that depends on nothing, and XLA's
scheduler made all of them at the start of the step (docs/workloads/gpt_oss_20b.md, memory). Only the whole
step shows it: XLA's plan of `expert_blocks` alone schedules them late. One compile, about 30 s of CPU."""
from __future__ import annotations

import os

import tensorflow as tf
from tensorflow.compiler.xla import xla_data_pb2

from harness import config as config_lib
from harness.dryrun import standin, xla
from harness.dryrun.compile import _with_batch
from harness.train.loop import CompiledSteps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERTS, HIDDEN, EXPERT_HIDDEN, LAYERS, CHUNK = 8, 16, 64, 1, 6
# 23 blocks of 8 rows per row (128 assignments), 4 chunks (of 6 blocks: a chunk's weight copies [6, m, h] are
# not shaped as the experts' [8, m, h]) per layer.
TINY = ["submission.division=open", "data.seq_length=64", "model.vocab_size=64", f"model.hidden_size={HIDDEN}",
        f"model.num_layers={LAYERS}", "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=8",
        f"model.num_experts={EXPERTS}", "model.experts_per_token=2", "model.moe_group_size=64",
        "model.moe_block_size=8", f"model.moe_chunk_blocks={CHUNK}", f"model.expert_hidden={EXPERT_HIDDEN}",
        "model.sliding_window=16", "model.attention_block=16"]


def _train_plan() -> tuple[object, config_lib.Config]:
    """XLA's optimized module and buffer assignment of the config's train step (as the dry run compiles it)."""
    cfg = config_lib.load_config(os.path.join(REPO, "configs", "gpt_oss_20b", "gpu-8x-h100.yaml"), TINY)
    checked, runtime, plan = standin.standin_checked(cfg)  # the run's pre-log checks, as the dry run makes them
    workload, (train_spec, _, _) = checked.workload, checked.dry_run_inputs
    with runtime.scope():
        workload.build()
    steps = CompiledSteps(runtime, workload)
    specs = _with_batch(train_spec, cfg.schedule.global_batch_size // plan.replicas)
    flat = tf.nest.flatten(specs)
    fn = tf.function(lambda *t: steps.train_step(tf.nest.pack_sequence_as(specs, list(t))), jit_compile=True)
    ir = fn.experimental_get_compiler_ir(*flat)
    return xla._hlo_pb2().HloProto.FromString(ir(stage="optimized_hlo_proto_serialized")), cfg


def _expert_shaped_live_at_peak(proto) -> int:
    """float32 buffers shaped as one layer's expert weights ([experts, m, h] or [experts, h, m]) live at the peak
    of the plan's temporaries (a replay of XLA's heap simulator trace)."""
    f32 = xla_data_pb2.F32
    shapes = {(f32, EXPERTS, HIDDEN, EXPERT_HIDDEN), (f32, EXPERTS, EXPERT_HIDDEN, HIDDEN)}
    shape_of = {i.name: (i.shape.element_type, *i.shape.dimensions)
                for c in proto.hlo_module.computations for i in c.instructions}
    sizes = {b.id: b.size for b in proto.buffer_assignment.logical_buffers}
    at_peak = 0
    for trace in proto.buffer_assignment.heap_simulator_traces:
        live, total, peak = {}, 0, -1
        for event in trace.events:
            if event.kind == event.ALLOC:
                live[event.buffer_id] = event.instruction_name
                total += sizes[event.buffer_id]
                if total > peak:
                    peak = total
                    count = sum(shape_of.get(name) in shapes for name in live.values())
            elif event.kind == event.FREE and event.buffer_id in live:
                del live[event.buffer_id]
                total -= sizes[event.buffer_id]
        at_peak = max(at_peak, count if peak >= 0 else 0)
    return at_peak


def test_expert_weight_gradients_are_not_one_buffer_per_chunk_layer_and_micro_batch():
    proto, cfg = _train_plan()
    micro = cfg.schedule.gradient_accumulation_steps
    chunks = -(-((64 * 2 + EXPERTS * 7) // 8) // CHUNK)
    assert (micro, chunks, cfg.model.remat) == (2, 4, True)
    live = _expert_shaped_live_at_peak(proto)
    # At most a micro-batch's gradients of the three expert weights, their sum over the micro-batches and a
    # chunk's part (6 here). The scatter kept one per chunk x layer x micro-batch: 3 x 4 x 1 x 2 = 24.
    assert 0 < live <= 3 * (micro + 1) < 3 * chunks * LAYERS * micro, live
