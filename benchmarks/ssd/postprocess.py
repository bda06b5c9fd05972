"""SSD eval post-processing on device (decode, per-class NMS, top-k), then host conversion to COCO detections.

What the MLPerf reference does (utils.py `Encoder.decode_batch`/`decode_single`, called by train.py `coco_eval`
with criteria 0.50, max_output 200): softmax over the classes; decode the boxes (unclipped); for each class but
background keep the scores > 0.05, take the **top 200 of them by score before NMS** (max_num), greedy NMS that drops
every box whose IoU with a kept box is >= 0.5; then merge all classes and keep the top 200 by score. Google's v0.7
TF code does the same per-class top-200 before its padded NMS.

This module does exactly that with static shapes (greedy NMS as a `tf.while_loop` over the candidate rank, no
data-dependent shapes, so it runs on any device and under XLA); it differs from the reference only in how exact
score ties are ordered. Memory: an IoU tensor of B x (C-1) x 200 x 200 floats (12.8 MB an image for 81 classes),
so pick the eval batch accordingly. `tf.image.combined_non_max_suppression` was not used: it caps the kept boxes
per class *after* NMS instead of the candidates before it, and it cannot be XLA-compiled (TF 2.21 refuses it under
jit_compile on CPU as an unsupported op).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from benchmarks.ssd.boxes import VARIANCES, decode, iou


def nms_per_class(boxes: tf.Tensor, scores: tf.Tensor, iou_threshold: float = 0.5) -> tf.Tensor:
    """Greedy NMS over candidates already sorted by descending score, independently per leading index.

    boxes [..., K, 4] ltrb, scores [..., K] (a candidate with score <= 0 is never kept). Returns keep [..., K] bool:
    a candidate is kept unless a kept, higher-ranked candidate overlaps it with IoU >= iou_threshold (the reference
    keeps only IoU < criteria).
    """
    k = boxes.shape[-2]
    overlaps = iou(boxes, boxes)  # [..., K, K]
    candidate = scores > 0.0
    rank = tf.range(k)

    def body(i, keep):
        hits = tf.logical_and(keep, tf.gather(overlaps, i, axis=-1) >= iou_threshold)  # keep holds ranks < i only
        keep_i = tf.logical_and(tf.gather(candidate, i, axis=-1), tf.logical_not(tf.reduce_any(hits, axis=-1)))
        return i + 1, tf.logical_or(keep, tf.logical_and(tf.equal(rank, i), keep_i[..., None]))

    _, keep = tf.while_loop(lambda i, _: i < k, body, (tf.constant(0), tf.zeros_like(candidate)),
                            maximum_iterations=k)
    return keep


def postprocess(loc_pred: tf.Tensor, cls_logits: tf.Tensor, anchors_xywh: tf.Tensor, score_threshold: float = 0.05,
                iou_threshold: float = 0.5, pre_nms_top_k: int = 200, max_detections: int = 200,
                variances: Sequence[float] = VARIANCES) -> dict[str, tf.Tensor]:
    """Detections from raw head outputs, per image, with static shapes.

    loc_pred [B, N, 4] encoded offsets, cls_logits [B, N, C] (class 0 = background), anchors_xywh [N, 4].
    Returns boxes [B, D, 4] ltrb normalized (unclipped), scores [B, D] float32, classes [B, D] int32 (contiguous
    1..C-1) and num_detections [B] int32, D = max_detections; the valid rows come first, by descending score, and
    the rest are zero.
    """
    boxes = decode(loc_pred, anchors_xywh, variances)  # [B, N, 4]
    probs = tf.nn.softmax(tf.cast(cls_logits, tf.float32), axis=-1)[..., 1:]  # [B, N, C-1]
    num_fg = probs.shape[-1]
    k = min(pre_nms_top_k, probs.shape[1])
    top_scores, top_idx = tf.math.top_k(tf.transpose(probs, [0, 2, 1]), k=k)  # [B, C-1, k], descending
    top_scores = tf.where(top_scores > score_threshold, top_scores, 0.0)
    cand = tf.gather(boxes, top_idx, batch_dims=1)  # [B, C-1, k, 4]
    keep = nms_per_class(cand, top_scores, iou_threshold)
    flat_scores = tf.reshape(tf.where(keep, top_scores, 0.0), [-1, num_fg * k])
    flat_boxes = tf.reshape(cand, [-1, num_fg * k, 4])
    if num_fg * k < max_detections:
        pad = max_detections - num_fg * k
        flat_scores = tf.pad(flat_scores, [[0, 0], [0, pad]])
        flat_boxes = tf.pad(flat_boxes, [[0, 0], [0, pad], [0, 0]])
    scores, idx = tf.math.top_k(flat_scores, k=max_detections)
    valid = scores > 0.0
    classes = tf.where(valid, idx // k + 1, 0)
    out_boxes = tf.where(valid[..., None], tf.gather(flat_boxes, idx, batch_dims=1), 0.0)
    return {"boxes": out_boxes, "scores": scores, "classes": classes,
            "num_detections": tf.reduce_sum(tf.cast(valid, tf.int32), axis=1)}


def to_coco_detections(image_ids: np.ndarray, image_sizes: np.ndarray, boxes: np.ndarray, scores: np.ndarray,
                       classes: np.ndarray, num_detections: np.ndarray,
                       category_ids: Sequence[int]) -> np.ndarray:
    """Host side: `postprocess` outputs (as numpy) -> [K, 7] rows (image_id, x, y, w, h, score, category_id).

    image_sizes [B, 2] is (height, width) of each original image: the normalized ltrb boxes are scaled to absolute
    pixel xywh as the reference's coco_eval does; category_ids[c - 1] is the raw COCO id of contiguous class c.
    """
    cats = np.asarray(category_ids, np.float64)
    rows = []
    for b in range(len(image_ids)):
        n = int(num_detections[b])
        if n == 0:
            continue
        h, w = float(image_sizes[b][0]), float(image_sizes[b][1])
        l, t, r, btm = (np.asarray(boxes[b][:n], np.float64).T * np.array([[w], [h], [w], [h]]))
        rows.append(np.stack([np.full(n, float(image_ids[b])), l, t, r - l, btm - t,
                              np.asarray(scores[b][:n], np.float64), cats[np.asarray(classes[b][:n]) - 1]], axis=1))
    return np.concatenate(rows, axis=0) if rows else np.zeros((0, 7), np.float64)
