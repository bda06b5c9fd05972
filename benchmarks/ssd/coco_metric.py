"""COCO bbox AP with pycocotools, as the MLPerf SSD reference's coco_eval (and Google's v0.7 coco_metric) compute it.

The ground truth is a `pycocotools.coco.COCO` built in memory (from arrays or a dict) or loaded from an
`instances_val2017.json`-style file; detections are [K, 7] rows (image_id, x, y, w, h, score, category_id) in
absolute pixel xywh with raw category ids, the form `COCO.loadRes` takes. pycocotools' progress prints are captured.
Also the map between raw COCO category ids (1..90, 80 used) and the contiguous class ids 1..80 of the model (0 is
background), which Google's TF code calls CLASS_MAP.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from harness.errors import HarnessError

_COCO_IDS = ([*range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70, *range(72, 83),
              *range(84, 91)])


def coco_category_ids() -> list[int]:
    """The 80 category ids COCO 2017 detection uses, ascending (the raw ids run 1..90 with 10 gaps)."""
    return list(_COCO_IDS)


class CategoryMap:
    """Raw category ids <-> contiguous labels 1..len(ids) (in ascending id order); 0 stays 0 (background/padding)."""

    def __init__(self, category_ids: Iterable[int]):
        ids = sorted(int(c) for c in category_ids)
        if not ids or ids[0] <= 0 or len(set(ids)) != len(ids):
            raise HarnessError(f"category ids must be distinct positive integers, got {ids}")
        self.category_ids = ids
        self._to_label = np.zeros(ids[-1] + 1, np.int32)
        self._to_label[ids] = np.arange(1, len(ids) + 1)

    @property
    def num_classes(self) -> int:
        """Number of foreground classes; a model head needs num_classes + 1 outputs (background)."""
        return len(self.category_ids)

    def to_label(self, category_ids) -> np.ndarray:
        """Raw ids (any shape; 0 = padding) -> contiguous labels int32; an id outside the map raises HarnessError."""
        ids = np.asarray(category_ids, np.int64)
        known = (ids >= 0) & (ids < len(self._to_label))
        labels = self._to_label[np.where(known, ids, 0)]
        bad = (ids != 0) & ((~known) | (labels == 0))
        if bad.any():
            raise HarnessError(f"category id {int(ids[bad].flat[0])} is not one of the {self.num_classes} mapped ids "
                               f"({self.category_ids[0]}..{self.category_ids[-1]}); check the annotations' categories")
        return labels

    def to_category(self, labels) -> np.ndarray:
        """Contiguous labels (any shape; 0 = background) -> raw ids int32; a label outside 0..num_classes raises."""
        labels = np.asarray(labels, np.int64)
        bad = (labels < 0) | (labels > self.num_classes)
        if bad.any():
            raise HarnessError(f"class label {int(labels[bad].flat[0])} is outside 0..{self.num_classes}")
        return np.asarray([0, *self.category_ids], np.int32)[labels]


def coco_category_map() -> CategoryMap:
    """The 80-class map of COCO 2017 (1 -> 1, ..., 13 -> 12, ..., 90 -> 80)."""
    return CategoryMap(_COCO_IDS)


def ground_truth_from_dict(dataset: dict) -> COCO:
    """A COCO object from an in-memory `instances_*.json`-style dict (images, annotations, categories)."""
    for key in ("images", "annotations", "categories"):
        if key not in dataset:
            raise HarnessError(f"COCO ground truth has no '{key}' list")
    gt = COCO()
    gt.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return gt


def ground_truth_from_arrays(image_ids: Sequence[int], image_sizes: np.ndarray, ann_image_ids: Sequence[int],
                             boxes_xywh: np.ndarray, category_ids: Sequence[int],
                             categories: Sequence[int] | None = None, iscrowd: Sequence[int] | None = None,
                             areas: Sequence[float] | None = None) -> COCO:
    """A COCO ground truth from flat arrays.

    image_ids [I] with image_sizes [I, 2] = (height, width) px; one row per box: ann_image_ids [K], boxes_xywh [K, 4]
    absolute pixel (x, y, w, h), category_ids [K] raw ids. categories defaults to the ids present; iscrowd defaults
    to 0 and areas to w*h (the json files carry the mask area instead, which only changes AP_small/medium/large).
    """
    image_ids = [int(i) for i in image_ids]
    sizes = np.asarray(image_sizes).reshape(-1, 2)
    boxes = np.asarray(boxes_xywh, np.float64).reshape(-1, 4)
    k = len(boxes)
    if len(sizes) != len(image_ids) or len(ann_image_ids) != k or len(category_ids) != k:
        raise HarnessError(f"ground truth arrays disagree: {len(image_ids)} image ids, {len(sizes)} sizes, "
                           f"{len(ann_image_ids)} box image ids, {k} boxes, {len(category_ids)} category ids")
    unknown = set(int(i) for i in ann_image_ids) - set(image_ids)
    if unknown:
        raise HarnessError(f"ground truth boxes refer to image ids not in the image list, e.g. {min(unknown)}")
    cats = sorted(set(int(c) for c in (category_ids if categories is None else categories)))
    crowd = np.zeros(k, np.int64) if iscrowd is None else np.asarray(iscrowd)
    area = boxes[:, 2] * boxes[:, 3] if areas is None else np.asarray(areas, np.float64)
    dataset = {
        "images": [{"id": i, "height": int(h), "width": int(w)} for i, (h, w) in zip(image_ids, sizes)],
        "annotations": [{"id": a + 1, "image_id": int(ann_image_ids[a]), "category_id": int(category_ids[a]),
                         "bbox": [float(v) for v in boxes[a]], "area": float(area[a]), "iscrowd": int(crowd[a])}
                        for a in range(k)],
        "categories": [{"id": c, "name": str(c)} for c in cats],
    }
    return ground_truth_from_dict(dataset)


def load_ground_truth(path: str, image_ids: Sequence[int] | None = None) -> COCO:
    """Load an `instances_val2017.json`-style file; with image_ids, its image ids must be exactly that set."""
    if not os.path.isfile(path):
        raise HarnessError(f"COCO annotation file not found: {path} (give the path to instances_val2017.json)")
    try:
        with open(path) as f:
            dataset = json.load(f)
    except (OSError, ValueError) as e:
        raise HarnessError(f"cannot read COCO annotation file {path}: {e}") from None
    check_annotation_structure(dataset, path)
    gt = ground_truth_from_dict(dataset)
    if image_ids is not None:
        want, have = set(int(i) for i in image_ids), set(gt.getImgIds())
        if want != have:
            missing, extra = sorted(want - have), sorted(have - want)
            raise HarnessError(f"image ids of {path} do not match the eval data: {len(missing)} eval images missing "
                               f"from it (e.g. {missing[:3]}), {len(extra)} extra in it (e.g. {extra[:3]})")
    return gt


def check_annotation_structure(dataset: Any, path: str) -> None:
    """The fields COCOeval and the category map read, so a malformed file fails at load in one line, not at the
    first eval (after the log exists) with a KeyError."""
    if not isinstance(dataset, dict):
        raise HarnessError(f"COCO annotation file {path} is not a JSON object")
    for key in ("images", "annotations", "categories"):
        if not isinstance(dataset.get(key), list):
            raise HarnessError(f"COCO annotation file {path} has no '{key}' list")
    if not dataset["annotations"]:
        raise HarnessError(f"COCO annotation file {path} has no annotations: AP would be undefined")
    for what, items, fields in (("image", dataset["images"], ("id",)),
                                ("category", dataset["categories"], ("id", "name")),
                                ("annotation", dataset["annotations"], ("image_id", "category_id", "bbox"))):
        for item in items:
            missing = [f for f in fields if not isinstance(item, dict) or f not in item]
            if missing:
                raise HarnessError(f"COCO annotation file {path}: {'an' if what[0] in 'aeiou' else 'a'} {what} lacks "
                                   f"{', '.join(missing)}: "
                                   f"{str(item)[:120]}")
            if what == "annotation" and (not isinstance(item["bbox"], list) or len(item["bbox"]) != 4):
                raise HarnessError(f"COCO annotation file {path}: annotation {item.get('id')} has bbox "
                                   f"{item['bbox']!r}, not [x, y, width, height]")


def evaluate(gt: COCO, detections: np.ndarray) -> float:
    """COCO AP@[.5:.95] (COCOeval bbox stats[0], area all, maxDets 100) of [K, 7] detections; none gives 0.0."""
    det = np.asarray(detections, np.float64)
    if det.size == 0:
        return 0.0
    if det.ndim != 2 or det.shape[1] != 7:
        raise HarnessError(f"detections must be [K, 7] (image_id, x, y, w, h, score, category_id), got {det.shape}")
    if not gt.getAnnIds():
        raise HarnessError("COCO ground truth has no annotations, so AP is undefined")
    unknown = set(det[:, 0].astype(np.int64).tolist()) - set(gt.getImgIds())
    if unknown:
        raise HarnessError(f"{len(unknown)} detection image ids are not in the ground truth, e.g. {min(unknown)}")
    with contextlib.redirect_stdout(io.StringIO()):
        res = gt.loadRes(det)
        ev = COCOeval(gt, res, iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[0])
