"""dlrmv4's table lookup on rows split over a mesh axis, sized by the step's ids and each device's own rows.

The step's ids are deduplicated in static shapes (sorts only: no `tf.unique`, which XLA cannot compile, and no
segment op, which DTensor does not lay out), each distinct id's row is read on the device that owns it only,
and one sum over the row split returns every distinct row to every device of the split: the form of "ids to
their owners, rows back" for a batch that every device of the split holds (the configured layouts split no
batch over `vocab`). Its buffers hold all the step's ids (a static capacity that cannot overflow, so no id is
ever dropped). The gradient goes the other way: the repeats of an id are summed onto its distinct row, and
each device adds the distinct rows it owns into its own rows of the table's gradient (a scatter of [ids, dim]
into [own rows, dim]). No per-device tensor has (rows) x (ids) elements, unlike
`harness/nn/layers.py:vocab_parallel_lookup`, whose gradient is a one-hot [ids, own rows] contraction.

The split is laid out as the table viewed [rows per device, devices, dim] with the devices' axis split: a gather
or scatter along the first axis is then local to each device (DTensor splits only a non-indexed axis), and the
view is the table's storage transposed, never a copy of the whole table.

`routed_lookup` is the form for a batch split over the rows' devices (`routed`): each device sends only its own
ids to their owners and gets their rows back (all-to-alls, as relayouts between split-by-sender and
split-by-owner buffers), and each owner adds only the arriving gradients into its rows. DTensor all-gathers a
scatter's or segment sum's batch-split indices and lays out no `LowerBound`, so those sums are sorts and a
segmented scan (`segment_sum_rows`), each local to a device's row of a [devices, ...] tensor.
"""
from __future__ import annotations

import tensorflow as tf

from harness.runtime.base import Runtime


def dedup(flat: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """ids [k] -> (distinct [k]: the distinct ids ascending, then padding (repeats of real ids); index [k]: each
    id's place in distinct; count: how many are distinct), all static shapes and sorts (no segment ops, which
    DTensor does not lay out)."""
    order = tf.argsort(flat, stable=True)
    ordered = tf.gather(flat, order)
    first = tf.concat([[True], ordered[1:] != ordered[:-1]], 0)
    slot = tf.cumsum(tf.cast(first, tf.int32)) - 1                          # sorted position -> distinct place
    index = tf.gather(slot, tf.math.invert_permutation(order))
    count = slot[-1] + 1
    # the sorted positions of first occurrences, in order, come first in a stable sort on "is a repeat"
    distinct = tf.gather(ordered, tf.argsort(tf.cast(tf.logical_not(first), tf.int32), stable=True))
    return distinct, index, count


def owner_lookup(runtime: Runtime, table: tf.Variable | tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` [...] of `table` [vocab, dim] (vocab split `runtime.shards("vocab")` ways, contiguous rows per
    device) -> [..., dim]; the gradient reaches the table summed per distinct row, each device only its own."""
    n = runtime.shards("vocab")
    t = runtime.read(table) if isinstance(table, tf.Variable) else table
    vocab, dim = t.shape
    rows = vocab // n
    shape = ids.shape.as_list()
    distinct, index, count = dedup(tf.reshape(tf.cast(ids, tf.int32), [-1]))
    k = distinct.shape[0]
    valid = tf.cast(tf.range(k) < count, t.dtype)
    # pick[u, d] = 1 where device d owns distinct id u (and u is a real distinct id)
    pick = tf.one_hot(distinct // rows, n, dtype=t.dtype) * valid[:, None]
    local = distinct % rows
    split = (None, "vocab", None)

    @tf.custom_gradient
    def gather(tab: tf.Tensor) -> tf.Tensor:
        view = runtime.place(tf.transpose(tf.reshape(tab, [n, rows, dim]), [1, 0, 2]), split)
        got = runtime.place(tf.gather(view, local), split)                 # [k, n, dim]: each device its rows
        out = tf.einsum("knm,kn->km", got, pick)                           # one sum over the split

        def grad(dy: tf.Tensor) -> tf.Tensor:
            dy = tf.convert_to_tensor(dy)  # [k, dim]: the outer gather's slices, repeats summed per distinct id
            per = runtime.place(dy[:, None, :] * tf.cast(pick, dy.dtype)[:, :, None], split)
            g = tf.tensor_scatter_nd_add(runtime.place(tf.zeros([rows, n, dim], dy.dtype), split),
                                         local[:, None], per)
            g = runtime.place(g, split)
            return tf.cast(tf.reshape(tf.transpose(g, [1, 0, 2]), [vocab, dim]), tab.dtype)

        return out, grad

    return tf.reshape(tf.gather(gather(t), index), shape + [dim])


# ------------------------------------------------------------------------------------------- routed to owners
def _argsort_rows(key: tf.Tensor) -> tf.Tensor:
    """key [n, k] int32 distinct per row -> the ascending order of each row (one TopKV2 along the unsplit axis,
    which DTensor keeps local to each batch-split row)."""
    return tf.math.top_k(-key, key.shape[1], sorted=True).indices


def _rows(x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """x [n, m, ...] -> [n, len(index), ...]: each row's own entries `index` (a gather local to a split row)."""
    return tf.gather(x, index, batch_dims=1)


def dedup_rows(flat: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`dedup` of each row of ids [n, k] (each device its own): (distinct [n, k] ascending then padding with
    repeats of real ids, index [n, k] each id's place in its row's distinct, count [n])."""
    n, k = flat.shape
    pos = tf.range(k, dtype=tf.int32)[None, :]
    # ties broken by position: a unique key per id, so the sort is stable (ids < 2**31 / k hold in int64 below)
    order = _argsort_rows(tf.cast(flat, tf.int64) * k + tf.cast(pos, tf.int64))
    ordered = _rows(flat, order)
    first = tf.concat([tf.ones([n, 1], tf.bool), ordered[:, 1:] != ordered[:, :-1]], 1)
    slot = tf.cumsum(tf.cast(first, tf.int32), axis=1) - 1
    index = _rows(slot, _argsort_rows(order))                               # the inverse permutation
    count = slot[:, -1] + 1
    distinct = _rows(ordered, _argsort_rows(tf.cast(tf.logical_not(first), tf.int32) * k + pos))
    return distinct, index, count


def segment_sum_rows(values: tf.Tensor, segment: tf.Tensor, segments: int) -> tf.Tensor:
    """values [n, m, dim] summed per segment [n, m] (in [0, segments)) of each row -> [n, segments, dim], with no
    scatter or segment op (DTensor gathers a scatter's split indices): a sort of the entries with one empty
    marker per segment after its entries, a segmented inclusive scan by doubling (log2 steps of shifted adds,
    never a difference of running sums), and each segment's total read at its marker."""
    n, m, dim = values.shape
    s = segments
    key = tf.concat([2 * segment, 2 * tf.range(s, dtype=tf.int32)[None, :] + tf.zeros([n, 1], tf.int32) + 1], 1)
    order = _argsort_rows(key)                                               # markers sort after their entries
    seg = _rows(key // 2, order)
    x = _rows(tf.concat([values, tf.zeros([n, s, dim], values.dtype)], 1), order)
    shift = 1
    while shift < m + s:
        same = tf.concat([tf.zeros([n, shift], tf.bool), seg[:, shift:] == seg[:, :-shift]], 1)
        prev = tf.concat([tf.zeros([n, shift, dim], x.dtype), x[:, :-shift]], 1)
        x = x + tf.where(same[..., None], prev, tf.zeros_like(prev))
        shift *= 2
    where = _rows(_argsort_rows(order), tf.range(m, m + s)[None, :] + tf.zeros([n, 1], tf.int32))
    return _rows(x, where)


def routed(runtime: Runtime) -> bool:
    """Whether the layout splits the batch over the very devices that split the tables' rows (`batch` and
    `vocab` on one mesh axis), so each device's ids are routed to their owners (`routed_lookup`)."""
    return runtime.shards("vocab") > 1 and runtime.rules.get("vocab") == runtime.rules.get("batch")


def routed_capacity(ids_per_device: int, rows_per_device: int) -> int:
    """Slots per (sender, owner) pair: a device's distinct ids owned by one device number at most its ids and at
    most that owner's rows, so this capacity never drops an id."""
    return min(ids_per_device, rows_per_device)


def routed_lookup(runtime: Runtime, table: tf.Variable | tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` [B, ...] of `table` [vocab, dim], with the batch B and the table's rows split over the same n
    devices (layout `batch` and `vocab` on one mesh axis): each device deduplicates its own ids, sends each
    distinct id to the device owning its row in a [n senders, n owners, capacity] buffer relaid from split by
    sender to split by owner (one all-to-all), the owner gathers its rows, and the reverse relayout brings them
    back (a second all-to-all). The gradient goes the same way: each device sums its ids' row gradients per
    distinct id, the all-to-all takes them to the owners, and each owner sums what arrives per row of its own
    rows (`segment_sum_rows`) into its shard of the table's gradient. Capacity: `routed_capacity`, no id dropped."""
    n = runtime.shards("vocab")
    # the batch shares this program holds: all n on a DTensor mesh (one SPMD program), one where a runtime
    # compiles one replica's program (the dry run's stand-in: its all-to-alls are relayouts of its own blocks)
    s = runtime.program_batch(n)
    t = runtime.read(table) if isinstance(table, tf.Variable) else table
    vocab, dim = t.shape
    rows = vocab // n
    shape = ids.shape.as_list()
    if shape[0] % s:
        raise ValueError(f"routed_lookup: a batch of {shape[0]} does not split over {s} devices")
    by_sender = ("batch",) + (None,) * len(shape[1:])
    flat = runtime.place(tf.reshape(runtime.place(tf.cast(ids, tf.int32), by_sender), [s, -1]), ("batch", None))
    k = flat.shape[1]
    cap = routed_capacity(k, rows)
    distinct, index, count = dedup_rows(flat)
    u = tf.range(k, dtype=tf.int32)[None, :]
    owner = tf.where(u < count[:, None], distinct // rows, n)                # [s, k]; padding: nobody's
    per_owner = tf.cast(tf.reduce_sum(tf.one_hot(owner, n, dtype=tf.float32), 1), tf.int32)   # [s, n]
    start = tf.cumsum(per_owner, axis=1, exclusive=True)
    # the distinct ids are ascending, so each owner's are one run: slot (o, c) holds distinct id start[o] + c
    o = tf.range(n * cap, dtype=tf.int32) // cap
    c = tf.range(n * cap, dtype=tf.int32) % cap
    filled = c[None, :] < tf.gather(per_owner, o, axis=1)
    src = tf.minimum(tf.gather(start, o, axis=1) + c[None, :], k - 1)
    local = tf.where(filled, _rows(distinct, src) - o[None, :] * rows, 0)  # [s, n * cap]: owner-local rows
    send = runtime.place(tf.reshape(local, [s, n, cap]), ("batch", None, None))
    # each id's slot: its distinct id's owner's run, at its place within the run
    slot_of = tf.where(owner < n, owner * cap + u - _rows(start, tf.minimum(owner, n - 1)), 0)
    slot = _rows(slot_of, index)                                             # [s, k]
    arrived = runtime.place(send, (None, "vocab", None))                     # all-to-all: split by owner
    asked = runtime.place(tf.reshape(tf.transpose(arrived, [1, 0, 2]), [n, s * cap]), ("vocab", None))

    @tf.custom_gradient
    def gather(tab: tf.Tensor) -> tf.Tensor:
        view = runtime.place(tf.reshape(tab, [n, rows, dim]), ("vocab", None, None))
        got = runtime.place(_rows(view, asked), ("vocab", None, None))      # [owner, s * cap, dim]
        back = tf.transpose(tf.reshape(got, [n, s, cap, dim]), [1, 0, 2, 3])
        back = runtime.place(runtime.place(back, (None, "vocab", None, None)), ("batch", None, None, None))
        out = _rows(tf.reshape(back, [s, n * cap, dim]), slot)              # [s, k, dim]

        def grad(dy: tf.Tensor) -> tf.Tensor:
            dy = runtime.place(tf.convert_to_tensor(dy), ("batch", None, None))
            per_slot = segment_sum_rows(dy, slot, n * cap)                   # repeats summed per distinct id
            g = runtime.place(tf.reshape(per_slot, [s, n, cap, dim]), ("batch", None, None, None))
            g = runtime.place(g, (None, "vocab", None, None))                # all-to-all to the owners
            g = tf.reshape(tf.transpose(g, [1, 0, 2, 3]), [n, s * cap, dim])
            own = segment_sum_rows(runtime.place(g, ("vocab", None, None)), asked, rows)
            own = runtime.place(own, ("vocab", None, None))
            return tf.cast(tf.reshape(own, [vocab, dim]), tab.dtype)

        return out, grad

    out = runtime.place(gather(t), ("batch", None, None))
    return tf.reshape(out, shape + [dim])
