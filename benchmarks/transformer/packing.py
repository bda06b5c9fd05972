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


def pack_rows(pairs: tf.data.Dataset, length: int, flush_at_end: bool = False) -> tf.data.Dataset:
    """Greedy packing of `pairs` ({"inputs", "targets"}: int ids, each side at most `length` long).

    An endless stream needs no flush; a finite one (`flush_at_end`) also emits its last, partly filled row.
    """
    pairs = pairs.map(lambda p: {"inputs": tf.cast(p["inputs"], tf.int32), "targets": tf.cast(p["targets"], tf.int32),
                                 "flush": tf.constant(False)})
    if flush_at_end:
        pairs = pairs.concatenate(tf.data.Dataset.from_tensors(
            {"inputs": tf.zeros([0], tf.int32), "targets": tf.zeros([0], tf.int32), "flush": tf.constant(True)}))

    def step(row: dict[str, tf.Tensor], pair: dict[str, tf.Tensor]):
        fits = tf.logical_and(row["used_inputs"] + tf.size(pair["inputs"]) <= length,
                              row["used_targets"] + tf.size(pair["targets"]) <= length)
        emit = tf.logical_and(tf.logical_or(tf.logical_not(fits), pair["flush"]), row["segments"] > 0)
        start = tf.nest.map_structure(lambda a, b: tf.where(fits, a, b), row, _empty(length))
        placed = _place(start, pair, length)
        new_row = tf.nest.map_structure(lambda a, b: tf.where(pair["flush"], a, b), _empty(length), placed)
        return new_row, (emit, _features(row))

    return pairs.scan(_empty(length), step).filter(_is_emitted).map(_emitted_row)


# Named, not two lambdas on one line: AutoGraph cannot tell such lambdas apart and warns on every run.
def _is_emitted(emit: tf.Tensor, row: dict[str, tf.Tensor]) -> tf.Tensor:
    return emit


def _emitted_row(emit: tf.Tensor, row: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return row


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
