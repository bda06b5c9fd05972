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
view is the table's storage transposed, never a copy of the whole table. A batch split over the rows' devices
would need each device to send only its own ids and add only arriving gradients into its rows: DTensor
all-gathers a scatter's or segment sum's batch-split indices and lays out no `LowerBound`, so that is not built.
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
