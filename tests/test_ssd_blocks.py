"""SSD building blocks (benchmarks/ssd) against values computed by hand and small numpy references."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import anchors as A
from benchmarks.ssd import boxes as B
from benchmarks.ssd import coco_metric as CM
from benchmarks.ssd import postprocess as P
from benchmarks.ssd import synthetic_shapes as S
from harness.errors import HarnessError

pytestmark = pytest.mark.quick


# ---------------------------------------------------------------- anchors

def test_reference_anchor_set_count_order_and_ends():
    a = A.default_boxes()
    assert a.shape == (8732, 4) and a.dtype == np.float32
    assert A.anchors_per_location(A.SSD300["aspect_ratios"]) == [4, 6, 6, 6, 4, 4]
    # First box: map 0 (38x38, step 8, so f = 300/8 = 37.5), small square, cell (0, 0):
    #   cx = cy = 0.5 / 37.5 = 0.013333; w = h = 21 / 300 = 0.07.
    np.testing.assert_allclose(a[0], [0.5 / 37.5, 0.5 / 37.5, 0.07, 0.07], rtol=1e-6)
    # Second box: same kind, cell (0, 1): the column varies fastest, cx = 1.5 / 37.5 = 0.04.
    np.testing.assert_allclose(a[1], [0.04, 0.5 / 37.5, 0.07, 0.07], rtol=1e-6)
    # Box 38*38 = 1444: the box kind is outside the cells, so this is the large square of cell (0, 0):
    #   w = h = sqrt(21 * 45) / 300 = sqrt(945) / 300 = 0.1024695.
    np.testing.assert_allclose(a[1444], [0.5 / 37.5, 0.5 / 37.5, 0.1024695, 0.1024695], rtol=1e-6)
    # Last box: map 5 (1x1, step 300, f = 1), cell (0, 0), the last kind = (h, w) of aspect ratio 2 with
    #   s = 261/300 = 0.87: (0.87 / sqrt(2), 0.87 * sqrt(2)) = (0.6151829, 1.2303658), and the clip to [0, 1]
    #   makes it (0.6151829, 1.0); centre (0.5 / 1, 0.5 / 1).
    np.testing.assert_allclose(a[-1], [0.5, 0.5, 0.6151829, 1.0], rtol=1e-6)
    # Clipped before the ltrb conversion: l = 0.5 - 0.6151829/2 = 0.1924086, t = 0.5 - 1.0/2 = 0.
    np.testing.assert_allclose(A.xywh_to_ltrb(a[-1]), [0.1924086, 0.0, 0.8075914, 1.0], rtol=1e-6)
    assert a.min() >= 0.0 and a.max() <= 1.0


def test_small_anchor_variants_and_validation():
    assert A.default_boxes(**A.TINY64).shape == (340, 4)  # (64 + 16 + 4 + 1) * 4
    assert A.default_boxes(**A.TINY128).shape == (1364, 4)  # (256 + 64 + 16 + 4 + 1) * 4
    a = A.default_boxes(**A.TINY64)
    np.testing.assert_allclose(a[0], [0.0625, 0.0625, 12 / 64, 12 / 64])  # (0.5 / (64/8), ..., 12/64)
    with pytest.raises(HarnessError, match="scales"):
        A.default_boxes(128, (16, 8), (8, 16), (12, 24), ((2,), (2,)))
    with pytest.raises(HarnessError, match="steps"):
        A.default_boxes(128, (16, 8), (8,), (12, 24, 44), ((2,), (2,)))
    with pytest.raises(HarnessError, match="positive"):
        A.default_boxes(128, (16, 0), (8, 16), (12, 24, 44), ((2,), (2,)))
    with pytest.raises(HarnessError, match="aspect"):
        A.default_boxes(128, (16, 8), (8, 16), (12, 24, 44), ((2,), (-2,)))


def test_box_layout_conversions_round_trip():
    a = A.default_boxes(**A.TINY64)
    np.testing.assert_allclose(A.ltrb_to_xywh(A.xywh_to_ltrb(a)), a, atol=1e-7)
    np.testing.assert_allclose(B.xywh_to_ltrb(tf.constant(a)).numpy(), A.xywh_to_ltrb(a), atol=1e-7)
    np.testing.assert_allclose(B.ltrb_to_xywh(B.xywh_to_ltrb(tf.constant(a))).numpy(), a, atol=1e-7)


# ---------------------------------------------------------------- IoU, matching, coding

def test_iou_by_hand():
    a = tf.constant([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    b = tf.constant([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 6.0, 6.0]])
    # overlap 1x1 = 1, union 4 + 4 - 1 = 7; identical -> 1; disjoint -> 0; an empty box -> 0, not NaN
    np.testing.assert_allclose(B.iou(a, b).numpy(), [[1 / 7, 1.0, 0.0], [0.0, 0.0, 0.0]], rtol=1e-6)


ANCHORS5 = np.array([[0.0, 0.0, 0.2, 0.2],
                     [0.5, 0.5, 0.9, 0.9],
                     [0.5, 0.5, 0.8, 0.8],
                     [0.0, 0.6, 0.3, 1.0],
                     [0.6, 0.0, 1.0, 0.4]], np.float32)


def test_match_forces_best_anchor_and_ignores_padding():
    gt = np.array([[0.0, 0.0, 0.4, 0.4],    # IoU with anchor 0 = 0.04/0.16 = 0.25 < 0.5, its best: forced there
                   [0.5, 0.5, 0.9, 0.9],    # anchor 1: IoU 1; anchor 2: 0.09/0.16 = 0.5625 >= 0.5
                   [0.6, 0.0, 1.0, 0.4]],   # equals anchor 4 exactly, but a padding row
                  np.float32)
    boxes, labels = B.match(gt, [7, 3, 5], [True, True, False], ANCHORS5)
    np.testing.assert_array_equal(labels.numpy(), [7, 3, 3, 0, 0])
    np.testing.assert_allclose(boxes.numpy(), [gt[0], gt[1], gt[1], ANCHORS5[3], ANCHORS5[4]])
    # With only padding rows (or none at all) every anchor is background and keeps its own box.
    for m in (3, 0):
        boxes, labels = B.match(np.zeros((m, 4), np.float32), np.zeros(m, np.int32), np.zeros(m, bool), ANCHORS5)
        np.testing.assert_array_equal(labels.numpy(), 0)
        np.testing.assert_allclose(boxes.numpy(), ANCHORS5)


def test_match_shared_best_anchor_goes_to_the_later_row_as_in_the_reference():
    # Both boxes' best anchor is 1 (IoU 1.0 and 0.1225/0.16 = 0.766): the reference's index assignment gives it to
    # the later row; anchor 2 then prefers row 1 too (0.09/0.1225 = 0.735 > 0.5625), so row 0 matches nothing.
    gt = np.array([[0.5, 0.5, 0.9, 0.9], [0.5, 0.5, 0.85, 0.85]], np.float32)
    _, labels = B.match(gt, [1, 2], [True, True], ANCHORS5)
    np.testing.assert_array_equal(labels.numpy(), [0, 2, 2, 0, 0])


def test_match_inside_tf_function_on_reference_anchors():
    anchors_ltrb = A.xywh_to_ltrb(A.default_boxes())
    gt = np.array([[0.1, 0.1, 0.12, 0.4], [0.3, 0.2, 0.9, 0.95], [0, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    valid = np.array([True, True, False, False])
    fn = tf.function(lambda g, l, v: B.match(g, l, v, anchors_ltrb))
    boxes, labels = fn(tf.constant(gt), tf.constant([4, 9, 0, 0]), tf.constant(valid))
    assert boxes.shape == (8732, 4) and labels.shape == (8732,)
    ious = B.iou(gt[:2], anchors_ltrb).numpy()
    expect = set(np.flatnonzero(ious[0] >= 0.5)) | {int(ious[0].argmax())}
    assert ious[0].max() < 0.5  # a thin box: only the forced match
    assert set(np.flatnonzero(labels.numpy() == 4)) == expect
    assert set(np.flatnonzero(labels.numpy() == 9)) == set(np.flatnonzero(ious[1] >= 0.5)) | {int(ious[1].argmax())}


def test_encode_by_hand_and_round_trip():
    anchor = np.array([[0.5, 0.5, 0.2, 0.2]], np.float32)
    g = B.xywh_to_ltrb(tf.constant([[0.52, 0.46, 0.3, 0.1]]))
    # tx = 0.02 / (0.2 * 0.1) = 1; ty = -0.04 / 0.02 = -2; tw = log(0.3/0.2) / 0.2; th = log(0.1/0.2) / 0.2
    np.testing.assert_allclose(B.encode(g, anchor).numpy(),
                               [[1.0, -2.0, math.log(1.5) / 0.2, math.log(0.5) / 0.2]], rtol=1e-5, atol=1e-5)
    a = A.default_boxes()
    rng = np.random.default_rng(0)
    lt = rng.uniform(0, 0.7, (8732, 2))
    gt = np.concatenate([lt, lt + rng.uniform(0.01, 0.3, (8732, 2))], axis=1).astype(np.float32)
    np.testing.assert_allclose(B.decode(B.encode(gt, a), a).numpy(), gt, atol=2e-6)
    # An unmatched anchor carries its own box and encodes to zeros.
    np.testing.assert_allclose(B.encode(A.xywh_to_ltrb(a), a).numpy(), 0.0, atol=2e-4)


# ---------------------------------------------------------------- loss

def _np_ce(logits, labels):
    z = logits - logits.max(-1, keepdims=True)
    return np.log(np.exp(z).sum(-1)) - np.take_along_axis(z, labels[..., None], -1)[..., 0]


def test_ssd_loss_hard_negative_mining_and_smooth_l1():
    rng = np.random.default_rng(1)
    b, n, c = 3, 20, 4
    labels = np.zeros((b, n), np.int32)
    labels[0, [2, 9]] = [1, 3]              # P = 2 -> 6 of 18 negatives
    labels[1, :6] = 2                       # P = 6 -> min(18, 14) = all 14 negatives
    logits = rng.normal(size=(b, n, c)).astype(np.float32) * 2  # image 2: no positives -> loss 0
    loc = np.zeros((b, n, 4), np.float32)
    loc[0, 2] = [0.5, -2.0, 0.0, 0.0]       # 0.5 * 0.25 + (2 - 0.5) = 1.625 on a positive
    loc[0, 5] = [9.0, 9.0, 9.0, 9.0]        # on a negative: ignored
    logits_t = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(logits_t)
        loss, num_pos = B.ssd_loss(tf.constant(loc), logits_t, tf.zeros_like(loc), tf.constant(labels))
        total = tf.reduce_sum(loss)
    np.testing.assert_array_equal(num_pos.numpy(), [2, 6, 0])
    ce = _np_ce(logits.astype(np.float64), labels)
    expect = []
    for i, pos in enumerate([2, 6, 0]):
        neg_ce = np.sort(ce[i][labels[i] == 0])[::-1][:min(3 * pos, n - pos)]
        expect.append(ce[i][labels[i] > 0].sum() + neg_ce.sum())
    expect[0] += 1.625
    np.testing.assert_allclose(loss.numpy(), expect, rtol=1e-5)
    # Exactly P + min(3P, N - P) anchors get a classification gradient.
    touched = (np.abs(tape.gradient(total, logits_t).numpy()).sum(-1) > 0).sum(-1)
    np.testing.assert_array_equal(touched, [2 + 6, 6 + 14, 0])


def test_ssd_loss_compiles_with_xla():
    rng = np.random.default_rng(2)
    args = (rng.normal(size=(2, 340, 4)), rng.normal(size=(2, 340, 4)), rng.normal(size=(2, 340, 4)),
            rng.integers(0, 4, (2, 340)) * (rng.random((2, 340)) < 0.1))
    args = [tf.constant(x, tf.float32) for x in args[:3]] + [tf.constant(args[3], tf.int32)]
    eager = B.ssd_loss(*args)
    xla = tf.function(B.ssd_loss, jit_compile=True)(*args)
    for e, x in zip(eager, xla):
        np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=1e-5)


# ---------------------------------------------------------------- post-processing

def _np_iou(box, boxes):
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    union = np.prod(box[2:] - box[:2]) + np.prod(boxes[:, 2:] - boxes[:, :2], axis=1) - inter
    return inter / union


def _np_reference_decode_single(boxes, probs, criteria, max_output, max_num):
    """The reference's decode_single, restated: per class > 0.05, top max_num, greedy NMS, merged top max_output."""
    out = []
    for c in range(1, probs.shape[1]):
        mask = probs[:, c] > 0.05
        bx, sc = boxes[mask], probs[mask, c]
        order = list(np.argsort(-sc, kind="stable")[:max_num])
        while order:
            i = order[0]
            out.append((sc[i], c, bx[i]))
            order = [j for j in order[1:] if _np_iou(bx[i], bx[j][None])[0] < criteria]
    out.sort(key=lambda r: -r[0])
    return out[:max_output]


@pytest.mark.parametrize("max_det", [15, 60])
def test_postprocess_matches_numpy_reference_nms(max_det):
    rng = np.random.default_rng(3)
    n, c = 80, 4
    centres = rng.uniform(0.35, 0.65, (n, 2))
    anchors = np.concatenate([centres, rng.uniform(0.1, 0.3, (n, 2))], 1).astype(np.float32)
    anchors[40:] = anchors[:40] + rng.normal(0, 0.02, (40, 4)).astype(np.float32)  # near duplicates: NMS matters
    loc = rng.normal(0, 0.5, (2, n, 4)).astype(np.float32)
    logits = (rng.normal(0, 2.0, (2, n, c))).astype(np.float32)
    logits[1, :, 1:] -= 8.0  # image 1: only 7 scores above 0.05
    # Image 0 has 54-60 candidates a class: the per-class cap of 12 binds (36 candidates, 31 survive NMS; with no
    # cap 81 would), and so does the final cap of 15 but not that of 60.
    out = P.postprocess(loc, logits, anchors, pre_nms_top_k=12, max_detections=max_det)
    out_xla = tf.function(lambda l, g: P.postprocess(l, g, anchors, pre_nms_top_k=12, max_detections=max_det),
                          jit_compile=True)(loc, logits)
    boxes = B.decode(loc, anchors).numpy().astype(np.float64)
    probs = tf.nn.softmax(logits).numpy().astype(np.float64)
    for i, expect_count in enumerate([min(31, max_det), 7]):
        ref = _np_reference_decode_single(boxes[i], probs[i], criteria=0.5, max_output=max_det, max_num=12)
        k = int(out["num_detections"][i])
        assert k == len(ref) == expect_count and int(out_xla["num_detections"][i]) == k
        np.testing.assert_allclose(out["scores"][i, :k], [r[0] for r in ref], rtol=1e-5)
        np.testing.assert_array_equal(out["classes"][i, :k], [r[1] for r in ref])
        np.testing.assert_allclose(out["boxes"][i, :k], np.array([r[2] for r in ref]).reshape(-1, 4), atol=1e-5)
        assert np.all(out["scores"][i, k:] == 0) and np.all(out["classes"][i, k:] == 0)
        assert np.all(out["boxes"][i, k:] == 0)
        for key in out:
            np.testing.assert_allclose(out_xla[key][i], out[key][i], rtol=1e-5, atol=1e-6)
    assert out["boxes"].shape == (2, max_det, 4) and out["classes"].dtype == tf.int32


def test_postprocess_hand_case():
    # Two anchors with identical boxes and one far away; class 1 wins on all three, class 2 is always < 0.05.
    anchors = np.array([[0.3, 0.3, 0.2, 0.2], [0.3, 0.3, 0.2, 0.2], [0.8, 0.8, 0.1, 0.1]], np.float32)
    probs = np.array([[0.1, 0.89, 0.01], [0.2, 0.79, 0.01], [0.96, 0.04, 0.0]])
    out = P.postprocess(np.zeros((1, 3, 4), np.float32), np.log(probs + 1e-12)[None].astype(np.float32), anchors)
    assert out["boxes"].shape == (1, 200, 4)
    assert int(out["num_detections"][0]) == 1  # the duplicate is suppressed, 0.04 is under the threshold
    np.testing.assert_allclose(out["scores"][0, :1], [0.89], rtol=1e-5)
    np.testing.assert_allclose(out["boxes"][0, 0], [0.2, 0.2, 0.4, 0.4], atol=1e-6)


def test_to_coco_detections_by_hand():
    boxes = np.zeros((2, 3, 4), np.float32)
    boxes[0, 0] = [0.1, 0.2, 0.5, 0.6]
    rows = P.to_coco_detections([7, 8], [[100, 200], [50, 50]], boxes, np.array([[0.9, 0, 0], [0, 0, 0]]),
                                np.array([[2, 0, 0], [0, 0, 0]]), [1, 0], category_ids=[1, 5, 9])
    # width 200, height 100: x = 0.1 * 200, y = 0.2 * 100, w = 0.4 * 200, h = 0.4 * 100; class 2 -> id 5
    np.testing.assert_allclose(rows, [[7, 20, 20, 80, 40, 0.9, 5]], rtol=1e-6)
    assert P.to_coco_detections([1], [[9, 9]], boxes[:1], np.zeros((1, 3)), np.zeros((1, 3), int), [0],
                                [1]).shape == (0, 7)


# ---------------------------------------------------------------- COCO metric

def _two_box_gt():
    return CM.ground_truth_from_arrays(image_ids=[1, 2], image_sizes=[[100, 100], [100, 100]], ann_image_ids=[1, 1],
                                       boxes_xywh=[[10, 10, 30, 30], [50, 50, 40, 40]], category_ids=[5, 5])


def test_coco_ap_by_hand():
    gt = _two_box_gt()
    both = np.array([[1, 10, 10, 30, 30, 0.9, 5], [1, 50, 50, 40, 40, 0.8, 5]])
    assert CM.evaluate(gt, both) == pytest.approx(1.0)
    # One of two boxes found, first in rank: recall 0.5 with precision 1, so 51 of the 101 recall points
    # (0.00 .. 0.50) have precision 1 at every IoU threshold: AP = 51/101.
    assert CM.evaluate(gt, both[:1]) == pytest.approx(51 / 101)
    # A false positive ranked above it (on the image without boxes): precision 0.5 at recall 0.5 -> 0.5 * 51/101.
    fp_first = np.array([[2, 0, 0, 10, 10, 0.95, 5], [1, 10, 10, 30, 30, 0.9, 5]])
    assert CM.evaluate(gt, fp_first) == pytest.approx(0.5 * 51 / 101)
    # The first box found perfectly, the second one ranked below it with IoU 0.72 (40 x 28.8 inside 40 x 40): at
    # the 5 thresholds 0.50..0.70 both match (AP 1), at the 5 from 0.75 only the first does (AP 51/101, as above):
    # AP = (5 * 1.0 + 5 * 51/101) / 10.
    partial = np.array([[1, 10, 10, 30, 30, 0.9, 5], [1, 50, 50, 40, 28.8, 0.8, 5]])
    assert CM.evaluate(gt, partial) == pytest.approx((5 + 5 * 51 / 101) / 10)
    assert CM.evaluate(gt, np.zeros((0, 7))) == 0.0
    with pytest.raises(HarnessError, match="not in the ground truth"):
        CM.evaluate(gt, np.array([[3, 10, 10, 30, 30, 0.9, 5]]))
    with pytest.raises(HarnessError, match=r"\[K, 7\]"):
        CM.evaluate(gt, np.zeros((2, 6)))


def test_evaluate_prints_nothing(capsys):
    CM.evaluate(_two_box_gt(), np.array([[1, 10, 10, 30, 30, 0.9, 5]]))
    assert capsys.readouterr().out == ""


def test_in_memory_ground_truth_equals_json(tmp_path):
    data = S.generate(40, "val", seed=1, image_size=64, empty_fraction=0.1)
    gt_dict = S.coco_ground_truth(data)
    path = tmp_path / "instances_val.json"
    S.write_coco_json(str(path), gt_dict)
    from_json = CM.load_ground_truth(str(path), image_ids=data["image_ids"])
    rows = [(i + 1, *(data["boxes"][i, b] * 64), data["labels"][i, b])
            for i in range(40) for b in range(data["num_boxes"][i])]
    img, l, t, r, btm, cat = (np.array(v, np.float64) for v in zip(*rows))
    from_arrays = CM.ground_truth_from_arrays(data["image_ids"], np.full((40, 2), 64), img,
                                              np.stack([l, t, r - l, btm - t], 1), cat)
    assert len(from_json.getAnnIds()) == len(from_arrays.getAnnIds()) == int(data["num_boxes"].sum())
    perfect = np.stack([img, l, t, r - l, btm - t, np.full(len(img), 0.9), cat], 1)
    assert CM.evaluate(from_json, perfect) == pytest.approx(1.0)
    rng = np.random.default_rng(4)
    noisy = perfect.copy()
    noisy[:, 1:5] += rng.normal(0, 2.0, (len(img), 4))
    noisy[:, 5] = rng.uniform(0.1, 1.0, len(img))
    noisy[::4, 6] = np.where(noisy[::4, 6] == 1, 5, 1)  # some wrong classes
    ap = CM.evaluate(from_json, noisy)
    assert 0.1 < ap < 0.9
    assert CM.evaluate(from_arrays, noisy) == pytest.approx(ap, abs=1e-12)


def test_load_ground_truth_errors(tmp_path):
    with pytest.raises(HarnessError, match="not found"):
        CM.load_ground_truth(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(HarnessError, match="cannot read"):
        CM.load_ground_truth(str(bad))
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(S.coco_ground_truth(S.generate(3, "val", 1))))
    assert sorted(CM.load_ground_truth(str(ok), image_ids=[3, 2, 1]).getImgIds()) == [1, 2, 3]
    with pytest.raises(HarnessError, match="do not match"):
        CM.load_ground_truth(str(ok), image_ids=[1, 2, 4])


def test_category_maps():
    ids = CM.coco_category_ids()
    assert len(ids) == 80 and ids[0] == 1 and ids[-1] == 90 and 12 not in ids and 83 not in ids
    m = CM.coco_category_map()
    assert m.num_classes == 80
    np.testing.assert_array_equal(m.to_label([1, 11, 13, 90, 0]), [1, 11, 12, 80, 0])
    np.testing.assert_array_equal(m.to_category(m.to_label(ids)), ids)
    np.testing.assert_array_equal(m.to_label(m.to_category(np.arange(81))), np.arange(81))
    for bad in (12, 91, -1):
        with pytest.raises(HarnessError, match=f"category id {bad} "):
            m.to_label([1, bad])
    with pytest.raises(HarnessError, match="outside"):
        m.to_category([81])
    small = CM.CategoryMap(S.category_ids(3))
    np.testing.assert_array_equal(small.to_label([[9, 1], [5, 0]]), [[3, 1], [2, 0]])
    with pytest.raises(HarnessError):
        CM.CategoryMap([5, 5])


# ---------------------------------------------------------------- synthetic shapes

def test_synthetic_shapes_deterministic_and_valid():
    kw = dict(image_size=64, max_boxes=3, empty_fraction=0.2)
    a = S.generate(120, "train", seed=0, **kw)
    b = S.generate(120, "train", seed=0, **kw)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    prefix = S.generate(30, "train", seed=0, **kw)
    np.testing.assert_array_equal(prefix["images"], a["images"][:30])
    assert not np.array_equal(S.generate(30, "train", seed=1, **kw)["images"], prefix["images"])
    assert not np.array_equal(S.generate(30, "val", seed=0, **kw)["images"], prefix["images"])
    assert a["images"].shape == (120, 64, 64, 3) and a["images"].dtype == np.uint8
    num, boxes, labels = a["num_boxes"], a["boxes"], a["labels"]
    assert (num == 0).any() and (num == 3).any() and num.max() <= 3
    valid = np.arange(3)[None, :] < num[:, None]
    v = boxes[valid]
    assert np.all(v >= 0) and np.all(v <= 1) and np.all(v[:, 0] < v[:, 2]) and np.all(v[:, 1] < v[:, 3])
    assert np.all((v[:, 2:] - v[:, :2]) >= 0.19 - 1e-6) and np.all((v[:, 2:] - v[:, :2]) <= 0.63 + 1e-6)
    assert np.all(boxes[~valid] == 0) and np.all(labels[~valid] == 0)
    assert set(np.unique(labels[valid])) == {1, 5, 9}  # non-contiguous raw ids
    for i in range(120):  # pairwise IoU < 0.2 within an image
        bx = boxes[i, :num[i]].astype(np.float64)
        for j in range(len(bx)):
            assert np.all(_np_iou(bx[j], np.delete(bx, j, 0)) < 0.2)
    # The shape is drawn: the pixel at a box centre is far from the image's background gray.
    i = int(np.argmax(num))
    cx, cy = ((boxes[i, 0, :2] + boxes[i, 0, 2:]) / 2 * 64).astype(int)
    assert np.abs(a["images"][i, cy, cx].astype(int) - np.median(a["images"][i], axis=(0, 1))).max() > 40
    f = S.generate(5, "train", seed=0, dtype="float32", **kw)["images"]
    np.testing.assert_allclose(f, a["images"][:5] / 255.0, atol=1e-6)
    with pytest.raises(HarnessError):
        S.generate(5, num_classes=9)


def test_synthetic_coco_ground_truth_and_speed():
    import time
    t0 = time.perf_counter()
    data = S.generate(500, "val", seed=1, image_size=128, max_boxes=3, num_classes=4)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, elapsed  # ~0.4 s here: 2000 images of 128 px take ~2 s
    gt = S.coco_ground_truth(data)
    assert [c["id"] for c in gt["categories"]] == [1, 5, 9, 13]
    assert len(gt["images"]) == 500 and len(gt["annotations"]) == int(data["num_boxes"].sum())
    ann = gt["annotations"][0]
    l, t, r, b = data["boxes"][0, 0] * 128
    assert ann["image_id"] == 1 and ann["category_id"] == data["labels"][0, 0] and ann["iscrowd"] == 0
    np.testing.assert_allclose(ann["bbox"], [l, t, r - l, b - t], rtol=1e-6)
    assert ann["area"] == pytest.approx((r - l) * (b - t), rel=1e-6)


def test_blocks_chain_end_to_end_on_synthetic_data():
    """Synthetic data -> id map -> match/encode (batched with map_fn) -> loss; perfect heads -> NMS -> COCO AP 1."""
    data = S.generate(24, "val", seed=5, image_size=64, empty_fraction=0.1)
    cmap = CM.CategoryMap(data["category_ids"])
    anchors = A.default_boxes(**A.TINY64)
    anchors_ltrb = A.xywh_to_ltrb(anchors)

    @tf.function
    def targets(boxes, labels, valid):
        def one(x):
            mb, ml = B.match(x[0], x[1], x[2], anchors_ltrb)
            return B.encode(mb, anchors), ml
        return tf.map_fn(one, (boxes, labels, valid), fn_output_signature=(tf.float32, tf.int32))

    valid = np.arange(3)[None, :] < data["num_boxes"][:, None]
    gt_loc, gt_labels = targets(data["boxes"], cmap.to_label(data["labels"]), valid)
    assert gt_loc.shape == (24, 340, 4) and gt_labels.shape == (24, 340)
    # Every box of an image is matched to at least one anchor, with its contiguous label.
    for i in range(24):
        assert set(np.unique(gt_labels[i])) - {0} == set(cmap.to_label(data["labels"][i, :data["num_boxes"][i]]))
    logits = tf.one_hot(gt_labels, cmap.num_classes + 1) * 20.0
    loss, num_pos = B.ssd_loss(gt_loc, logits, gt_loc, gt_labels)
    assert float(tf.reduce_max(tf.math.divide_no_nan(loss, num_pos))) < 1e-3
    out = P.postprocess(gt_loc, logits, anchors)
    dets = P.to_coco_detections(data["image_ids"], np.full((24, 2), 64), *(out[k].numpy() for k in
                                ("boxes", "scores", "classes", "num_detections")), cmap.category_ids)
    assert len(dets) == int(data["num_boxes"].sum())  # duplicates from several matched anchors are suppressed
    assert CM.evaluate(CM.ground_truth_from_dict(S.coco_ground_truth(data)), dets) == pytest.approx(1.0)
