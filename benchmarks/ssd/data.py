"""SSD inputs: COCO TFRecords with their instances json, TFDS coco/2017, or the in-memory synthetic shapes task.

Every source gives the same training elements (unbatched, static shapes, so the harness can batch and shard them):
  image  float32 [S, S, 3]  scaled to [0, 1], then normalized with the ImageNet mean/std (as the reference);
         in the compute dtype (bfloat16/float16) under data.images_in_compute_dtype
  boxes  float32 [max_boxes, 4]  ltrb = (xmin, ymin, xmax, ymax) normalized to [0, 1]; zero rows pad
  labels int32 [max_boxes]  contiguous class labels 1..C (the CategoryMap of the source); 0 pads
  jitter float32 [4]  only with augment and data.jitter_on_device: the colour jitter's draws; the image is then
         the resized [0, 1] pixels, and the train step jitters and normalizes them (`device_image`)
With data.normalize_on_device the training image is the resized pixels rounded to uint8 [S, S, 3] (0..255); the
train step scales, jitters (with jitter draws) and normalizes it (`device_image`).
Images without boxes are dropped from training (as the reference does) and kept for eval. The training stream is
this host's shard, shuffled with the run seed and repeated forever; all augmentation is stateless and seeded from
(run seed, host, position in the stream), so a run is reproducible.

Eval is split in two so the harness can pad and shard it: `eval_records()` is the whole eval set in a fixed order,
raw and cheap (serialized records, encoded images or indices), and `eval_parse(record)` turns one into
{"image": [S, S, 3]} (resize and normalize only). `eval_image_ids`/`eval_image_sizes` are in that same order and
`ground_truth()` is the pycocotools COCO that COCOeval scores against.

Validation (`validate()`) reads every eval record's non-image features (cheap) and a bounded prefix of the training
records (TRAIN_SCAN_RECORDS); the training pipeline guards all later records with tf.debugging assertions that carry
the same sentence (BAD_BOX, UNMAPPED), so a corrupt record far into the data stops the run with the same words.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from harness.train.datafiles import (cached_count, check_count, check_examples, counted_records, file_error, list_files,
                                     sharded_records)
from harness.errors import BAD_DATA_MARK, HarnessError, op_error_line
from harness.runtime.base import InputContext
from harness.train.input_pipeline import to_uint8

from benchmarks.ssd import synthetic_shapes
from benchmarks.ssd.boxes import iou
from benchmarks.ssd.coco_metric import (CategoryMap, coco_category_map, ground_truth_from_arrays,
                                        ground_truth_from_dict, load_ground_truth)
from benchmarks.ssd.config import DataConfig, ModelConfig

MEAN_RGB = (0.485, 0.456, 0.406)
STD_RGB = (0.229, 0.224, 0.225)

# The reference's SSDCropping options: no crop, a minimum IoU of every box with the crop, or no IoU limit.
CROP_MIN_IOUS = (None, 0.1, 0.3, 0.5, 0.7, 0.9, -1.0)
CROP_MIN_SIDE = 0.3
CROP_MAX_ASPECT = 2.0
# The reference re-picks forever; a bound keeps the graph finite. One option in 7 is "no crop", so 64 picks all
# failing has probability < (6/7)^64 ~ 5e-5, and then (or with no boxes) the image is used uncropped.
MAX_CROP_PICKS = 64
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0.125, 0.5, 0.5, 0.05

TRAIN_SCAN_RECORDS = 4096
"""Training records `validate()` reads (from the first shards); the pipeline's assertions guard the rest."""

BAD_BOX = "has a box outside [0, 1] or with xmin > xmax or ymin > ymax"
UNMAPPED = "has a category id (or class text) with no mapping in the category map"
BAD_LENGTHS = "has object features of different lengths (bbox xmin/xmax/ymin/ymax, class label or text)"


# ----------------------------------------------------------------------------------------------- preprocessing

def normalize(image01: tf.Tensor) -> tf.Tensor:
    """[0, 1] RGB -> the reference's mean/std normalized input."""
    return (image01 - MEAN_RGB) / STD_RGB


def resize(image: tf.Tensor, size: int, as_uint8: bool = False) -> tf.Tensor:
    """Any-size RGB (uint8 0..255 or float) -> float32 [size, size, 3] in [0, 1], bilinear as Google's TF SSD;
    `as_uint8` (uint8 input, data.normalize_on_device): the resized 0..255 pixels rounded to uint8 instead."""
    resized = tf.image.resize(image, [size, size], method="bilinear")
    if as_uint8:
        return tf.ensure_shape(to_uint8(resized), [size, size, 3])
    scale = 255.0 if image.dtype == tf.uint8 else 1.0
    return tf.ensure_shape(resized / scale, [size, size, 3])


def sample_ssd_crop(boxes: tf.Tensor, seed: tf.Tensor, max_samples: int,
                    max_picks: int = MAX_CROP_PICKS) -> tuple[tf.Tensor, tf.Tensor]:
    """The reference's SSD random crop window: returns (window ltrb [4] normalized, keep [N] bool).

    Each pick chooses one of CROP_MIN_IOUS uniformly; "no crop" returns the whole image with every box. Otherwise
    max_samples candidate crops are drawn at once (w, h each U(0.3, 1) of the image, w/h in [1/2, 2], uniform
    position) and the first one is taken where every box has IoU > min with it and at least one box centre lies
    strictly inside it (the reference's `masks.any()`); keep marks the boxes whose centre is inside. If no
    candidate qualifies the option is picked again, at most max_picks times, then the whole image is used.
    """
    boxes = tf.convert_to_tensor(boxes, tf.float32)
    n = tf.shape(boxes)[0]
    centres = 0.5 * (boxes[:, :2] + boxes[:, 2:])
    min_ious = tf.constant([2.0 if v is None else v for v in CROP_MIN_IOUS], tf.float32)
    whole = tf.constant([0.0, 0.0, 1.0, 1.0])
    all_boxes = tf.ones([n], tf.bool)
    seed = tf.cast(seed, tf.int64)

    def body(i, done, window, keep):
        keys = tf.random.experimental.stateless_split(tf.random.experimental.stateless_fold_in(seed, i), 5)
        mode = tf.random.stateless_uniform([], keys[0], 0, len(CROP_MIN_IOUS), dtype=tf.int32)
        w = tf.random.stateless_uniform([max_samples], keys[1], CROP_MIN_SIDE, 1.0)
        h = tf.random.stateless_uniform([max_samples], keys[2], CROP_MIN_SIDE, 1.0)
        left = tf.random.stateless_uniform([max_samples], keys[3]) * (1.0 - w)
        top = tf.random.stateless_uniform([max_samples], keys[4]) * (1.0 - h)
        crops = tf.stack([left, top, left + w, top + h], axis=1)  # [T, 4]
        ok_iou = tf.reduce_all(iou(crops, boxes) > min_ious[mode], axis=1)  # [T]
        inside = ((centres[None, :, 0] > crops[:, None, 0]) & (centres[None, :, 0] < crops[:, None, 2])
                  & (centres[None, :, 1] > crops[:, None, 1]) & (centres[None, :, 1] < crops[:, None, 3]))  # [T, N]
        aspect = w / h
        ok = (aspect >= 1.0 / CROP_MAX_ASPECT) & (aspect <= CROP_MAX_ASPECT) & ok_iou & tf.reduce_any(inside, 1)
        first = tf.argmax(tf.cast(ok, tf.int32), output_type=tf.int32)
        no_crop = tf.equal(mode, 0)
        found = tf.reduce_any(ok) & ~no_crop
        new_window = tf.where(no_crop, whole, crops[first])
        new_keep = tf.where(no_crop, all_boxes, inside[first])
        now = no_crop | found
        return i + 1, now, tf.where(now, new_window, window), tf.where(now, new_keep, keep)

    def searching(i, done, window, keep):
        return (i < max_picks) & ~done

    _, _, window, keep = tf.while_loop(searching, body, (tf.constant(0, tf.int64), tf.constant(False), whole,
                                                         all_boxes))
    return window, keep


JPEG_BLOCK = 16  # the largest JPEG MCU (4:2:0 chroma): windows are decoded from a block boundary
WINDOW_MARGIN = 8  # pixels decoded beyond each edge of a window, so chroma upsampling sees the same neighbours


def decode_window(encoded: tf.Tensor, y0: tf.Tensor, x0: tf.Tensor, y1: tf.Tensor, x1: tf.Tensor) -> tf.Tensor:
    """Pixels [y0:y1, x0:x1] of an encoded image, bit for bit those of decoding it whole and slicing.

    A JPEG decodes only a window around them (`decode_and_crop_jpeg`), widened by WINDOW_MARGIN and started on a
    JPEG_BLOCK boundary: decoding exactly the window differs at its edges by a few grey levels, where libjpeg's
    chroma upsampling would treat the window's edge as the image's; widened, it sees the neighbours the whole
    image has (tests compare). Other formats (PNG) decode whole.
    """
    return tf.cond(tf.io.is_jpeg(encoded),
                   lambda: _jpeg_window(encoded, tf.io.extract_jpeg_shape(encoded), y0, x0, y1, x1),
                   lambda: _decode(encoded)[y0:y1, x0:x1])


def _jpeg_window(encoded: tf.Tensor, shape: tf.Tensor, y0: tf.Tensor, x0: tf.Tensor, y1: tf.Tensor,
                 x1: tf.Tensor) -> tf.Tensor:
    top = tf.maximum(y0 - WINDOW_MARGIN, 0) // JPEG_BLOCK * JPEG_BLOCK
    left = tf.maximum(x0 - WINDOW_MARGIN, 0) // JPEG_BLOCK * JPEG_BLOCK
    bottom, right = tf.minimum(y1 + WINDOW_MARGIN, shape[0]), tf.minimum(x1 + WINDOW_MARGIN, shape[1])
    pixels = tf.image.decode_and_crop_jpeg(encoded, tf.stack([top, left, bottom - top, right - left]), channels=3)
    return pixels[y0 - top:y1 - top, x0 - left:x1 - left]


def decode_crop(encoded: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """The pixels of crop `window` (ltrb, normalized; `crop_bounds`) of an encoded image, as `decode_window`
    gives them, with one format test and one header read (a JPEG's size comes from its header)."""
    def jpeg() -> tf.Tensor:
        shape = tf.io.extract_jpeg_shape(encoded)
        return _jpeg_window(encoded, shape, *crop_bounds(window, shape))

    def other() -> tf.Tensor:
        image = _decode(encoded)
        y0, x0, y1, x1 = crop_bounds(window, tf.shape(image))
        return image[y0:y1, x0:x1]
    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def crop_bounds(window: tf.Tensor, shape: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Pixel rows and columns (y0, x0, y1, x1) of a crop window (ltrb, normalized) in an image of `shape` (H, W):
    by truncation, as the reference's int(left * width), at least one pixel."""
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    x0 = tf.cast(window[0] * width, tf.int32)
    y0 = tf.cast(window[1] * height, tf.int32)
    x1 = tf.clip_by_value(tf.cast(window[2] * width, tf.int32), x0 + 1, shape[1])
    y1 = tf.clip_by_value(tf.cast(window[3] * height, tf.int32), y0 + 1, shape[0])
    return y0, x0, y1, x1


def ssd_random_crop(image: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor, seed: tf.Tensor,
                    max_samples: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Crop image [H, W, 3] by `sample_ssd_crop`; keep the boxes whose centre is inside, clipped and re-normalized.

    `image` may also be still encoded (a scalar string): the window depends on the boxes alone, so it is drawn
    first and only its pixels are decoded (`decode_window`, the same pixels as decoding the whole image).
    """
    window, keep = sample_ssd_crop(boxes, seed, max_samples)
    if image.dtype == tf.string:
        image = decode_crop(image, window)
    else:
        y0, x0, y1, x1 = crop_bounds(window, tf.shape(image))
        image = image[y0:y1, x0:x1]
    boxes = tf.boolean_mask(boxes, keep)
    labels = tf.boolean_mask(labels, keep)
    lt, rb = window[:2], window[2:]
    ltlt, size = tf.concat([lt, lt], 0), tf.concat([rb - lt, rb - lt], 0)
    boxes = tf.clip_by_value(boxes, ltlt, tf.concat([rb, rb], 0))
    return image, (boxes - ltlt) / size, labels


def flip_coin(seed: tf.Tensor) -> tf.Tensor:
    """The horizontal flip's draw, p = 0.5."""
    return tf.random.stateless_uniform([], seed) < 0.5


def flip_boxes(boxes: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
    """ltrb boxes mirrored left-right where `flip`."""
    flipped = tf.stack([1.0 - boxes[:, 2], boxes[:, 1], 1.0 - boxes[:, 0], boxes[:, 3]], axis=1)
    return tf.where(flip, flipped, boxes)


def random_flip(image: tf.Tensor, boxes: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Horizontal flip with p = 0.5 of the image and its ltrb boxes."""
    flip = flip_coin(seed)
    image = tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)
    return image, flip_boxes(boxes, flip)


def flip_where(images: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
    """Each image of a [batch, height, width, channels] batch mirrored left-right where `flip` (a strided slice:
    DTensor's mesh runtime has no layout rule for tf.reverse)."""
    return tf.where(tf.reshape(flip, [-1, 1, 1, 1]), images[:, :, ::-1], images)


def jitter_factors(seed: tf.Tensor) -> tf.Tensor:
    """One image's ColorJitter draws [brightness, contrast, saturation factors, hue delta], each uniform over the
    reference's range (torchvision ColorJitter(0.125, 0.5, 0.5, 0.05)), from four keys split off `seed`."""
    keys = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
    ranges = ((1 - BRIGHTNESS, 1 + BRIGHTNESS), (1 - CONTRAST, 1 + CONTRAST), (1 - SATURATION, 1 + SATURATION),
              (-HUE, HUE))
    return tf.stack([tf.random.stateless_uniform([], keys[i], lo, hi) for i, (lo, hi) in enumerate(ranges)])


def _rgb_to_hsv(rgb: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Elementwise ops only (DTensor has layout rules for these; tf.image's fused HSV kernels it may not)."""
    r, g, b = tf.unstack(rgb, axis=-1)
    v = tf.reduce_max(rgb, axis=-1)
    delta = v - tf.reduce_min(rgb, axis=-1)
    safe = tf.where(delta > 0, delta, 1.0)
    h = tf.where(v == r, (g - b) / safe, tf.where(v == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    h = tf.where(delta > 0, tf.math.floormod(h / 6.0, 1.0), 0.0)
    s = tf.where(v > 0, delta / tf.where(v > 0, v, 1.0), 0.0)
    return h, s, v


def _hsv_to_rgb(h: tf.Tensor, s: tf.Tensor, v: tf.Tensor) -> tf.Tensor:
    def channel(n: float) -> tf.Tensor:
        k = tf.math.floormod(n + 6.0 * h, 6.0)
        return v - v * s * tf.clip_by_value(tf.minimum(k, 4.0 - k), 0.0, 1.0)
    return tf.stack([channel(5.0), channel(3.0), channel(1.0)], axis=-1)


def color_jitter(images01: tf.Tensor, factors: tf.Tensor) -> tf.Tensor:
    """The reference's ColorJitter with given draws (`jitter_factors`), in a fixed order (torchvision permutes it):
    brightness scales (a blend with black), contrast blends each channel with its mean, saturation and hue act in
    HSV as tf.image.adjust_saturation/adjust_hue do; values are clipped to [0, 1] after each.

    images01 [..., H, W, 3] in [0, 1] with factors [..., 4]: one image on the host, or (`data.jitter_on_device`) a
    batch in the train step, where the same pixel work is cheap and the host CPU is not.
    """
    def f(i: int) -> tf.Tensor:
        return factors[..., i][..., None, None, None]
    image = tf.clip_by_value(images01 * f(0), 0.0, 1.0)
    mean = tf.reduce_mean(image, axis=[-3, -2], keepdims=True)
    image = tf.clip_by_value((image - mean) * f(1) + mean, 0.0, 1.0)
    h, s, v = _rgb_to_hsv(image)
    s = tf.clip_by_value(s * f(2)[..., 0], 0.0, 1.0)
    h = tf.math.floormod(h + f(3)[..., 0], 1.0)
    return tf.clip_by_value(_hsv_to_rgb(h, s, v), 0.0, 1.0)


def device_image(batch: dict[str, tf.Tensor], scaled_in_step: bool = False) -> tf.Tensor:
    """The model's training input: a batch that carries jitter draws gets its colour jitter and normalization
    here, in the step, in float32 (the pixels may arrive in the compute dtype, or, `scaled_in_step`
    (data.scale_in_step), as the resize's 0..255 float32 pixels); uint8 pixels (data.normalize_on_device) are
    scaled to [0, 1] and normalized here too; otherwise the host did both. A batch that carries flip coins
    (data.flip_on_device) has its images mirrored where they came up (the boxes were flipped on the host)."""
    image = batch["image"]
    if image.dtype == tf.uint8 or (scaled_in_step and "jitter" in batch):
        image = tf.cast(image, tf.float32) / 255.0
        if "jitter" not in batch:
            image = normalize(image)
    if "jitter" in batch:
        image = normalize(color_jitter(tf.cast(image, tf.float32), batch["jitter"]))
    return flip_where(image, batch["flip"]) if "flip" in batch else image


def pad_boxes(boxes: tf.Tensor, labels: tf.Tensor, max_boxes: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Keep the first max_boxes boxes and pad with zero rows / label 0 to exactly max_boxes."""
    boxes, labels = boxes[:max_boxes], tf.cast(labels[:max_boxes], tf.int32)
    pad = max_boxes - tf.shape(labels)[0]
    boxes = tf.pad(tf.cast(boxes, tf.float32), [[0, pad], [0, 0]])
    return tf.ensure_shape(boxes, [max_boxes, 4]), tf.ensure_shape(tf.pad(labels, [[0, pad]]), [max_boxes])


def preprocess_train(image: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor, seed: tf.Tensor, size: int,
                     max_boxes: int, augment: bool, max_samples: int,
                     jitter_on_device: bool = False, dtype: tf.DType = tf.float32,
                     normalize_on_device: bool = False, flip_on_device: bool = False,
                     scale_in_step: bool = False) -> dict[str, tf.Tensor]:
    """The reference's training transform: [SSD crop], flip, resize, [colour jitter], normalize, pad boxes.
    `image` is pixels [H, W, 3] or still encoded (then decoded here, with augment only its crop window).

    `jitter_on_device` (with augment): the element carries the resized [0, 1] image and its jitter draws
    (`jitter`, [4]); `device_image` applies the jitter and normalization in the train step. The image leaves
    in `dtype` (`data.images_in_compute_dtype`). `normalize_on_device`: the image leaves as the resized pixels
    rounded to uint8 (at most half a grey level from the float pixels) and `device_image` does the rest.
    `flip_on_device`: the boxes are flipped here, the image in the train step (the element carries the coin,
    `flip`). `scale_in_step` (with jitter_on_device): the image leaves as the resize's 0..255 float32 pixels,
    which the train step scales to [0, 1].
    """
    keys = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 3)
    boxes = tf.cast(boxes, tf.float32)
    if augment:  # an encoded image decodes only its crop window here (`data.decode_crop_window`)
        image, boxes, labels = ssd_random_crop(image, boxes, labels, keys[0], max_samples)
    elif image.dtype == tf.string:
        image = _decode(image)
    extra = {}
    if flip_on_device:
        extra["flip"] = flip_coin(keys[1])
        boxes = flip_boxes(boxes, extra["flip"])
    else:
        image, boxes = random_flip(image, boxes, keys[1])
    boxes, labels = pad_boxes(boxes, labels, max_boxes)
    extra.update(boxes=boxes, labels=labels)
    if normalize_on_device:
        out = {"image": resize(image, size, True), **extra}  # decoded and generated pixels are uint8
        return {**out, "jitter": jitter_factors(keys[2])} if augment else out
    if augment and jitter_on_device and scale_in_step:
        pixels = tf.image.resize(image, [size, size], method="bilinear")
        if image.dtype != tf.uint8:  # [0, 1] pixels (synthetic sources): the step's scaling expects 0..255
            pixels = pixels * 255.0
        return {"image": tf.ensure_shape(pixels, [size, size, 3]), "jitter": jitter_factors(keys[2]), **extra}
    image = resize(image, size)
    if not augment:
        return {"image": tf.cast(normalize(image), dtype), **extra}
    factors = jitter_factors(keys[2])
    if jitter_on_device:
        return {"image": tf.cast(image, dtype), "jitter": factors, **extra}
    return {"image": tf.cast(normalize(color_jitter(image, factors)), dtype), **extra}


def preprocess_eval(image: tf.Tensor, size: int, dtype: tf.DType = tf.float32) -> dict[str, tf.Tensor]:
    """Eval: resize to size x size and normalize only."""
    return {"image": tf.cast(normalize(resize(image, size)), dtype)}


def _element_seed(ctx: InputContext, index: tf.Tensor) -> tf.Tensor:
    """A distinct stateless seed per (run seed, host, position in this host's stream)."""
    base = tf.constant([ctx.seed, ctx.host_id], tf.int64)
    return tf.random.experimental.stateless_fold_in(base, tf.cast(index, tf.int64))


def _decode(encoded: tf.Tensor) -> tf.Tensor:
    return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def _image_shape(encoded: tf.Tensor) -> tf.Tensor:
    """(height, width) of an encoded image: from the JPEG header when it is one, else by decoding."""
    return tf.cond(tf.io.is_jpeg(encoded), lambda: tf.io.extract_jpeg_shape(encoded)[:2],
                   lambda: tf.shape(_decode(encoded))[:2])


def _box_problem(boxes: np.ndarray) -> bool:
    return bool(boxes.size) and bool(np.any((boxes < 0) | (boxes > 1)) or np.any(boxes[:, 0] > boxes[:, 2])
                                     or np.any(boxes[:, 1] > boxes[:, 3]))


def _check_boxes_in_graph(boxes: tf.Tensor, where: list) -> tf.Operation:
    ok = tf.reduce_all((boxes >= 0.0) & (boxes <= 1.0)) & tf.reduce_all(boxes[:, :2] <= boxes[:, 2:])  # l <= r, t <= b
    return tf.debugging.Assert(ok, [BAD_DATA_MARK, *where, BAD_BOX])


def _has_boxes(encoded: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    return tf.size(labels) > 0


def _encoded_image(ex: dict[str, Any]) -> tf.Tensor:
    return ex["image"]


def _parse_scan_batch(records: tf.Tensor) -> dict[str, tf.Tensor]:
    return tf.io.parse_example(records, SCAN_FEATURES)


def _records_with_objects(file: tf.Tensor) -> tf.data.Dataset:
    """The records of one file that hold objects, each paired with the file name so the pipeline's assertions can
    name it."""
    def pair(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return file, record
    return tf.data.TFRecordDataset(file).map(pair).filter(_has_objects)


def _named_errors(ds: tf.data.Dataset, path: str) -> Iterator[Any]:
    """The elements of `ds` (read from the file `path`); a record it cannot read or parse is one line naming it."""
    try:
        yield from ds
    except tf.errors.OpError as e:
        raise HarnessError(f"{path}: {op_error_line(e.message) or type(e).__name__}") from None


def _check_count(what: str, want: int, have: int, key: str, where: str) -> None:
    check_count(key, want, have, what, where)


_BOXES_ONLY = {"image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32)}


def _boxes_per_record(records: tf.Tensor) -> tf.Tensor:
    xmin = tf.io.parse_example(records, _BOXES_ONLY)["image/object/bbox/xmin"]
    return tf.math.bincount(tf.cast(xmin.indices[:, 0], tf.int32), minlength=tf.size(records))


def count_images_with_boxes(files: list[str]) -> int:
    """Records of `files` with at least one box: the images training uses (empty ones are dropped)."""
    def count(paths: list[str]) -> int:
        ds = tf.data.TFRecordDataset(paths, num_parallel_reads=min(8, len(paths))).batch(1024).map(_boxes_per_record)
        return sum(int(np.count_nonzero(n)) for n in ds.as_numpy_iterator())

    try:
        return count(files)
    except tf.errors.OpError as e:  # a record that is not an Example with float box lists
        raise file_error(files, lambda f: count([f]), e, "COCO training records") from None


def _indexed(ds: tf.data.Dataset, repeat: bool) -> tf.data.Dataset:
    """(index, element) pairs whose index seeds the element's augmentation: its position in the endless stream,
    or for one epoch (`repeat=False`, a tf.data service job, which would restart every position at 0) a random
    draw per element."""
    if repeat:
        return ds.enumerate()
    return ds.map(lambda *item: (tf.random.uniform([], 0, 1 << 62, tf.int64), item[0] if len(item) == 1 else item))


# ----------------------------------------------------------------------------------------------- sources

class _Source:
    category_map: CategoryMap

    def __init__(self, data_cfg: DataConfig, model_cfg: ModelConfig, image_dtype: tf.DType = tf.float32) -> None:
        self.cfg = data_cfg
        self.size = model_cfg.image_size
        self.image_dtype = image_dtype
        # data.scale_in_step: the resize's 0..255 float32 pixels, scaled in the step (with the jitter there).
        self.scales_in_step = (data_cfg.scale_in_step and data_cfg.augment and data_cfg.jitter_on_device
                               and not data_cfg.normalize_on_device)
        self.train_image_dtype = (tf.uint8 if data_cfg.normalize_on_device
                                  else tf.float32 if self.scales_in_step else image_dtype)
        self._gt = None

    def _augment(self, ctx: InputContext) -> Callable[..., dict[str, tf.Tensor]]:
        c, size, dtype = self.cfg, self.size, self.image_dtype

        def fn(index: tf.Tensor, image: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor) -> dict[str, tf.Tensor]:
            return preprocess_train(image, boxes, labels, _element_seed(ctx, index), size, c.max_boxes, c.augment,
                                    c.max_samples, c.jitter_on_device, dtype, c.normalize_on_device,
                                    c.flip_on_device, c.scale_in_step)
        return fn

    def _augment_encoded(self, ds: tf.data.Dataset, ctx: InputContext, repeat: bool = True,
                         parse: Callable[..., tuple[tf.Tensor, tf.Tensor, tf.Tensor]] | None = None) -> tf.data.Dataset:
        """(encoded image, boxes, labels) elements of the file-based sources (or elements `parse` makes them of, in
        the same map) -> augmented training elements."""
        augment = self._augment(ctx)

        window_only = self.cfg.decode_crop_window

        def fn(index, item):
            encoded, boxes, labels = parse(*item) if parse is not None else item
            return augment(index, encoded if window_only else _decode(encoded), boxes, labels)
        return _indexed(ds, repeat).map(fn, num_parallel_calls=tf.data.AUTOTUNE)

    def train_count(self) -> int | None:
        """Training images with boxes, when that is known without reading the data (else None)."""
        return None

    def _eval(self) -> dict[str, Any]:
        """File-based sources: the eval set's scanned non-image features (ids, sizes, ...), read once."""
        raise NotImplementedError

    @property
    def eval_image_ids(self) -> np.ndarray:
        return self._eval()["ids"]

    @property
    def eval_image_sizes(self) -> np.ndarray:
        return self._eval()["sizes"]


class SyntheticSource(_Source):
    """The synthetic shapes task (synthetic_shapes.py), generated in memory (uint8 arrays, normalized in the map).

    data.train_samples counts images trained on, so the source generates the first N images of the train stream
    such that exactly train_samples of them have boxes and drops the ~2% empty ones (the image index is the
    generator's seed, so this is the same set on every host and run). Eval keeps all eval_samples images.
    """

    def __init__(self, data_cfg: DataConfig, model_cfg: ModelConfig, image_dtype: tf.DType = tf.float32) -> None:
        super().__init__(data_cfg, model_cfg, image_dtype)
        self.category_map = CategoryMap(synthetic_shapes.category_ids(data_cfg.synthetic_classes))
        self._train_data: dict[str, Any] | None = None
        self._eval_data: dict[str, np.ndarray] | None = None
        self._eval_images: tf.Tensor | None = None

    def _generate(self, n: int, split: str) -> dict[str, np.ndarray]:
        c = self.cfg
        return synthetic_shapes.generate(n, split=split, seed=c.synthetic_seed, image_size=self.size,
                                         max_boxes=min(c.synthetic_max_objects, c.max_boxes),
                                         num_classes=c.synthetic_classes)

    def train_data(self) -> dict[str, Any]:
        """The training images with boxes, generated once: images as one eager uint8 tensor (held once, sliced
        per host without a copy on one host), boxes/labels (contiguous)/num_boxes/image_ids as numpy."""
        if self._train_data is None:
            want = self.cfg.train_samples
            n = want + want // 20 + 16
            while True:
                data = self._generate(n, "train")
                keep = np.flatnonzero(data["num_boxes"] > 0)
                if len(keep) >= want:
                    break
                n += 2 * (want - len(keep)) + 16
            keep = keep[:want]
            with tf.init_scope():
                images = tf.constant(data["images"][keep])
            del data["images"]
            self._train_data = {"images": images, "boxes": data["boxes"][keep],
                                "labels": self.category_map.to_label(data["labels"][keep]),
                                "num_boxes": data["num_boxes"][keep], "image_ids": data["image_ids"][keep]}
        return self._train_data

    def eval_data(self) -> dict[str, np.ndarray]:
        if self._eval_data is None:
            self._eval_data = self._generate(self.cfg.eval_samples, "val")
        return self._eval_data

    def train_count(self) -> int | None:
        return self.cfg.train_samples

    def validate(self) -> None:
        """Nothing can be wrong with generated data that the config's own checks do not catch."""

    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """This host's training images, shuffled and repeated (`repeat=False`: one epoch, shuffled afresh per
        tf.data service job)."""
        d = self.train_data()
        part = slice(ctx.host_id, None, ctx.num_hosts)
        count = len(d["num_boxes"][part])
        if count == 0:
            raise HarnessError(f"data.train_samples={self.cfg.train_samples} leaves host {ctx.host_id} of "
                               f"{ctx.num_hosts} no training images")
        images = d["images"] if ctx.num_hosts == 1 else d["images"][part]
        ds = tf.data.Dataset.from_tensor_slices((images, d["boxes"][part], d["labels"][part], d["num_boxes"][part]))
        ds = ds.shuffle(min(count, self.cfg.shuffle_buffer), seed=ctx.seed if repeat else None,
                        reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        augment = self._augment(ctx)

        def fn(index, item):
            image, boxes, labels, num = item
            return augment(index, image, boxes[:num], labels[:num])
        return _indexed(ds, repeat).map(fn, num_parallel_calls=tf.data.AUTOTUNE)

    @tf.autograph.experimental.do_not_convert
    def _eval_images_tensor(self) -> tf.Tensor:
        """The eval images as one eager uint8 tensor, made once (even when first asked for inside a trace)."""
        if self._eval_images is None:
            with tf.init_scope():
                self._eval_images = tf.constant(self.eval_data()["images"])
        return self._eval_images

    def eval_records(self) -> tf.data.Dataset:
        """Indices 0..eval_samples-1 into the in-memory eval images."""
        self._eval_images_tensor()
        return tf.data.Dataset.range(self.cfg.eval_samples)

    def eval_parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        return preprocess_eval(tf.gather(self._eval_images_tensor(), record), self.size, self.image_dtype)

    @property
    def eval_image_ids(self) -> np.ndarray:
        return self.eval_data()["image_ids"].astype(np.int64)

    @property
    def eval_image_sizes(self) -> np.ndarray:
        return np.full((self.cfg.eval_samples, 2), self.size, np.int64)

    def ground_truth(self) -> Any:
        if self._gt is None:
            self._gt = ground_truth_from_dict(synthetic_shapes.coco_ground_truth(self.eval_data(), "val"))
        return self._gt


# ------------------------------------------------------------------------------------------------ TFRecords

# Shard names of the two COCO converters, each default pattern with the other's: tensorflow/tpu's
# create_coco_tf_record writes train-/val-NNNNN-of-NNNNN.tfrecord, the TF Object Detection API's
# create_coco_tf_record writes coco_train.record-/coco_val.record-NNNNN-of-NNNNN.
LAYOUTS = {"train-*": "coco_train.record-*", "val-*": "coco_val.record-*"}

_BOX_KEYS = ("xmin", "ymin", "xmax", "ymax")  # ltrb
SCAN_FEATURES = {
    "image/source_id": tf.io.FixedLenFeature([], tf.string, default_value=""),
    "image/height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    "image/width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    **{f"image/object/bbox/{k}": tf.io.VarLenFeature(tf.float32) for k in _BOX_KEYS},
    "image/object/class/label": tf.io.VarLenFeature(tf.int64),
    "image/object/class/text": tf.io.VarLenFeature(tf.string),
    "image/object/is_crowd": tf.io.VarLenFeature(tf.int64),
}
FEATURES = {**SCAN_FEATURES, "image/encoded": tf.io.FixedLenFeature([], tf.string)}
# What a training record is parsed for (its image, boxes and labels; the id names it in an error): not the size
# and crowd flags, which only the eval scan reads.
# Lists as RaggedFeatures: dense 1-D values per record, no SparseTensor to densify (the same values as VarLenFeature).
TRAIN_FEATURES = {k: tf.io.RaggedFeature(v.dtype) if isinstance(v, tf.io.VarLenFeature) else v
                  for k, v in FEATURES.items() if k not in ("image/height", "image/width", "image/object/is_crowd")}


# A record's object lists: all empty = an image without boxes, which training skips. Any list not empty goes on to
# the full parse, whose length check names a record whose lists disagree.
OBJECT_FEATURES = {k: tf.io.RaggedFeature(v.dtype) for k, v in SCAN_FEATURES.items()
                   if isinstance(v, tf.io.VarLenFeature) and k != "image/object/is_crowd"}


def _has_objects(file: tf.Tensor, record: tf.Tensor) -> tf.Tensor:
    return tf.add_n([tf.size(v) for v in tf.io.parse_single_example(record, OBJECT_FEATURES).values()]) > 0


class TFRecordSource(_Source):
    """COCO TFRecords of tensorflow/tpu's create_coco_tf_record or of the TF Object Detection API, plus the json.

    Records carry raw COCO category ids in image/object/class/label; records without it (the OD API converter)
    have image/object/class/text, mapped through the json's category names. Raw ids map to contiguous labels by
    the json's categories (a constant lookup array in the graph). The json is the eval ground truth, so its image
    ids must be exactly the eval records' ids.
    """

    def __init__(self, data_cfg: DataConfig, model_cfg: ModelConfig, image_dtype: tf.DType = tf.float32) -> None:
        super().__init__(data_cfg, model_cfg, image_dtype)
        self._coco = None
        self._cmap: CategoryMap | None = None
        self._eval_scan: dict[str, Any] | None = None

    # -- the annotation json
    def _annotations(self) -> Any:
        if self._coco is None:
            path = self.cfg.annotation_file
            if not path:
                raise HarnessError("data.source=tfrecord needs data.annotation_file (the instances_val2017.json "
                                   "the eval records come from)")
            self._coco = load_ground_truth(path)
            if not self._coco.dataset["categories"]:
                raise HarnessError(f"COCO annotation file {path} lists no categories")
        return self._coco

    @property
    def category_map(self) -> CategoryMap:
        """From the annotation json's categories (read on first use)."""
        if self._cmap is None:
            self._cmap = CategoryMap(c["id"] for c in self._annotations().dataset["categories"])
        return self._cmap

    def _names(self) -> dict[str, int]:
        return {str(c["name"]): int(c["id"]) for c in self._annotations().dataset["categories"]}

    def _files(self, pattern: str) -> list[str]:
        """The shards `pattern` names; a default pattern that finds none tries the other converter's (LAYOUTS)."""
        other, folder = LAYOUTS.get(pattern), self.cfg.data_dir
        if other and folder and os.path.isdir(folder) and not tf.io.gfile.glob(os.path.join(folder, pattern)):
            if not tf.io.gfile.glob(os.path.join(folder, other)):
                key = "train_pattern" if pattern == self.cfg.train_pattern else "eval_pattern"
                raise HarnessError(f"no COCO shards under {folder} match {pattern} (tensorflow/tpu naming) or {other} "
                                   f"(Object Detection API naming); set data.{key} to their glob")
            pattern = other
        return list_files(self.cfg.data_dir, pattern, "COCO TFRecord shards")

    # -- parsing
    def _lookups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Category names, their ids, and raw id -> contiguous label (0 = unmapped), read eagerly from the json."""
        names, cmap = self._names(), self.category_map
        table = np.zeros(cmap.category_ids[-1] + 1, np.int32)
        table[cmap.category_ids] = np.arange(1, cmap.num_classes + 1)
        return np.asarray(list(names), object), np.asarray(list(names.values()), np.int64), table

    @staticmethod
    def _parse_objects(ex: dict[str, tf.Tensor], lookups: tuple[np.ndarray, np.ndarray, np.ndarray],
                       where: list) -> tuple[tf.Tensor, tf.Tensor]:
        """ltrb boxes [N, 4] and contiguous labels [N] of one record, asserting BAD_LENGTHS, BAD_BOX, UNMAPPED."""
        coords = [ex[f"image/object/bbox/{k}"] for k in _BOX_KEYS]  # TRAIN_FEATURES: dense 1-D each
        raw, text = ex["image/object/class/label"], ex["image/object/class/text"]
        n = tf.size(coords[0])
        name_keys, name_ids = (tf.constant(a) for a in lookups[:2])

        def from_text() -> tf.Tensor:  # only for records without numeric ids: matching every name costs
            match = tf.equal(text[:, None], name_keys[None, :])
            return tf.where(tf.reduce_any(match, axis=1),
                            tf.gather(name_ids, tf.argmax(tf.cast(match, tf.int32), axis=1)), -1)
        ids = tf.cond(tf.size(raw) > 0, lambda: raw, from_text)
        same = tf.reduce_all(tf.stack([tf.size(c) for c in coords] + [tf.size(ids)]) == n)
        check_len = tf.debugging.Assert(same, [BAD_DATA_MARK, *where, BAD_LENGTHS])
        with tf.control_dependencies([check_len]):
            boxes = tf.stack(coords, axis=1)
        # Ids outside the table land on the zeros padded around it: 0 = unmapped, as an id the json lacks.
        padded = tf.constant(np.pad(lookups[2], 1))
        labels = tf.gather(padded, tf.clip_by_value(ids, -1, len(lookups[2])) + 1)
        checks = [_check_boxes_in_graph(boxes, where),
                  tf.debugging.Assert(tf.reduce_all(labels > 0), [BAD_DATA_MARK, *where, UNMAPPED])]
        with tf.control_dependencies(checks):
            return tf.identity(boxes), tf.identity(labels)

    # -- validation scans
    def _scan(self, files: list[str], limit: int | None) -> Iterator[dict[str, Any]]:
        """Non-image features of the records of `files` in order (at most `limit`), checked one by one."""
        names = self._names()
        cmap = self.category_map
        left = limit
        for path in files:
            ds = tf.data.TFRecordDataset(path)
            if left is not None:
                ds = ds.take(left)
            ds = ds.batch(256).map(_parse_scan_batch)
            for batch in _named_errors(ds, path):
                size = int(batch["image/height"].shape[0])
                cols = {k: tf.RaggedTensor.from_sparse(v).to_list() for k, v in batch.items()
                        if isinstance(v, tf.sparse.SparseTensor)}
                ids = batch["image/source_id"].numpy()
                heights, widths = batch["image/height"].numpy(), batch["image/width"].numpy()
                for i in range(size):
                    yield self._check_record(path, ids[i], heights[i], widths[i], {k: v[i] for k, v in cols.items()},
                                             names, cmap)
                if left is not None:
                    left -= size
            if left is not None and left <= 0:
                return

    @staticmethod
    def _check_record(path: str, source_id: bytes, height: int, width: int, cols: dict[str, list],
                      names: dict[str, int], cmap: CategoryMap) -> dict[str, Any]:
        sid = source_id.decode(errors="replace")
        where = f"{path}: record with image id {sid!r}"
        try:
            image_id = int(sid)
        except ValueError:
            raise HarnessError(f"{where} has an image/source_id that is not an integer COCO image id") from None
        if height <= 0 or width <= 0:
            raise HarnessError(f"{where} has no image/height or image/width")
        coords = [cols[f"image/object/bbox/{k}"] for k in _BOX_KEYS]
        labels, texts = cols["image/object/class/label"], cols["image/object/class/text"]
        n = len(coords[0])
        ids = labels if labels else [names.get(t.decode(errors="replace"), -1) for t in texts]
        if any(len(c) != n for c in coords) or len(ids) != n:
            raise HarnessError(f"{where} {BAD_LENGTHS}")
        boxes = np.asarray(coords, np.float32).T.reshape(n, 4)
        if _box_problem(boxes):
            bad = boxes[np.argmax(np.any((boxes < 0) | (boxes > 1), 1) | (boxes[:, 0] > boxes[:, 2])
                                  | (boxes[:, 1] > boxes[:, 3]))]
            raise HarnessError(f"{where} {BAD_BOX} (xmin, ymin, xmax, ymax = {', '.join(f'{v:.4g}' for v in bad)})")
        known = set(cmap.category_ids)
        bad = [texts[k].decode(errors="replace") if not labels else ids[k] for k in range(n) if ids[k] not in known]
        if bad:
            raise HarnessError(f"{where} {UNMAPPED} (got {bad[0]!r}; the {cmap.num_classes} categories come from "
                               f"data.annotation_file)")
        crowd = cols["image/object/is_crowd"]
        return {"image_id": image_id, "size": (int(height), int(width)), "boxes": boxes,
                "category_ids": np.asarray(ids, np.int64),
                "is_crowd": np.asarray(crowd if len(crowd) == n else [0] * n, np.int64)}

    def _eval(self) -> dict[str, Any]:
        if self._eval_scan is None:
            rows = list(self._scan(self._files(self.cfg.eval_pattern), None))
            ids = np.asarray([r["image_id"] for r in rows], np.int64)
            uniq, counts = np.unique(ids, return_counts=True)
            if (counts > 1).any():
                raise HarnessError(f"eval records ({self.cfg.eval_pattern}) repeat image id "
                                   f"{int(uniq[counts > 1][0])}: each eval image must appear once")
            self._eval_scan = {"ids": ids, "sizes": np.asarray([r["size"] for r in rows], np.int64).reshape(-1, 2)}
        return self._eval_scan

    def _check_ids(self) -> None:
        ids = self._eval()["ids"]
        have = set(int(i) for i in self._annotations().getImgIds())
        want = set(ids.tolist())
        if want != have:
            missing, extra = sorted(want - have), sorted(have - want)
            example = f"record id {missing[0]} is not in it" if missing else f"json id {extra[0]} has no record"
            raise HarnessError(f"image ids of {self.cfg.annotation_file} do not match the eval records "
                               f"({self.cfg.eval_pattern}): {len(missing)} record ids missing from the json, "
                               f"{len(extra)} json ids without a record (e.g. {example})")

    def validate(self) -> None:
        train_files = self._files(self.cfg.train_pattern)
        for files in (train_files, self._files(self.cfg.eval_pattern)):
            check_examples(files, ("image/encoded",), "COCO images (image/encoded, image/object/bbox/*)")
        self._annotations()
        self._check_ids()
        _check_count("eval images", self.cfg.eval_samples, len(self._eval()["ids"]), "eval_samples",
                     f"{self.cfg.eval_pattern} under {self.cfg.data_dir}")
        for _ in self._scan(train_files, TRAIN_SCAN_RECORDS):
            pass
        _check_count("images with boxes", self.cfg.train_samples, self.counts()["train_samples"], "train_samples",
                     f"{self.cfg.train_pattern} under {self.cfg.data_dir}")

    def counts(self) -> dict[str, int]:
        """Training images with boxes (the ones training uses; counted once over every shard and cached beside
        them) and eval records."""
        train = self._files(self.cfg.train_pattern)
        return {"train_samples": cached_count(train, "images with boxes", {}, lambda: count_images_with_boxes(train)),
                "eval_samples": counted_records(self._files(self.cfg.eval_pattern))}

    # -- pipelines
    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """This host's training images with boxes, shuffled and repeated (`repeat=False`: one epoch, each
        image once, shuffled afresh per tf.data service job)."""
        c = self.cfg
        # Records without objects are dropped as they are read, by parsing their lists alone (the parser skips the
        # image's bytes), so the map that parses and augments feeds the batch directly: tf.data fuses the two and
        # copies each image into its batch while it is still in cache. Order: data.deterministic, through the
        # dataset options the harness sets.
        ds = sharded_records(self._files(c.train_pattern), ctx, c.shuffle_buffer, cycle_length=c.parallel_reads,
                             deterministic=None, repeat=repeat, read_threads=c.read_threads, read_ahead=True,
                             reader=_records_with_objects)
        lookups = self._lookups()

        def parse(file: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            ex = tf.io.parse_single_example(record, TRAIN_FEATURES)
            boxes, labels = self._parse_objects(ex, lookups, ["COCO record in", file, "image id",
                                                              ex["image/source_id"]])
            return ex["image/encoded"], boxes, labels

        return self._augment_encoded(ds, ctx, repeat, parse)

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(self._files(self.cfg.eval_pattern))

    def eval_parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        ex = tf.io.parse_single_example(record, {"image/encoded": FEATURES["image/encoded"]})
        return preprocess_eval(_decode(ex["image/encoded"]), self.size, self.image_dtype)

    def ground_truth(self) -> Any:
        """The annotation json itself (its image ids are checked to be exactly the eval records')."""
        if self._gt is None:
            self._check_ids()
            self._gt = self._annotations()
        return self._gt


# ------------------------------------------------------------------------------------------------------ TFDS

class TFDSSource(_Source):
    """TFDS coco/2017 from a local data_dir (no downloads), images kept encoded until the map decodes them.

    TFDS labels 0..79 follow the COCO categories in id order, so label + 1 is the contiguous label and the raw id
    comes from the 80-id COCO map. TFDS has no image sizes or category ids, so the eval ground truth is rebuilt
    from the eval records (pixel xywh from the normalized boxes and the JPEG header size, area w*h, is_crowd).
    """

    NUM_LABELS = 80

    def __init__(self, data_cfg: DataConfig, model_cfg: ModelConfig, image_dtype: tf.DType = tf.float32) -> None:
        super().__init__(data_cfg, model_cfg, image_dtype)
        self.category_map = coco_category_map()
        self._eval_scan: dict[str, np.ndarray] | None = None

    def _builder(self) -> Any:
        import tensorflow_datasets as tfds

        if self.cfg.data_dir and not os.path.isdir(self.cfg.data_dir):
            raise HarnessError(f"data.data_dir {self.cfg.data_dir} does not exist")
        try:
            return tfds.builder(self.cfg.tfds_name, data_dir=self.cfg.data_dir or None)
        except Exception as e:  # noqa: BLE001 - tfds raises many types for a missing dataset
            raise HarnessError(f"TFDS dataset {self.cfg.tfds_name} not found in {self.cfg.data_dir!r}: "
                               f"{str(e).splitlines()[0]}") from None

    def _load(self, split: str, ctx: InputContext | None) -> tf.data.Dataset:
        import tensorflow_datasets as tfds

        read_config = tfds.ReadConfig(shuffle_seed=ctx.seed if ctx else None,
                                      input_context=(tf.distribute.InputContext(ctx.num_hosts, ctx.host_id)
                                                     if ctx and ctx.num_hosts > 1 else None))
        try:
            return self._builder().as_dataset(split=split, shuffle_files=ctx is not None, read_config=read_config,
                                              decoders={"image": tfds.decode.SkipDecoding()})
        except HarnessError:
            raise
        except Exception as e:  # noqa: BLE001
            raise HarnessError(f"cannot read TFDS {self.cfg.tfds_name}[{split}] from {self.cfg.data_dir!r}: "
                               f"{str(e).splitlines()[0]}") from None

    @staticmethod
    def _objects(ex: dict[str, Any]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """ltrb boxes [N, 4], TFDS labels [N] (0..79) and is_crowd [N] int64 of one example."""
        obj = ex["objects"]
        ymin, xmin, ymax, xmax = tf.unstack(tf.reshape(obj["bbox"], [-1, 4]), axis=1)
        return (tf.stack([xmin, ymin, xmax, ymax], axis=1), tf.cast(obj["label"], tf.int64),
                tf.cast(obj["is_crowd"], tf.int64))

    def _scan(self, split: str, limit: int | None) -> Iterator[dict[str, Any]]:
        """Id, size, boxes, labels and crowd flags of a split's examples in order, checked one by one."""
        ds = self._load(split, None)
        if limit is not None:
            ds = ds.take(limit)

        def light(ex):
            boxes, labels, crowd = self._objects(ex)
            return {"id": ex["image/id"], "size": _image_shape(ex["image"]), "boxes": boxes, "labels": labels,
                    "crowd": crowd}
        for batch in ds.map(light).ragged_batch(256):
            ids, sizes = batch["id"].numpy(), batch["size"].numpy()
            boxes, labels, crowd = (batch[k].to_list() for k in ("boxes", "labels", "crowd"))
            for i in range(len(ids)):
                where = f"TFDS {self.cfg.tfds_name}[{split}] example with image id {int(ids[i])}"
                b = np.asarray(boxes[i], np.float32).reshape(-1, 4)
                if len(labels[i]) != len(b) or len(crowd[i]) != len(b):
                    raise HarnessError(f"{where} {BAD_LENGTHS}")
                if _box_problem(b):
                    raise HarnessError(f"{where} {BAD_BOX}")
                if any(not 0 <= v < self.NUM_LABELS for v in labels[i]):
                    raise HarnessError(f"{where} {UNMAPPED} (label outside 0..{self.NUM_LABELS - 1})")
                yield {"image_id": int(ids[i]), "size": sizes[i], "boxes": b,
                       "labels": np.asarray(labels[i], np.int64), "is_crowd": np.asarray(crowd[i], np.int64)}

    def _eval(self) -> dict[str, np.ndarray]:
        if self._eval_scan is None:
            rows = list(self._scan(self.cfg.tfds_eval_split, None))
            self._eval_scan = {
                "ids": np.asarray([r["image_id"] for r in rows], np.int64),
                "sizes": np.asarray([r["size"] for r in rows], np.int64).reshape(-1, 2),
                "boxes": [r["boxes"] for r in rows], "labels": [r["labels"] for r in rows],
                "is_crowd": [r["is_crowd"] for r in rows]}
        return self._eval_scan

    def validate(self) -> None:
        label = self._builder().info.features["objects"]["label"]
        if label.num_classes != self.NUM_LABELS:
            raise HarnessError(f"TFDS {self.cfg.tfds_name} has {label.num_classes} object labels; the COCO category "
                               f"map needs {self.NUM_LABELS}")
        ids = self._eval()["ids"]
        if len(np.unique(ids)) != len(ids):
            raise HarnessError(f"TFDS {self.cfg.tfds_name}[{self.cfg.tfds_eval_split}] repeats image ids")
        _check_count("eval images", self.cfg.eval_samples, len(ids), "eval_samples",
                     f"TFDS {self.cfg.tfds_name}[{self.cfg.tfds_eval_split}]")
        for _ in self._scan(self.cfg.tfds_train_split, TRAIN_SCAN_RECORDS):
            pass

    def train(self, ctx: InputContext) -> tf.data.Dataset:
        name = self.cfg.tfds_name

        def parse(ex):
            boxes, labels, _ = self._objects(ex)
            where = [f"TFDS {name} example with image id", ex["image/id"]]
            same = tf.debugging.Assert(tf.size(labels) == tf.shape(boxes)[0], [BAD_DATA_MARK, *where, BAD_LENGTHS])
            checks = [same, _check_boxes_in_graph(boxes, where),
                      tf.debugging.Assert(tf.reduce_all((labels >= 0) & (labels < self.NUM_LABELS)),
                                          [BAD_DATA_MARK, *where, UNMAPPED])]
            with tf.control_dependencies(checks):
                return tf.identity(ex["image"]), tf.identity(boxes), tf.cast(labels, tf.int32) + 1

        ds = self._load(self.cfg.tfds_train_split, ctx).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.filter(_has_boxes)
        ds = ds.repeat().shuffle(self.cfg.shuffle_buffer, seed=ctx.seed, reshuffle_each_iteration=True)
        return self._augment_encoded(ds, ctx)

    def eval_records(self) -> tf.data.Dataset:
        """The encoded eval images (scalar strings) in split order."""
        return self._load(self.cfg.tfds_eval_split, None).map(_encoded_image)

    def eval_parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        return preprocess_eval(_decode(record), self.size, self.image_dtype)

    def ground_truth(self) -> Any:
        """COCO ground truth rebuilt from the eval split (close to the json; areas are w*h, not mask areas)."""
        if self._gt is None:
            e = self._eval()
            per_image = [len(b) for b in e["boxes"]]
            ann_ids = np.repeat(e["ids"], per_image)
            hw = np.repeat(e["sizes"], per_image, axis=0).astype(np.float64)
            ltrb = (np.concatenate(e["boxes"]) if ann_ids.size else np.zeros((0, 4))).astype(np.float64)
            xywh = np.stack([ltrb[:, 0] * hw[:, 1], ltrb[:, 1] * hw[:, 0], (ltrb[:, 2] - ltrb[:, 0]) * hw[:, 1],
                             (ltrb[:, 3] - ltrb[:, 1]) * hw[:, 0]], axis=1)
            labels = np.concatenate(e["labels"]) if ann_ids.size else np.zeros(0, np.int64)
            crowd = np.concatenate(e["is_crowd"]) if ann_ids.size else np.zeros(0, np.int64)
            self._gt = ground_truth_from_arrays(e["ids"], e["sizes"], ann_ids, xywh,
                                                self.category_map.to_category(labels + 1),
                                                categories=self.category_map.category_ids, iscrowd=crowd)
        return self._gt


Source = SyntheticSource | TFRecordSource | TFDSSource


def make_source(data_cfg: DataConfig, model_cfg: ModelConfig, compute_dtype: tf.DType = tf.float32) -> Source:
    """The input source named by data_cfg.source; constructing it reads nothing (validate() and train() do).
    Its images leave the host in `compute_dtype` under `data.images_in_compute_dtype`, else float32."""
    dtype = compute_dtype if data_cfg.images_in_compute_dtype else tf.float32
    return {"synthetic": SyntheticSource, "tfrecord": TFRecordSource, "tfds": TFDSSource}[data_cfg.source](
        data_cfg, model_cfg, dtype)
