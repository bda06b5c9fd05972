"""Moving a mixture-of-experts layer's tokens to their experts and back with static shapes, whatever the router:
capacity slots in priority order, the gathers that fill and empty a buffer (gradients: gathers of the inverse
map, never scatters), and expert parallelism by all-to-all over the mesh axis that splits the experts.

A routing here is index [b, groups, s, k] (each token's k experts, int32), kept [b, groups, s, k] (1 = the
assignment has a slot) and position (its slot within its expert's capacity in its group). gpt_oss_20b's MoE
(benchmarks/gpt_oss_20b/moe.py) routes with a softmax top-k, deepseekv3_671b's (benchmarks/deepseekv3_671b/moe.py)
with a group-limited sigmoid top-k; any router giving these tensors can use them.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

import tensorflow as tf

from harness.runtime.base import Runtime

def slot_positions(choice: tf.Tensor) -> tf.Tensor:
    """choice [b, groups, s, k, experts] (one-hot of each assignment's expert) -> position [b, groups, s, k]
    int32: how many assignments of its group took the same expert before it in priority order (every token's
    first choice before any second choice, earlier tokens first: causal-safe, as GShard/Switch). An assignment
    is kept under a capacity c when its position < c; no expert gets a token twice, so c = s never drops."""
    b, ng, s, k, e = choice.shape
    priority = tf.reshape(tf.transpose(choice, [0, 1, 3, 2, 4]), [b, ng, k * s, e])
    position = tf.reduce_sum(tf.cumsum(priority, axis=2, exclusive=True) * priority, -1)
    return tf.cast(tf.transpose(tf.reshape(position, [b, ng, k, s]), [0, 1, 3, 2]), tf.int32)


class RowMap(Protocol):
    """Where assignments go in a buffer of rows: the buffer row each assignment takes and the assignment
    each buffer row holds (out-of-range values: none)."""
    row_source: tf.Tensor     # [r, rows] int32: the assignment a row holds (a: none)
    destination: tf.Tensor    # [r, a] int32: the row holding each assignment (rows: dropped)


@dataclasses.dataclass
class Slots:
    """The all-to-all dispatch's static buffer of `slots` rows per batch row, ordered expert, then routing
    group, then position in the expert's capacity (`capacity` rows per expert per group): expert e's rows of
    all groups are one contiguous run, so splitting the buffer's experts over devices hands each device its
    experts' rows."""
    row_source: tf.Tensor     # [r, slots] int32: the assignment a slot holds (a: none, an empty slot)
    destination: tf.Tensor    # [r, a] int32: the slot holding each assignment (slots: dropped)
    slots: int


def expert_slots(index: tf.Tensor, kept: tf.Tensor, position: tf.Tensor, experts: int, capacity: int) -> Slots:
    """The slot layout of a routing (index, kept, position [r, groups, s, k]): the kept assignment (t, j) of
    group g takes slot ((index * groups + g) * capacity + position).

    A slot's assignment comes from one TopKV2 sort of the assignments by slot (dropped ones last): the kept
    assignments of a bucket (expert, group) hold positions 0..count-1, so slot p of a bucket is the sorted
    assignment at the bucket's start + p. Counts are a one-hot sum over the experts (O(a x experts), as a
    router's own), offsets cumulative sums; nothing is data-shaped."""
    r, ng, s, k = index.shape
    a, slots = ng * s * k, experts * ng * capacity
    group = tf.range(ng, dtype=tf.int32)[None, :, None, None]
    slot = (index * ng + group) * capacity + position
    destination = tf.reshape(tf.where(kept > 0, slot, slots), [r, a])
    key = tf.where(destination < slots, destination, slots + tf.range(a, dtype=tf.int32)[None, :])
    order = tf.math.top_k(-key, a, sorted=True).indices                          # sorted -> assignment
    counts = tf.einsum("rgske,rgsk->reg", tf.one_hot(index, experts, dtype=tf.float32), kept)
    counts = tf.cast(tf.reshape(counts, [r, experts * ng]), tf.int32)           # [r, buckets]: expert-major
    start = tf.cumsum(counts, 1, exclusive=True)
    bucket = tf.range(slots, dtype=tf.int32) // capacity                         # [slots]
    within = tf.range(slots, dtype=tf.int32) % capacity
    valid = within[None, :] < tf.gather(counts, bucket, axis=1)
    rank = tf.minimum(tf.gather(start, bucket, axis=1) + within[None, :], a - 1)
    row_source = tf.where(valid, tf.gather(order, rank, batch_dims=1), a)
    return Slots(row_source, destination, slots)


def _rows(x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """x [b, n, m] -> [b, len(index), m], rows `index` of each batch row; index n is a zero row."""
    b, _, m = x.shape
    return tf.gather(tf.concat([x, tf.zeros([b, 1, m], x.dtype)], 1), index, batch_dims=1)


def dispatch_rows(x: tf.Tensor, lay: RowMap, k: int) -> tf.Tensor:
    """Tokens x [b, s, m] -> the buffer's rows [b, rows, m] (rows holding no assignment: zero).

    The gradient is a gather too, not a scatter: a token's gradient is the sum of its k assignments'
    rows (`destination`; a dropped one reads the zero row), exact and local to each batch row."""
    b, s, m = x.shape
    a = s * k
    token = tf.where(lay.row_source < a, lay.row_source // k, s)

    @tf.custom_gradient
    def dispatch(x):
        def grad(dy):
            return tf.reduce_sum(tf.reshape(_rows(dy, lay.destination), [b, s, k, m]), 2)
        return _rows(x, token), grad

    return dispatch(x)


def combine_rows(y: tf.Tensor, lay: RowMap) -> tf.Tensor:
    """The buffer's rows y [b, rows, m] -> each assignment's output [b, a, m] (dropped: zero); the gradient
    gathers each row's assignment gradient back (`row_source`; rows holding none: zero)."""

    @tf.custom_gradient
    def combine(y):
        def grad(dy):
            return _rows(dy, lay.row_source)
        return _rows(y, lay.destination), grad

    return combine(y)


def alltoall_experts(runtime: Runtime, x: tf.Tensor, index: tf.Tensor, kept: tf.Tensor, position: tf.Tensor,
                     experts: int, capacity: int, expert_fn: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
    """Each assignment's expert output [b, seq, k, m] (dropped: zero) for tokens x [b, seq, m] (batch-split)
    and a routing [b, groups, s, k] (groups x s = seq): the kept assignments are gathered into slots
    [b, experts, groups x capacity, m], relaid from batch-split to `experts`-split (on a mesh with the batch
    and the experts on one axis DTensor lowers this to one all-to-all; elsewhere a reshard or nothing),
    `expert_fn` maps them to outputs of the same shape with each device's own experts' weights, and the
    reverse relayout brings them home. The caller weights and sums the k outputs."""
    b, seq, m = x.shape
    k = index.shape[-1]
    lay = expert_slots(index, kept, position, experts, capacity)
    xs = tf.reshape(dispatch_rows(x, lay, k), [b, experts, lay.slots // experts, m])
    ye = expert_fn(runtime.place(xs, (None, "experts", None, None)))
    ys = runtime.place(ye, ("batch", None, None, None))
    return tf.reshape(combine_rows(tf.reshape(ys, [b, lay.slots, m]), lay), [b, seq, k, m])
