"""SSD default boxes (anchors), following the MLPerf reference `DefaultBoxes` (single_stage_detector/ssd/utils.py).

Layout, used everywhere in benchmarks/ssd: an anchor array is float32 [N, 4] of **(cx, cy, w, h)** normalized to
[0, 1] of the image, each value clipped to [0, 1] *before* any conversion to ltrb, as the reference does. Order (the
reference's, which a head's flattening must follow, cf. Google's v0.7 `concat_outputs`): feature map by feature map;
within a map, box kind outermost ([small square, large square, then (w, h), (h, w) for each aspect ratio]), then
cell row i, then cell column j.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from harness.errors import HarnessError

SSD300 = dict(image_size=300, feature_sizes=(38, 19, 10, 5, 3, 1), steps=(8, 16, 32, 64, 100, 300),
              scales=(21, 45, 99, 153, 207, 261, 315), aspect_ratios=((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)))
"""The MLPerf SSD300 configuration (reference `dboxes300_coco`): 8732 anchors."""

TINY64 = dict(image_size=64, feature_sizes=(8, 4, 2, 1), steps=(8, 16, 32, 64), scales=(12, 22, 36, 52, 64),
              aspect_ratios=((2,), (2,), (2,), (2,)))
"""The tiny configuration of the synthetic shapes task (64 px, 4 anchors a cell): 340 anchors."""

TINY128 = dict(image_size=128, feature_sizes=(16, 8, 4, 2, 1), steps=(8, 16, 32, 64, 128),
               scales=(12, 24, 44, 72, 104, 128), aspect_ratios=((2,), (2,), (2,), (2,), (2,)))
"""A 128 px variant of TINY64 with one more map (1364 anchors); the scales are this project's choice."""


def anchors_per_location(aspect_ratios: Sequence[Sequence[float]]) -> list[int]:
    """Anchors per cell of each map: two squares plus a (w, h) and (h, w) pair per aspect ratio (4 or 6 in SSD300)."""
    return [2 + 2 * len(r) for r in aspect_ratios]


def _check(image_size, feature_sizes, steps, scales, aspect_ratios) -> None:
    n = len(feature_sizes)
    if n == 0:
        raise HarnessError("anchors: feature_sizes is empty; give at least one feature map size")
    if len(steps) != n or len(aspect_ratios) != n or len(scales) != n + 1:
        raise HarnessError(f"anchors: {n} feature_sizes need {n} steps, {n} aspect_ratios and {n + 1} scales; got "
                           f"{len(steps)}, {len(aspect_ratios)} and {len(scales)}")
    if image_size <= 0 or min(feature_sizes) <= 0 or min(steps) <= 0 or min(scales) <= 0:
        raise HarnessError("anchors: image_size, feature_sizes, steps and scales must all be positive")
    if any(a <= 0 for r in aspect_ratios for a in r):
        raise HarnessError(f"anchors: aspect ratios must be positive, got {aspect_ratios}")


def default_boxes(image_size: int = 300, feature_sizes: Sequence[int] = SSD300["feature_sizes"],
                  steps: Sequence[float] = SSD300["steps"], scales: Sequence[float] = SSD300["scales"],
                  aspect_ratios: Sequence[Sequence[float]] = SSD300["aspect_ratios"]) -> np.ndarray:
    """Anchors [N, 4] float32 as clipped (cx, cy, w, h) in the reference order (see the module docstring).

    As in the reference, the centre of cell (i, j) of map k is ((j + 0.5) / f_k, (i + 0.5) / f_k) with
    f_k = image_size / steps[k] (not 1 / feature_size), the small square has side scales[k] / image_size and the
    large one sqrt(scales[k] * scales[k+1]) / image_size; an aspect ratio a adds (s*sqrt(a), s/sqrt(a)) and its
    transpose, s being the small side.
    """
    _check(image_size, feature_sizes, steps, scales, aspect_ratios)
    out = []
    for k, size in enumerate(feature_sizes):
        fk = image_size / steps[k]
        s1 = scales[k] / image_size
        s2 = math.sqrt(s1 * scales[k + 1] / image_size)
        kinds = [(s1, s1), (s2, s2)]
        for a in aspect_ratios[k]:
            w, h = s1 * math.sqrt(a), s1 / math.sqrt(a)
            kinds += [(w, h), (h, w)]
        centres = (np.arange(size, dtype=np.float64) + 0.5) / fk
        cy, cx = np.meshgrid(centres, centres, indexing="ij")  # row i varies slowest, column j fastest
        for w, h in kinds:
            block = np.stack([cx.ravel(), cy.ravel(), np.full(size * size, w), np.full(size * size, h)], axis=1)
            out.append(block)
    return np.clip(np.concatenate(out, axis=0), 0.0, 1.0).astype(np.float32)


def xywh_to_ltrb(boxes: np.ndarray) -> np.ndarray:
    """(cx, cy, w, h) -> (left, top, right, bottom), same dtype; works on any [..., 4] array."""
    boxes = np.asarray(boxes)
    cxy, wh = boxes[..., :2], boxes[..., 2:]
    return np.concatenate([cxy - 0.5 * wh, cxy + 0.5 * wh], axis=-1)


def ltrb_to_xywh(boxes: np.ndarray) -> np.ndarray:
    """(left, top, right, bottom) -> (cx, cy, w, h), same dtype; works on any [..., 4] array."""
    boxes = np.asarray(boxes)
    lt, rb = boxes[..., :2], boxes[..., 2:]
    return np.concatenate([0.5 * (lt + rb), rb - lt], axis=-1)
