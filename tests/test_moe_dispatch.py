"""gpt_oss's MoE dispatches (benchmarks/gpt_oss_20b/moe.py): the sorted block dispatch (and the alltoall one on
one device) computes what the dense one-hot dispatch computes (one layer's output and its gradients, dropless
and with capacity dropping), its static block layout holds every assignment exactly once, and its compiled
work is bounded by the assignments plus experts x block rows, not experts x group."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.gpt_oss_20b import moe
from benchmarks.gpt_oss_20b.config import ModelConfig
from harness.config import RuntimeConfig
from harness.runtime import make_runtime
from harness.dryrun import xla


# gpt-oss's expert options (benchmarks/lm/ffn.py Glu, biases): a limit the activations reach
GPT_OSS = dict(router_bias=True, expert_bias=True, swiglu_alpha=1.702, swiglu_limit=0.5, swiglu_up_offset=1.0)


def _layer(dispatch: str, capacity_factor: float, block: int = 4, experts: int = 8, k: int = 2, **options):
    cfg = ModelConfig(hidden_size=16, num_experts=experts, experts_per_token=k, expert_hidden=12,
                      moe_group_size=16, capacity_factor=capacity_factor, moe_dispatch=dispatch,
                      moe_block_size=block, init_stddev=0.3, **options)
    runtime = make_runtime(RuntimeConfig())
    with runtime.scope():
        layer = moe.MoE(runtime, "moe", 7, cfg)
    for n, v in enumerate(_biases(layer)):  # away from their zero init
        v.assign(tf.random.stateless_normal(v.shape, [n, 9]))
    return layer


def _biases(layer) -> list:
    return [v for v in (layer.router_bias, layer.b_gate, layer.b_up, layer.b_down) if v is not None]


def _forward_and_gradients(layer, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y, r = layer(x)
        loss = tf.reduce_sum(y * tf.sin(tf.range(y.shape[-1], dtype=tf.float32)))
    variables = [layer.router, layer.w_gate, layer.w_up, layer.w_down] + _biases(layer)
    grads = tape.gradient(loss, [x] + variables)
    return y.numpy(), r.dropped.numpy(), [g.numpy() for g in grads]


@pytest.mark.parametrize("capacity_factor, options", [(0.0, {}), (0.5, {}), (1.0, {}), (0.0, GPT_OSS),
                                                      (0.5, GPT_OSS)])
def test_sorted_dispatch_equals_dense_dispatch_forward_and_gradients(capacity_factor, options):
    """The sorted dispatch's own gradient (expert_blocks) against autodiff of the dense one, biases and the
    clamped GLU included."""
    x = tf.random.stateless_normal([3, 32, 16], seed=[1, 2])
    y_dense, dropped_dense, g_dense = _forward_and_gradients(_layer("dense", capacity_factor, **options), x)
    y_sorted, dropped_sorted, g_sorted = _forward_and_gradients(_layer("sorted", capacity_factor, **options), x)
    np.testing.assert_allclose(y_sorted, y_dense, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dropped_sorted, dropped_dense)
    assert (dropped_dense.sum() > 0) == (capacity_factor > 0)  # capacity really drops; dropless does not
    assert len(g_sorted) == len(g_dense) == 5 + 4 * bool(options)
    for gs, gd in zip(g_sorted, g_dense):
        assert np.abs(gd).max() > 0
        np.testing.assert_allclose(gs, gd, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("capacity_factor", [0.0, 0.5])
def test_alltoall_dispatch_equals_dense_dispatch_with_gpt_oss_options(capacity_factor):
    """The alltoall dispatch's slot buffer on one device (tests/test_moe_alltoall.py: on a mesh, against the
    sorted one), with the expert biases on its slots and the clamped GLU."""
    x = tf.random.stateless_normal([3, 32, 16], seed=[1, 2])
    y_dense, dropped_dense, g_dense = _forward_and_gradients(_layer("dense", capacity_factor, **GPT_OSS), x)
    y_a2a, dropped_a2a, g_a2a = _forward_and_gradients(_layer("alltoall", capacity_factor, **GPT_OSS), x)
    np.testing.assert_allclose(y_a2a, y_dense, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dropped_a2a, dropped_dense)
    assert (dropped_dense.sum() > 0) == (capacity_factor > 0)
    for ga, gd in zip(g_a2a, g_dense):
        assert np.abs(gd).max() > 0
        np.testing.assert_allclose(ga, gd, rtol=1e-4, atol=1e-6)


def test_sorted_blocks_hold_every_kept_assignment_once_in_expert_order():
    rng = np.random.default_rng(0)
    experts, block, a = 5, 4, 40
    expert = rng.integers(0, experts + 1, size=(3, a)).astype(np.int32)  # experts = dropped
    expert[1] = 2                                                         # one row: everything to one expert
    lay = moe.sort_blocks(tf.constant(expert), experts, block)
    assert lay.blocks == (a + experts * (block - 1)) // block
    src, dest, owner = lay.row_source.numpy(), lay.destination.numpy(), lay.block_expert.numpy()
    rows = lay.blocks * block
    for row in range(3):
        kept = np.flatnonzero(expert[row] < experts)
        real = src[row][src[row] < a]
        assert sorted(real) == sorted(kept)                               # each kept assignment once
        for j in kept:
            d = dest[row, j]
            assert src[row, d] == j and owner[row, d // block] == expert[row, j]
        assert (dest[row][expert[row] == experts] == rows).all()          # dropped: the zero row
        # expert-major, assignment order within an expert (the priority order among equals)
        order = [(expert[row, j], j) for j in real]
        assert order == sorted(order)


def test_sorted_dispatch_compiles_to_at_most_assignments_plus_blocks_of_expert_work():
    """XLA's own HLO: the expert matmuls of the sorted dispatch cover blocks x block rows (at most the
    assignments + experts x block), where the dense dropless dispatch covers experts x group rows."""
    x = tf.random.stateless_normal([2, 64, 16], seed=[3, 4])

    def expert_dot_flops(dispatch):
        layer = _layer(dispatch, 0.0, block=8, experts=8, k=2)
        fn = tf.function(lambda t: layer(t)[0], jit_compile=True)
        module = xla._hlo_pb2().HloModuleProto.FromString(
            fn.experimental_get_compiler_ir(x)(stage="hlo_serialized"))
        return xla.count_flops(module)

    useful = 2 * 64 * 2 * 3 * 16 * 12 * 2          # rows x tokens x k x (gate, up, down) x m x h x 2
    rows = 2 * ((64 * 2 + 8 * 7) // 8) * 8          # the static block buffer
    sorted_flops, dense_flops = expert_dot_flops("sorted"), expert_dot_flops("dense")
    assert sorted_flops < 1.6 * useful * rows / (2 * 64 * 2)
    assert dense_flops > 3 * sorted_flops


def test_the_smoke_models_train_steps_are_the_same_under_every_dispatch():
    """One layer of the smoke model, short rows, capacity factor 0.5: three train steps (the later ones after
    updates from the earlier gradients) give the same losses under each dispatch, and the eval's `dropped` the
    same. Dropless (capacity factor 0) the layer's forward and gradients equal the dense dispatch's
    (test_sorted_dispatch_equals_dense_dispatch_forward_and_gradients, test_alltoall_dispatch_equals_...)."""
    import os

    from conftest import REPO
    from tests.helpers.step_case import build
    from harness.train import loop

    def run(dispatch):
        cfg, rt, wl = build(os.path.join(REPO, "configs", "gpt_oss_20b", "smoke.yaml"), [
            "model.num_layers=1", "data.seq_length=256", "data.synthetic_train_rows=8", "data.eval_samples=2",
            "model.capacity_factor=0.5", f"model.moe_dispatch={dispatch}", "model.moe_chunk_blocks=4"])
        steps = loop.CompiledSteps(rt, wl)
        it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
        losses = [float(steps.train_loop(it, tf.constant(1))["loss"]) for _ in range(3)]
        batch = next(iter(loop.train_input(rt, wl, 2, 0)))
        _, routings = wl.model(batch["tokens"][:, :-1])
        return losses, sum(float(tf.reduce_sum(r.dropped)) for r in routings)

    (sorted_losses, sorted_dropped), (dense_losses, dense_dropped) = run("sorted"), run("dense")
    np.testing.assert_allclose(sorted_losses, dense_losses, rtol=1e-5)
    assert sorted_dropped == dense_dropped and sorted_dropped > 0
    a2a_losses, a2a_dropped = run("alltoall")
    np.testing.assert_allclose(a2a_losses, dense_losses, rtol=1e-5)
    assert a2a_dropped == dense_dropped


def _expert_blocks_case(b=2, blocks=12, block=4, m=8, h=64, experts=5):
    xs = tf.random.stateless_normal([b, blocks, block, m], seed=[5, 6])
    index = tf.random.stateless_uniform([b, blocks], [7, 8], maxval=experts, dtype=tf.int32)
    ws = [tf.random.stateless_normal(shape, seed=[9, n]) for n, shape in
          enumerate(([experts, m, h], [experts, m, h], [experts, h, m]))]
    return xs, index, ws


def _expert_blocks_grads(xs, index, ws, chunk):
    with tf.GradientTape() as tape:
        tape.watch([xs] + ws)
        ys = moe.expert_blocks(xs, index, *ws, chunk=chunk)
        loss = tf.reduce_sum(ys * tf.sin(tf.range(ys.shape[-1], dtype=tf.float32)))
    return [ys] + tape.gradient(loss, [xs] + ws)


@pytest.mark.parametrize("chunk", [1, 5])
def test_expert_blocks_in_chunks_equal_all_blocks_at_once(chunk):
    """moe_chunk_blocks: chunks of blocks (the last one shorter) give the outputs and gradients of one chunk,
    which the autodiff of a plain gather-and-einsum gives too."""
    xs, index, ws = _expert_blocks_case()
    whole = _expert_blocks_grads(xs, index, ws, 0)
    for got, want in zip(_expert_blocks_grads(xs, index, ws, chunk), whole):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    with tf.GradientTape() as tape:
        tape.watch([xs] + ws)
        copies = [tf.gather(w, index) for w in ws]
        ys = tf.einsum("bjch,bjhm->bjcm", tf.nn.silu(tf.einsum("bjcm,bjmh->bjch", xs, copies[0]))
                       * tf.einsum("bjcm,bjmh->bjch", xs, copies[1]), copies[2])
        loss = tf.reduce_sum(ys * tf.sin(tf.range(ys.shape[-1], dtype=tf.float32)))
    for got, want in zip(whole, [ys] + tape.gradient(loss, [xs] + ws)):
        np.testing.assert_allclose(got.numpy(), tf.convert_to_tensor(want).numpy(), rtol=1e-5, atol=1e-5)


def test_expert_blocks_in_chunks_keep_one_chunks_weight_copies_under_xla():
    """XLA's memory plan of forward + backward: in chunks of 2 blocks, only a chunk's gathered weight copies
    (and their gradients) are live at once; all 16 blocks at once hold all of them. (Without the backward
    gathers' dependency on the chunk's gradient, `after`, XLA merges them with the forward's and keeps every
    copy: more bytes than all blocks at once.)"""
    xs, index, ws = _expert_blocks_case(blocks=8)

    def planned_bytes(chunk):
        fn = tf.function(lambda *a: _expert_blocks_grads(a[0], a[1], list(a[2:]), chunk), jit_compile=True)
        ir = fn.experimental_get_compiler_ir(xs, index, *ws)
        return xla.buffer_bytes(xla._hlo_pb2().HloProto.FromString(ir(stage="optimized_hlo_proto_serialized")))

    copies = 2 * 8 * 3 * 8 * 64 * 4                      # every block's copy of its expert's 3 matrices, float32
    whole, chunked = planned_bytes(0), planned_bytes(2)
    assert whole > copies and chunked < whole - copies, (whole, chunked, copies)


def _constant_custom_gradient_inputs(fn, *args) -> list[str]:
    """The constants `fn` traced on `args` (default: one [4, 8] float32) feeds to its custom gradients
    (IdentityN ops) as operands."""
    graph = tf.function(fn).get_concrete_function(*(args or [tf.TensorSpec([4, 8], tf.float32)])).graph
    return [t.name for op in graph.get_operations() if op.type == "IdentityN"
            for t in op.inputs if t.op.type == "Const"]


def test_experts_silu_is_tf_nn_silu_with_no_constant_operand():
    """The experts' silu (harness.nn.layers.silu) gives tf.nn.silu's values and gradients bit for bit, and its
    custom gradient takes no constant: in a train loop a constant operand (tf.nn.silu's beta) is hoisted out
    of the loop, and DTensor's expansion of the custom gradient's IdentityN can then move the op out of the
    loop too ("operand #0 does not dominate this use": smoke-mesh.yaml on a 2x2 mesh without FSDP)."""
    from harness.nn.layers import silu

    x = tf.random.stateless_normal([64, 33], seed=[3, 4]) * 4
    dy = tf.random.stateless_normal([64, 33], seed=[5, 6])
    got, want = [], []
    for fn, out in ((silu, got), (tf.nn.silu, want)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        out += [y.numpy(), tape.gradient(y, x, output_gradients=dy).numpy()]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert _constant_custom_gradient_inputs(silu) == []
    assert _constant_custom_gradient_inputs(tf.nn.silu)  # the check sees the beta it guards against
    # The expert blocks' forward and backward passes, chunked, call no custom gradient with a constant.
    xs, index, ws = _expert_blocks_case(blocks=4)
    assert _constant_custom_gradient_inputs(lambda *a: _expert_blocks_grads(a[0], a[1], list(a[2:]), 2),
                                            xs, index, *ws) == []
