"""Sentence pairs into fixed-length training rows, so one compiled step serves the whole run.

Packing follows Google's fastest v0.7 submission: pairs are placed greedily, in stream order, into the
open row while both sides fit; a pair that does not fit closes the row and opens the next one. Each pair
gets a segment id (1, 2, ...; 0 is padding) on both sides and positions counted from 0 within its
segment, which the model uses to keep pairs apart. Unpacked rows hold one pair each, padded.
"""
from __future__ import annotations

import tensorflow as tf

FEATURES = ("inputs", "targets", "inputs_segmentation", "targets_segmentation", "inputs_position",
            "targets_position")


def _empty(length: int) -> dict[str, tf.Tensor]:
    row = {name: tf.zeros([length], tf.int32) for name in FEATURES}
    row.update(used_inputs=tf.constant(0), used_targets=tf.constant(0), segments=tf.constant(0))
    return row


def _place(row: dict[str, tf.Tensor], pair: dict[str, tf.Tensor], length: int) -> dict[str, tf.Tensor]:
    """`row` with `pair` appended as the next segment (the caller checked that it fits)."""
    out = dict(row)
    segment = row["segments"] + 1
    for side in ("inputs", "targets"):
        ids = tf.cast(pair[side], tf.int32)
        n, used = tf.size(ids), row[f"used_{side}"]
        pad = [[used, length - used - n]]
        out[side] = row[side] + tf.pad(ids, pad)
        out[f"{side}_segmentation"] = row[f"{side}_segmentation"] + tf.pad(tf.fill([n], segment), pad)
        out[f"{side}_position"] = row[f"{side}_position"] + tf.pad(tf.range(n), pad)
        out[f"used_{side}"] = used + n
    out["segments"] = segment
    return out


def _features(row: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {name: row[name] for name in FEATURES}


def pad_rows(pairs: tf.data.Dataset, length: int) -> tf.data.Dataset:
    """One pair per row (packing off): a single segment padded to `length`."""
    return pairs.map(lambda p: _features(_place(_empty(length), p, length)), num_parallel_calls=tf.data.AUTOTUNE)


BLOCK = 256
"""Pairs packed per step: the greedy placement over a block's lengths and the tokens' scatter into rows are
vectorized, rather than one dataset-scan step (a dozen small ops) per pair."""


def pack_rows(pairs: tf.data.Dataset, length: int, flush_at_end: bool = False, block: int = BLOCK) -> tf.data.Dataset:
    """Greedy packing of `pairs` ({"inputs", "targets"}: int ids, each side at most `length` long)."""
    pairs = pairs.map(lambda p: {"inputs": tf.cast(p["inputs"], tf.int32), "targets": tf.cast(p["targets"], tf.int32)})
    return pack_blocks(pairs.ragged_batch(block), length, flush_at_end)


def pack_blocks(blocks: tf.data.Dataset, length: int, flush_at_end: bool = False) -> tf.data.Dataset:
    """Greedy packing of blocks of pairs ({"inputs", "targets"}: int32 RaggedTensors [pairs, None], each side
    at most `length` long), e.g. parsed a block of records at a time.

    Rows are exactly those of placing pairs one at a time in stream order (`count_rows` counts them): the open
    row is carried from one block to the next. An endless stream needs no flush; a finite one
    (`flush_at_end`) also emits its last, partly filled row.
    """
    blocks = blocks.map(lambda b: {"inputs": b["inputs"], "targets": b["targets"], "flush": tf.constant(False)})
    if flush_at_end:
        nothing = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), tf.zeros([0], tf.int64))
        blocks = blocks.concatenate(tf.data.Dataset.from_tensors(
            {"inputs": nothing, "targets": nothing, "flush": tf.constant(True)}))

    def step(row: dict[str, tf.Tensor], pairs_block: dict[str, tf.Tensor]):
        return _pack_block(row, pairs_block, length)

    return blocks.scan(_empty(length), step).unbatch()


def within_length_block(max_length: int):
    """`within_length` for a block of pairs: the pairs of the block that the length filter keeps."""
    def keep(block: dict[str, tf.RaggedTensor]) -> dict[str, tf.RaggedTensor]:
        ok = tf.logical_and(block["inputs"].row_lengths() <= max_length, block["targets"].row_lengths() <= max_length)
        return {k: tf.ragged.boolean_mask(block[k], ok) for k in ("inputs", "targets")}
    return keep


_DOUBLINGS = 16  # pointer-doubling steps: chains of up to 2**16 rows, so blocks of up to 65,535 pairs


def _assign(state: tf.Tensor, n_in: tf.Tensor, n_tgt: tf.Tensor, length: int) -> tf.Tensor:
    """The greedy placement of one block's pairs (lengths n_in, n_tgt [k]) from the open row's state (used
    inputs, used targets, segments, row 0): that state after each pair, [k, 4].

    Vectorized, without a loop over pairs (a graph loop pays a function call per iteration; a numpy one
    would not run on a remote input worker): a row that starts at pair i ends before the first pair that
    does not fit, found by `searchsorted` on the lengths' running sums, and the rows' starts are the chain
    start, next(start), ... marked by pointer doubling. An empty row takes any pair (each side <= length).
    """
    k = tf.size(n_in)
    sums = [tf.concat([[0], tf.cumsum(n)], 0) for n in (n_in, n_tgt)]  # [k + 1]: tokens before pair j

    def end(start: tf.Tensor, room: list[tf.Tensor]) -> tf.Tensor:
        """The first pair that does not fit in a row starting at pair `start` with `room` tokens a side."""
        return tf.minimum(*[tf.searchsorted(c, tf.gather(c, start) + r, side="right") - 1
                            for c, r in zip(sums, room)])

    first_end = end(tf.zeros([1], tf.int32), [length - state[0], length - state[1]])  # the carried row
    everywhere = tf.range(k + 1)
    jump = tf.concat([end(everywhere[:-1], [length, length]), [k]], 0)  # [k + 1]; k: past the block
    starts = tf.scatter_nd(first_end[:, None], [1], [k + 1])
    for _ in range(_DOUBLINGS):
        starts = tf.maximum(starts, tf.math.unsorted_segment_max(starts, jump, k + 1))
        jump = tf.gather(jump, jump)
    starts = starts[:k]
    row = tf.cumsum(starts)  # pairs before the first start stay in the carried row 0
    start = tf.gather(tf.concat([[0], tf.cast(tf.where(starts > 0)[:, 0], tf.int32)], 0), row)  # its row's first
    carried = tf.cast(row == 0, tf.int32)
    index = everywhere[:k]
    used_in = tf.gather(sums[0], index + 1) - tf.gather(sums[0], start) + carried * state[0]
    used_tgt = tf.gather(sums[1], index + 1) - tf.gather(sums[1], start) + carried * state[1]
    segments = index - start + 1 + carried * state[2]
    return tf.stack([used_in, used_tgt, segments, row], axis=1)


def _pack_block(row: dict[str, tf.Tensor], block: dict[str, tf.Tensor], length: int):
    """(the open row after `block`, the rows it completed [R, length] each): `row` continues as row 0."""
    n_in = tf.cast(block["inputs"].row_lengths(), tf.int32)
    n_tgt = tf.cast(block["targets"].row_lengths(), tf.int32)

    first = tf.stack([row["used_inputs"], row["used_targets"], row["segments"], tf.constant(0)])
    after = _assign(first, n_in, n_tgt, length)  # the open row's state after each pair
    last = tf.cond(tf.size(n_in) > 0, lambda: after[-1], lambda: first)
    rows = last[3] + 1  # row 0 is the carried one; the last is still open
    out = {}
    for side, n, used in (("inputs", n_in, after[:, 0]), ("targets", n_tgt, after[:, 1])):
        ragged = block[side]
        pair = tf.cast(ragged.value_rowids(), tf.int32)  # each token's pair
        within = tf.range(tf.size(ragged.flat_values)) - tf.gather(tf.cast(ragged.row_starts(), tf.int32), pair)
        at = tf.stack([tf.gather(after[:, 3], pair), tf.gather(used - n, pair) + within], axis=1)
        for name, values in ((side, ragged.flat_values), (f"{side}_segmentation", tf.gather(after[:, 2], pair)),
                             (f"{side}_position", within)):
            dense = tf.scatter_nd(at, values, tf.stack([rows, length]))
            out[name] = tf.tensor_scatter_nd_add(dense, [[0]], row[name][None])
    emit = rows - 1 + tf.cast(tf.logical_and(block["flush"], last[2] > 0), tf.int32)
    completed = {name: out[name][:emit] for name in FEATURES}
    open_row = {name: out[name][rows - 1] for name in FEATURES}
    open_row.update(used_inputs=last[0], used_targets=last[1], segments=last[2])
    open_row = tf.nest.map_structure(lambda a, b: tf.where(block["flush"], a, b), _empty(length), open_row)
    return open_row, completed


def to_rows(pairs: tf.data.Dataset, length: int, packing: bool, flush_at_end: bool = False) -> tf.data.Dataset:
    return pack_rows(pairs, length, flush_at_end) if packing else pad_rows(pairs, length)


def within_length(max_length: int):
    """The MLPerf length filter (method `discard`): both sides, EOS included, at most `max_length`."""
    def keep(pair: dict[str, tf.Tensor]) -> tf.Tensor:
        return tf.logical_and(tf.size(pair["inputs"]) <= max_length, tf.size(pair["targets"]) <= max_length)
    return keep


def count_rows(lengths, row_length: int, max_length: int, packing: bool) -> int:
    """The rows `within_length` + `to_rows(..., flush_at_end=True)` make of pairs with these (inputs, targets)
    lengths in this order, computed from the lengths alone (what `mlperf-harness data count` reports)."""
    rows, used_in, used_tgt, open_row = 0, 0, 0, False
    for n_in, n_tgt in lengths:
        if n_in > max_length or n_tgt > max_length:
            continue
        if not packing:
            rows += 1
        elif open_row and used_in + n_in <= row_length and used_tgt + n_tgt <= row_length:
            used_in, used_tgt = used_in + n_in, used_tgt + n_tgt
        else:
            rows += open_row
            used_in, used_tgt, open_row = n_in, n_tgt, True
    return rows + (packing and open_row)
