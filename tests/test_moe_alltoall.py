"""gpt_oss's all-to-all MoE dispatch (model.moe_dispatch=alltoall, benchmarks/lm/moe_dispatch.py) on a mesh of
4 logical CPU devices: it gives the sorted (expert-gathering) dispatch's outputs, dropped counts and gradients,
and its per-device program (DTensor's SPMD expansion, as tests/test_mesh_split.py reads it) moves tokens by
all-to-alls over the experts' axis and never gathers an expert's weights; its slot layout holds every kept
assignment once. One subprocess (tests/helpers/moe_alltoall.py, about 20 s of CPU) traces both programs."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.gpt_oss_20b import moe
from benchmarks.lm import moe_dispatch
from conftest import REPO
from tests.spmd_trace import run_spmd_helper

HELPER = os.path.join(REPO, "tests", "helpers", "moe_alltoall.py")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    return run_spmd_helper(HELPER, str(tmp_path_factory.mktemp("spmd")))


@pytest.mark.parametrize("cf", ["cf0.0", "cf0.5"])
def test_alltoall_equals_the_sorted_dispatch_on_a_mesh(traced, cf):
    """8 experts over 4 devices, 4 rows of 32 tokens (2 routing groups each): output, per-row dropped counts and
    the gradients of the input, router and expert weights, dropless and with capacity factor 0.5."""
    got, want = traced[cf]["alltoall"], traced[cf]["sorted"]
    assert len(got) == len(want) == 7
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    assert (np.sum(want[1]) > 0) == (cf != "cf0.0")          # capacity 0.5 drops, dropless does not
    for g, w in zip(got[2:], want[2:]):
        assert np.abs(w).max() > 0
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_layer_program_moves_tokens_and_keeps_expert_weights_home(traced):
    """The layer on {data: 4}: each device sends its row's [8 experts, 2 groups x 16 slots] buffer and gets its
    2 experts' slots of all 4 rows (forward, back, and both again in the backward pass); the gate/up einsum
    reads its 2 local experts' weights; nothing is all-gathered. The sorted dispatch's program, traced the
    same way, gathers all 8 experts' weights (what this check sees when it happens)."""
    a2a = traced["alltoall_layer_program"]
    assert a2a["all_to_alls"] == ["1x8x32x16->4x2x32x16"] * 2 + ["4x2x32x16->1x8x32x16"] * 2
    assert a2a["all_gathers"] == []
    assert a2a["expert_matmuls"] == ["4x2x32x16|2x16x12"] * 2
    gathered = traced["sorted_layer_program"]
    assert gathered["all_to_alls"] == []
    assert gathered["all_gathers"] == ["2x12x16->8x12x16", "2x16x12->8x16x12", "2x16x12->8x16x12"]


def test_smoke_mesh_train_step_has_all_to_alls_and_no_all_gather(traced):
    """A train step of configs/gpt_oss_20b/smoke-mesh.yaml (2x2 {data, model}: experts over data, expert ff over
    model) with the alltoall dispatch: the only token movement is the all-to-all over `data` (8 experts -> 4,
    1 row -> 2 rows of 128 slots), the experts multiply local weights [4 experts, 32, 16 ff], and the step
    has no all-gather at all (the sorted dispatch gathers three expert weights here, tests/test_mesh_split.py)."""
    step = traced["step_program"]
    assert step["all_to_alls"] == ["1x8x128x32->2x4x128x32"] * 2 + ["2x4x128x32->1x8x128x32"] * 2
    assert step["all_gathers"] == []
    assert step["expert_matmuls"] == ["2x4x128x32|4x32x16"] * 2
    assert np.isfinite(traced["step_loss"]) and traced["expert_parallelism"] == 2


def test_expert_slots_hold_every_kept_assignment_once_in_expert_group_order():
    rng = np.random.default_rng(0)
    rows, groups, s, k, experts, capacity = 3, 2, 12, 2, 5, 4
    logits = tf.constant(rng.normal(size=(rows, groups, s, experts)), tf.float32)
    r = moe.route(logits, k, capacity, dense=False, positions=True)
    lay = moe_dispatch.expert_slots(r.index, r.kept, r.position, experts, capacity)
    index, kept, position = (t.numpy().reshape(rows, -1) for t in (r.index, r.kept, r.position))
    src, dest = lay.row_source.numpy(), lay.destination.numpy()
    a, slots = groups * s * k, experts * groups * capacity
    assert lay.slots == slots and kept.min() == 0                   # this capacity drops some
    group = np.arange(a) // (s * k)
    for row in range(rows):
        for j in range(a):
            if kept[row, j]:
                d = dest[row, j]
                assert d == (index[row, j] * groups + group[j]) * capacity + position[row, j]
                assert src[row, d] == j
            else:
                assert dest[row, j] == slots                        # dropped: the zero row
        filled = src[row][src[row] < a]
        assert sorted(filled) == sorted(np.flatnonzero(kept[row]))   # each kept assignment once, nothing else
