"""SSD target assignment, box coding and loss in TensorFlow, following the MLPerf reference (utils.py `Encoder`,
base_model.py `Loss`) and Google's v0.7 TF code (ArgMaxMatcher with force_match_for_each_row, FasterRcnnBoxCoder).

Everything has static shapes and no Python control flow on tensor values, so it runs inside a `tf.function` (XLA
included) on any device. Box layouts: ltrb = (left, top, right, bottom) and xywh = (cx, cy, w, h), both normalized
to [0, 1] of the image; anchors are those of `anchors.default_boxes`.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

VARIANCES = (0.1, 0.2)
"""The reference's (scale_xy, scale_wh): offsets are multiplied by 10 and 5 when encoded."""

_EPS = 1e-8


def ltrb_to_xywh(boxes: tf.Tensor) -> tf.Tensor:
    """(left, top, right, bottom) -> (cx, cy, w, h) on the last axis."""
    lt, rb = boxes[..., :2], boxes[..., 2:]
    return tf.concat([0.5 * (lt + rb), rb - lt], axis=-1)


def xywh_to_ltrb(boxes: tf.Tensor) -> tf.Tensor:
    """(cx, cy, w, h) -> (left, top, right, bottom) on the last axis."""
    cxy, wh = boxes[..., :2], boxes[..., 2:]
    return tf.concat([cxy - 0.5 * wh, cxy + 0.5 * wh], axis=-1)


def iou(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Pairwise IoU of ltrb boxes: a [..., M, 4] and b [..., N, 4] give [..., M, N] (0 where the union is empty)."""
    a = tf.convert_to_tensor(a)
    b = tf.cast(b, a.dtype)
    lt = tf.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = tf.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    wh = tf.maximum(rb - lt, 0.0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return tf.math.divide_no_nan(inter, area_a[..., :, None] + area_b[..., None, :] - inter)


def match(gt_boxes: tf.Tensor, gt_labels: tf.Tensor, gt_valid: tf.Tensor, anchors_ltrb: tf.Tensor,
          threshold: float = 0.5) -> tuple[tf.Tensor, tf.Tensor]:
    """Assign ground truth to anchors as the reference `Encoder.encode` does, for one image or a batch.

    gt_boxes [..., M, 4] ltrb, gt_labels [..., M] (contiguous class ids, 1..C-1), gt_valid [..., M] bool (False
    for padding rows), anchors_ltrb [N, 4]; leading axes are images. Every valid ground-truth box is forced onto
    its best-IoU anchor (the reference sets that IoU to 2.0; when two boxes pick the same anchor the later row
    wins, as the reference's index assignment does); every other anchor takes its best valid box when that IoU
    is >= threshold (Google's ArgMaxMatcher; the PyTorch reference uses a strict >, which differs only at exact
    equality). Padding rows never match; M must be static (pad to a fixed max_boxes; M = 0 gives all
    background). Only batched tensor ops (no map_fn), so it also runs under DTensor. Returns matched boxes
    [..., N, 4] ltrb (an unmatched anchor gets its own box, so it encodes to zeros) and labels [..., N] int32
    (0 = background).
    """
    gt_boxes = tf.convert_to_tensor(gt_boxes, tf.float32)
    anchors_ltrb = tf.convert_to_tensor(anchors_ltrb, tf.float32)
    gt_labels = tf.cast(gt_labels, tf.int32)
    gt_valid = tf.cast(gt_valid, tf.bool)
    n, m = anchors_ltrb.shape[0], gt_boxes.shape[-2]
    batch_dims = len(gt_boxes.shape) - 2
    if m == 0:
        lead = tf.shape(gt_boxes)[:-2]
        return (tf.broadcast_to(anchors_ltrb, tf.concat([lead, [n, 4]], 0)),
                tf.zeros(tf.concat([lead, [n]], 0), tf.int32))
    overlaps = tf.where(gt_valid[..., None], iou(gt_boxes, anchors_ltrb), -1.0)  # [..., M, N]
    best_gt = tf.argmax(overlaps, axis=-2, output_type=tf.int32)  # [..., N]
    best_gt_iou = tf.reduce_max(overlaps, axis=-2)
    best_anchor = tf.argmax(overlaps, axis=-1, output_type=tf.int32)  # [..., M]
    forced = tf.logical_and(tf.one_hot(best_anchor, n, on_value=True, off_value=False), gt_valid[..., None])
    rows = tf.range(1, m + 1, dtype=tf.int32)[:, None]
    forced_gt = tf.reduce_max(tf.where(forced, rows, 0), axis=-2) - 1  # last forcing row, -1 if none
    is_forced = forced_gt >= 0
    gt_index = tf.where(is_forced, forced_gt, best_gt)
    matched = tf.logical_or(is_forced, best_gt_iou >= threshold)
    boxes = tf.where(matched[..., None], tf.gather(gt_boxes, gt_index, batch_dims=batch_dims), anchors_ltrb)
    labels = tf.where(matched, tf.gather(gt_labels, gt_index, batch_dims=batch_dims), 0)
    return boxes, labels


def encode(matched_ltrb: tf.Tensor, anchors_xywh: tf.Tensor, variances: Sequence[float] = VARIANCES) -> tf.Tensor:
    """Regression targets [..., N, 4]: ((gx-ax)/aw/0.1, (gy-ay)/ah/0.1, log(gw/aw)/0.2, log(gh/ah)/0.2).

    The reference `Loss._loc_vec` formula. Widths are floored at 1e-8 before the log so that a degenerate box gives
    a large finite target instead of -inf (the reference would give -inf; data loaders should drop such boxes).
    """
    g = ltrb_to_xywh(tf.convert_to_tensor(matched_ltrb, tf.float32))
    a = tf.cast(anchors_xywh, tf.float32)
    sxy, swh = variances
    txy = (g[..., :2] - a[..., :2]) / (a[..., 2:] * sxy)
    twh = tf.math.log(tf.maximum(g[..., 2:], _EPS) / a[..., 2:]) / swh
    return tf.concat([txy, twh], axis=-1)


def decode(loc: tf.Tensor, anchors_xywh: tf.Tensor, variances: Sequence[float] = VARIANCES) -> tf.Tensor:
    """Inverse of `encode`: offsets [..., N, 4] -> ltrb boxes [..., N, 4], as the reference `scale_back_batch`.

    Not clipped to the image, like the reference (COCOeval gets the unclipped boxes too).
    """
    loc = tf.cast(loc, tf.float32)
    a = tf.cast(anchors_xywh, tf.float32)
    sxy, swh = variances
    cxy = loc[..., :2] * sxy * a[..., 2:] + a[..., :2]
    wh = tf.exp(loc[..., 2:] * swh) * a[..., 2:]
    return xywh_to_ltrb(tf.concat([cxy, wh], axis=-1))


def smooth_l1(x: tf.Tensor) -> tf.Tensor:
    """Elementwise Huber with delta 1 (torch SmoothL1Loss, beta 1): 0.5 x^2 if |x| < 1 else |x| - 0.5."""
    ax = tf.abs(x)
    return tf.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def ssd_loss(loc_pred: tf.Tensor, cls_logits: tf.Tensor, gt_loc: tf.Tensor, gt_labels: tf.Tensor,
             neg_ratio: int = 3) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-image SSD loss *sum* [B] and positive count [B] (float32); the caller divides by the positives.

    loc_pred [B, N, 4] and gt_loc [B, N, 4] are encoded offsets (`encode`), cls_logits [B, N, C], gt_labels [B, N]
    int (0 = background). As the reference `Loss`: smooth-L1 summed over the 4 offsets of positive anchors, plus
    softmax cross-entropy over the positives and over the hard negatives, i.e. the min(neg_ratio * P, #negatives)
    background anchors with the largest cross-entropy. The reference caps the count at N instead of N - P, which
    differs only when 3P > N - P (it then re-counts some positives); here only negatives are ever mined. The
    reference then computes mean over images of (sum / P) with images with P = 0 contributing 0; to reproduce it,
    use `tf.reduce_mean(tf.math.divide_no_nan(loss, num_pos))`. Computed in float32 whatever the input dtype.
    """
    loc_pred = tf.cast(loc_pred, tf.float32)
    cls_logits = tf.cast(cls_logits, tf.float32)
    gt_loc = tf.cast(gt_loc, tf.float32)
    gt_labels = tf.cast(gt_labels, tf.int32)
    pos = gt_labels > 0
    pos_f = tf.cast(pos, tf.float32)
    num_pos = tf.reduce_sum(pos_f, axis=1)
    loc_loss = tf.reduce_sum(tf.reduce_sum(smooth_l1(loc_pred - gt_loc), axis=-1) * pos_f, axis=1)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=gt_labels, logits=cls_logits)  # [B, N]
    # Rank the negatives by CE, positives last (CE >= 0 > -1); rank = position in the descending order.
    order = tf.argsort(tf.where(pos, -1.0, ce), axis=1, direction="DESCENDING", stable=True)
    rank = tf.argsort(order, axis=1, stable=True)
    num_neg = tf.minimum(neg_ratio * tf.cast(num_pos, tf.int32), tf.shape(pos)[1] - tf.cast(num_pos, tf.int32))
    neg = tf.logical_and(rank < num_neg[:, None], tf.logical_not(pos))
    cls_loss = tf.reduce_sum(ce * (pos_f + tf.cast(neg, tf.float32)), axis=1)
    return loc_loss + cls_loss, num_pos
