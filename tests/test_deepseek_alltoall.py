"""deepseekv3_671b's routed experts by the all-to-all dispatch (model.moe_dispatch=alltoall, benchmarks/lm/
moe_dispatch.py) against the every-expert `dense` execution: the same forward, losses, gradients, routing
counts and sequence aux loss on one device; on a mesh of 4 logical CPU devices with the experts and the batch
on one axis the per-device program moves tokens by all-to-alls and never gathers the routed experts' weights,
and gives the one-device numbers; with a capacity factor below 1, dropped assignments are counted and add
nothing. The mesh half runs in one subprocess (tests/helpers/deepseek_alltoall.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from tests.helpers import decoder_golden
from tests.spmd_trace import run_spmd_helper

SMOKE = os.path.join(REPO, "configs", "deepseekv3_671b", "smoke.yaml")
HELPER = os.path.join(REPO, "tests", "helpers", "deepseek_alltoall.py")
SMALL = ["data.seq_length=32", "model.init_stddev=0.05"]


def build(overrides: list[str]):
    return decoder_golden.build_workload(SMOKE, decoder_golden.ONE_DEVICE + SMALL + overrides)


def forward_and_backward(wl, tokens: tf.Tensor) -> dict:
    """The loss terms, the main and MTP cross-entropies, each MoE layer's counts, seq aux and dropped counts,
    and the gradient of the summed loss for every trainable variable (by path)."""
    infos = wl.runtime.variables(trainable=True)
    with tf.GradientTape() as tape:
        terms, _ = wl.loss({"tokens": tokens}, tf.constant([0, 0]))
        loss = tf.add_n([t.total / t.count for t in terms.values()])
    grads = tape.gradient(loss, [v.variable for v in infos])
    xent, _, extras, targets = wl.position_losses({"tokens": tokens}, None)
    mtp_xent = wl.mtp_xent(extras, targets)
    moe = wl.routings(extras)
    return {"loss": float(loss), "terms": {k: float(t.total) for k, t in terms.items()}, "xent": xent.numpy(),
            "mtp_xent": mtp_xent.numpy(), "counts": [r.counts.numpy() for r in moe],
            "seq_aux": [float(r.seq_aux) for r in moe], "dropped": [r.dropped.numpy() for r in moe],
            "grads": {v.path: tf.convert_to_tensor(g).numpy() for v, g in zip(infos, grads)}}


def test_alltoall_equals_the_dense_experts_on_one_device():
    """The smoke model at rows of 32 (2 MoE layers and MTP's, 8 experts in 2 groups, top-2), float32, the same
    weights and random positive expert biases under both executions: every loss term, both heads'
    cross-entropy per position, the routing counts, the seq aux sums and every trainable variable's gradient
    agree; dropless, nothing is dropped."""
    rng = np.random.default_rng(3)
    tokens = tf.constant(rng.integers(1, 512, (4, 33)).astype(np.int32))
    got, want = {}, {}
    for name, out in (("alltoall", got), ("dense", want)):
        wl = build([f"model.moe_dispatch={name}"])
        for bias in wl.expert_biases():
            bias.assign(np.random.default_rng(9).uniform(0.0, 0.1, bias.shape).astype(np.float32))
        out.update(forward_and_backward(wl, tokens))
    assert set(got["terms"]) == {"cross_entropy", "mtp", "seq_aux"}
    for k in got["terms"]:
        assert got["terms"][k] == pytest.approx(want["terms"][k], rel=1e-5), k
    np.testing.assert_allclose(got["xent"], want["xent"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["mtp_xent"], want["mtp_xent"], rtol=1e-5, atol=1e-6)
    assert len(got["counts"]) == 3
    for g, w in zip(got["counts"], want["counts"]):
        np.testing.assert_array_equal(g, w)
        assert g.sum() == 4 * 32 * 2
    np.testing.assert_allclose(got["seq_aux"], want["seq_aux"], rtol=1e-6)
    assert all(d.sum() == 0 for d in got["dropped"] + want["dropped"])
    assert set(got["grads"]) == set(want["grads"]) and len(got["grads"]) > 20
    experts = [p for p in got["grads"] if "/experts/" in p]
    assert len(experts) == 9                     # gate, up, down of 3 MoE layers
    for path, w in want["grads"].items():
        assert np.abs(w).max() > 0, path
        np.testing.assert_allclose(got["grads"][path], w, rtol=1e-4, atol=1e-5 * np.abs(w).max(), err_msg=path)


def np_kept(index: np.ndarray, experts: int, capacity: int) -> np.ndarray:
    """index [b, s, k] -> kept [b, s, k]: slots of a row filled every token's first choice first, then every
    second choice, earlier tokens first (GShard/Switch priority), `capacity` per expert."""
    b, s, k = index.shape
    kept = np.zeros(index.shape, np.float32)
    for row in range(b):
        taken = np.zeros(experts, int)
        for j in range(k):
            for t in range(s):
                e = index[row, t, j]
                kept[row, t, j] = taken[e] < capacity
                taken[e] += 1
    return kept


def test_capacity_drops_are_counted_and_add_nothing():
    """A layer with capacity factor 0.5 (2 slots per expert for 16 tokens x top-2 over 8 experts): each row's
    dropped count is numpy's priority rule's, the routing counts stay the routing's, and the output and every
    gradient equal the dense execution with the dropped assignments' gates zeroed; dropless differs."""
    from benchmarks.deepseekv3_671b.config import ModelConfig
    from benchmarks.deepseekv3_671b.moe import DeepseekMoE
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    rt = make_runtime(RuntimeConfig(kind="default", precision="float32"))
    cfg = ModelConfig(hidden_size=16, num_experts=8, experts_per_token=2, expert_hidden=12, expert_groups=2,
                      groups_per_token=1, shared_experts=1, init_stddev=0.3, capacity_factor=0.5,
                      moe_dispatch="alltoall")
    layer = DeepseekMoE(rt, "moe", 7, cfg)
    layer.expert_bias.assign(np.random.default_rng(2).uniform(0.0, 0.2, 8).astype(np.float32))
    x = tf.random.stateless_normal([3, 16, 16], seed=[4, 5])
    variables = [layer.router, layer.w_gate, layer.w_up, layer.w_down] + [
        v.variable for v in rt.variables(trainable=True) if "/shared/" in v.path]
    weights = tf.sin(tf.range(16, dtype=tf.float32))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y, r = fn()
            loss = tf.reduce_sum(y * weights)
        return y.numpy(), r, [g.numpy() for g in tape.gradient(loss, [x] + variables)]

    y, r, grads = run(lambda: layer(x))
    _, index, _ = layer.route(x)
    kept = np_kept(index.numpy(), 8, 2)
    np.testing.assert_array_equal(r.dropped.numpy(), (1 - kept).sum((1, 2)))
    assert r.dropped.numpy().sum() > 3 * 16 * 2 / 4                        # a real share dropped
    np.testing.assert_array_equal(r.counts.numpy(), np.eye(8)[index.numpy()].sum((0, 1, 2)))

    mask = np.einsum("bske,bsk->bse", np.eye(8, dtype=np.float32)[index.numpy()], kept)

    def dense_kept():
        gates, _, _ = layer.route(x)
        return layer._dense(x, gates * mask) + layer.shared(x), r

    y_ref, _, grads_ref = run(dense_kept)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    for g, w in zip(grads, grads_ref):
        assert np.abs(w).max() > 0
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    layer.cfg = cfg.__class__(**{**cfg.__dict__, "capacity_factor": 0.0})
    y_all, r_all, _ = run(lambda: layer(x))
    assert r_all.dropped.numpy().sum() == 0 and np.abs(y_all - y).max() > 0.1 * np.abs(y).max()


def test_validate_refuses_a_capacity_factor_on_the_dense_experts():
    from harness.errors import HarnessError

    wl = build(["model.moe_dispatch=alltoall", "model.capacity_factor=1.5"])
    assert wl.extra_hparams()["moe_expert_capacity_factor"] == 1.5
    with pytest.raises(HarnessError, match="needs model.moe_dispatch=alltoall"):
        build(["model.moe_dispatch=dense", "model.capacity_factor=1.5"])


# ------------------------------------------------------------------------------------------ on a mesh

@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    return run_spmd_helper(HELPER, str(tmp_path_factory.mktemp("spmd")))


@pytest.mark.parametrize("cf", ["cf0.0", "cf0.5"])
def test_mesh_alltoall_equals_one_device_and_the_dense_experts(traced, cf):
    """8 experts over {data: 4}, 4 rows of 32 tokens: the output, routing counts, seq aux, dropped counts and
    the gradients (input, router, routed and shared experts) on the mesh equal one device's, dropless and
    with capacity factor 0.5 (which drops); dropless, the forward values equal the dense execution's on the
    mesh."""
    case = traced[cf]
    got = case["mesh"]
    assert len(got) == 4 + 1 + 7                 # outputs, then x and the 7 trainable weights
    assert (np.sum(got[3]) > 0) == (cf == "cf0.5")
    for other in ("one", "dense") if cf == "cf0.0" else ("one",):
        want = case[other]
        assert len(want) == (len(got) if other == "one" else 4)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, err_msg=other)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[2], want[2], rtol=1e-6)
        np.testing.assert_array_equal(got[3], want[3])
        for g, w in zip(got[4:], want[4:]):
            assert np.abs(w).max() > 0
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max(), err_msg=other)


def test_layer_program_moves_tokens_and_keeps_routed_expert_weights_home(traced):
    """The alltoall layer's per-device program: each device sends its row's [8 experts, 32 slots] buffer and
    gets its 2 experts' slots of all 4 rows (forward, back, and both again in the backward pass), the gate/up
    einsum reads its 2 local experts' weights, nothing is all-gathered. The dense execution's program, traced
    the same way, gathers all 8 experts' gate and up weights to every device (what the check sees when it
    happens)."""
    a2a = traced["alltoall_layer_program"]
    assert a2a["all_to_alls"] == ["1x8x32x16->4x2x32x16"] * 2 + ["4x2x32x16->1x8x32x16"] * 2
    assert a2a["all_gathers"] == []
    assert a2a["expert_matmuls"] == ["4x2x32x16|2x16x12"] * 2 and a2a["dense_matmuls"] == []
    dense = traced["dense_layer_program"]
    assert dense["expert_matmuls"] == [] and dense["dense_matmuls"] == ["1x32x16|8x16x12"] * 2
    assert [g for g in dense["all_gathers"] if g.startswith("2x16x12")] == ["2x16x12->8x16x12"] * 2


def test_smoke_mesh_step_sends_tokens_by_all_to_all_and_gathers_no_routed_expert(traced):
    """A train step of configs/deepseekv3_671b/smoke-mesh.yaml (2x2 {data, model}: batch and experts over data,
    heads / hidden units / vocab over model), cut to one MoE layer and MTP's: each MoE layer's tokens cross by
    all-to-all over `data` (8 experts -> 4 local ones, 4 local rows -> all 8 rows of 64 slots, each way, and
    again in the backward pass), the experts multiply their local weights [4 experts, 64, 16 of 32 ff], the
    step has no all-gather at all, the log's expert parallelism is 2 and the loss is one device's."""
    step = traced["step_mesh"]
    prog = step["program"]
    assert prog["all_to_alls"] == ["4x8x64x64->8x4x64x64"] * 4 + ["8x4x64x64->4x8x64x64"] * 4
    assert prog["expert_matmuls"] == ["8x4x64x64|4x64x16"] * 4
    assert prog["all_gathers"] == []
    assert step["expert_parallelism"] == 2 and traced["step_one"]["expert_parallelism"] == 1
    assert step["loss"] == pytest.approx(traced["step_one"]["loss"], rel=1e-5)
