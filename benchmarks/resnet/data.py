"""ResNet inputs: ImageNet TFRecords, TFDS imagenet2012, or a learnable synthetic image set.

Train pipelines are sharded per host, shuffled, repeated and decoded in parallel. Eval sources return
raw records in a fixed order; the harness pads, shards and parses them so each eval example counts once.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from harness.train.datafiles import check_count, check_examples, counted_records, list_files, sharded_records
from harness.errors import BAD_DATA_MARK, HarnessError
from harness.runtime.base import InputContext
from harness.train.input_pipeline import to_uint8

from benchmarks.resnet.config import DataConfig

# The TF reference subtracts per-channel means from 0..255 pixels (imagenet_preprocessing.py
# CHANNEL_MEANS); Google's TPU pipeline also divides by per-channel stddevs.
REFERENCE_MEAN_RGB = (123.68, 116.78, 103.94)
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_PADDING = 32


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """One named set of ImageNet preprocessing steps (`data.preprocessing`)."""

    area_range: tuple[float, float]
    aspect_ratio_range: tuple[float, float]
    max_attempts: int
    dataset_boxes: bool  # pass the records' image/object/bbox boxes to the crop sampler
    eval_resize_then_crop: bool  # True: shorter side to size*8/7, central crop; False: crop 7/8, resize
    divide_by_stddev: bool
    v1_resize: bool  # tf.compat.v1.image.resize (no half-pixel centres), as the reference calls it


PREPROCESSING = {
    # The MLPerf TF reference (imagenet_preprocessing.py): sample_distorted_bounding_box over the
    # dataset's boxes, min_object_covered 0.1, aspect 0.75-1.33, area 5%-100%, 100 attempts, flip,
    # bilinear resize; eval: aspect-preserving resize of the shorter side to 256, central 224 crop;
    # mean subtraction only.
    "reference": Preprocessing((0.05, 1.0), (0.75, 1.33), 100, True, True, False, True),
    # Google's accepted v0.7 TPU submission (resnet_preprocessing.py): whole-image box, area 8%-100%,
    # aspect 3/4-4/3, 10 attempts; eval: central 224/256 of the shorter side, resized; mean and stddev.
    "google_tpu": Preprocessing((0.08, 1.0), (3 / 4, 4 / 3), 10, False, False, True, False),
}


def normalize(image: tf.Tensor, prep: Preprocessing) -> tf.Tensor:
    """Per-channel mean subtracted (and stddev divided, per `prep`). The subtraction is a bias_add of the
    negated means: the same float32 results as `image - mean` (negation is exact), without the broadcast
    over a last dimension of 3 that made it as costly as the resize on the host."""
    image = tf.cast(image, tf.float32)
    if prep.divide_by_stddev:
        return tf.nn.bias_add(image, [-m for m in MEAN_RGB]) / STDDEV_RGB
    return tf.nn.bias_add(image, [-m for m in REFERENCE_MEAN_RGB])


@functools.lru_cache(maxsize=None)
def fused_normalize(prep: Preprocessing, dtype: tf.DType) -> Callable[[tf.Tensor], tf.Tensor]:
    """`normalize` then the cast to `dtype` as one XLA-compiled loop over the pixels (the image's shape is fixed
    after the resize, so it compiles once): the host's two float passes were ~15% of its work per image. Bit for
    bit the unfused result when only the means are subtracted (a test compares); with the stddev division XLA
    multiplies by the reciprocal instead, so that preprocessing keeps the unfused ops."""
    if prep.divide_by_stddev:
        return lambda image: tf.cast(normalize(image, prep), dtype)
    return tf.function(lambda image: tf.cast(normalize(image, prep), dtype), jit_compile=True, autograph=False)


def host_image(image: tf.Tensor, on_device: bool, prep: Preprocessing,
               dtype: tf.DType = tf.float32, in_step: bool = False) -> tf.Tensor:
    """The training image as the host sends it: normalized and cast to `dtype` (the model's compute dtype
    under `data.images_in_compute_dtype`, which its first op would cast to anyway); (`data.normalize_on_device`)
    the resized pixels rounded to uint8; or (`in_step`, `data.normalize_in_step`) the resized float32 pixels
    as they are. `device_image` normalizes the last two in the train step."""
    if on_device:
        return to_uint8(image)
    if in_step:
        return image
    return fused_normalize(prep, dtype)(image)


def device_image(image: tf.Tensor, prep: Preprocessing | None, raw: bool = False,
                 flip: tf.Tensor | None = None) -> tf.Tensor:
    """The model's input from a batch, on the device: uint8 pixels (or, `raw`, float32 pixels not yet
    normalized) are normalized here; `flip` ([batch] bool, `data.flip_on_device`) mirrors the images whose
    coin came up. Float images the host normalized pass through."""
    if prep is not None and (image.dtype == tf.uint8 or raw):
        image = normalize(image, prep)
    if flip is not None:
        image = flip_where(image, flip)
    return image


def flip_where(images: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
    """Each image of a [batch, height, width, channels] batch mirrored left-right where `flip` is true (a
    strided slice: DTensor's mesh runtime has no layout rule for tf.reverse)."""
    return tf.where(tf.reshape(flip, [-1, 1, 1, 1]), images[:, :, ::-1], images)


def flip_coin(seed: tf.Tensor) -> tf.Tensor:
    """The coin `tf.image.stateless_random_flip_left_right(image, seed)` tosses: a uniform draw below 0.5 (a
    test checks the two agree), so a flip on the device is the host's flip of the same example."""
    return tf.random.stateless_uniform([], seed, 0, 1.0) < 0.5


def train_image(batch: dict[str, tf.Tensor], source: Any) -> tf.Tensor:
    """The model's training input from a batch of `source`'s training examples (see `device_image`)."""
    return device_image(batch["image"], getattr(source, "prep", None), getattr(source, "normalizes_in_step", False),
                        batch.get("flip"))


def train_features(image: tf.Tensor, label: tf.Tensor, seed: tf.Tensor, cfg: DataConfig, prep: Preprocessing,
                   dtype: tf.DType) -> dict[str, tf.Tensor]:
    """One training example as the host sends it: the image (per `host_image`), its label and, with
    `data.flip_on_device`, the flip coin of its `seed` (the crop was resized unflipped)."""
    # Three channels, static: the host's ops may leave the channel count unknown (a crop of a TFDS image),
    # and the device's normalization needs it (the warm-up's zeros take the static shape).
    image = tf.ensure_shape(image, [image.shape[0], image.shape[1], 3])
    features = {"image": host_image(image, cfg.normalize_on_device, prep, dtype, cfg.normalize_in_step),
                "label": label}
    if cfg.flip_on_device:
        features["flip"] = flip_coin(seed + 1)
    return features


def _resize(image: tf.Tensor, height: tf.Tensor | int, width: tf.Tensor | int, prep: Preprocessing) -> tf.Tensor:
    if prep.v1_resize:
        return tf.compat.v1.image.resize(image, [height, width], method=tf.image.ResizeMethod.BILINEAR,
                                         align_corners=False)
    return tf.image.resize(image, [height, width], method="bilinear")


# --------------------------------------------------------------------------------- preprocessing

def _whole_image_box() -> tf.Tensor:
    return tf.constant([[[0.0, 0.0, 1.0, 1.0]]])


def sample_crop(image_shape: tf.Tensor, boxes: tf.Tensor, seed: tf.Tensor,
                prep: Preprocessing) -> tuple[tf.Tensor, tf.Tensor]:
    """The random training crop window (begin, size); boxes is [1, N, 4] (ymin, xmin, ymax, xmax).

    With no boxes (N = 0) the sampler uses the whole image, as the reference's
    use_image_if_no_bounding_boxes=True does.
    """
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_shape, boxes, seed=seed, min_object_covered=0.1, aspect_ratio_range=prep.aspect_ratio_range,
        area_range=prep.area_range, max_attempts=prep.max_attempts, use_image_if_no_bounding_boxes=True)
    return begin, crop


def random_resized_crop_jpeg(encoded: tf.Tensor, size: int, seed: tf.Tensor, prep: Preprocessing,
                             boxes: tf.Tensor | None = None, decode_and_crop: bool = True,
                             flip: bool = True) -> tf.Tensor:
    """Training crop decoding only the crop window (or, `decode_and_crop=False`, the whole image, then
    slicing the same window), then flip and resize (steps per `prep`; `flip=False`: the device flips)."""
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, crop = sample_crop(shape, boxes if boxes is not None else _whole_image_box(), seed, prep)
    if decode_and_crop:
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(crop)
        image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)
    else:
        image = tf.slice(tf.image.decode_jpeg(encoded, channels=3), begin, crop)
    return _flip_and_resize(image, size, seed, prep, flip)


def random_resized_crop_decoded(image: tf.Tensor, size: int, seed: tf.Tensor, prep: Preprocessing,
                                flip: bool = True) -> tf.Tensor:
    """Training crop of a decoded image (TFDS imagenet2012 carries no boxes: whole-image box)."""
    begin, crop = sample_crop(tf.shape(image), _whole_image_box(), seed, prep)
    return _flip_and_resize(tf.slice(image, begin, crop), size, seed, prep, flip)


def _flip_and_resize(image: tf.Tensor, size: int, seed: tf.Tensor, prep: Preprocessing, flip: bool = True) -> tf.Tensor:
    """The crop flipped (with the coin of `seed + 1`) and resized; `flip=False` leaves the flip to the device,
    after the resize (the reference preprocessing flips before it: see `data.flip_on_device`)."""
    if not flip:
        return _resize(image, size, size, prep)
    if prep.v1_resize:
        # Reference order: flip the crop, then resize it.
        image = tf.image.stateless_random_flip_left_right(image, seed + 1)
        return _resize(image, size, size, prep)
    image = _resize(image, size, size, prep)
    return tf.image.stateless_random_flip_left_right(image, seed + 1)


def eval_crop(image: tf.Tensor, size: int, prep: Preprocessing) -> tf.Tensor:
    """The eval image: reference = resize the shorter side to size*8/7 (256 for 224) keeping the aspect
    ratio, then the central size x size; google_tpu = central size/(size+32) of the shorter side, resized."""
    shape = tf.shape(image)
    h, w = shape[0], shape[1]
    if prep.eval_resize_then_crop:
        resize_min = round(size * 256 / 224)
        scale = resize_min / tf.cast(tf.minimum(h, w), tf.float32)
        new_h = tf.cast(tf.cast(h, tf.float32) * scale, tf.int32)
        new_w = tf.cast(tf.cast(w, tf.float32) * scale, tf.int32)
        image = _resize(image, new_h, new_w, prep)
        top, left = (new_h - size) // 2, (new_w - size) // 2
        return tf.ensure_shape(image[top:top + size, left:left + size, :], [size, size, 3])
    crop = tf.cast(size / (size + CROP_PADDING) * tf.cast(tf.minimum(h, w), tf.float32), tf.int32)
    y, x = (h - crop + 1) // 2, (w - crop + 1) // 2
    return _resize(image[y:y + crop, x:x + crop], size, size, prep)


# ------------------------------------------------------------------------------------ TFRecords

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
BOX_KEYS = ("ymin", "xmin", "ymax", "xmax")  # the reference's order for sample_distorted_bounding_box
# Ragged (a dense 1-D tensor per record): the same values as VarLenFeature without a SparseTensor to densify.
BOX_FEATURES = {f"image/object/bbox/{k}": tf.io.RaggedFeature(tf.float32) for k in BOX_KEYS}


def numbered_records(file: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The records of one file as (file, index in it, record): what an in-graph check about a record names."""
    return tf.data.TFRecordDataset(file).enumerate().map(lambda i, record: (file, i, record))


def image_dtype(cfg: DataConfig, compute_dtype: tf.DType) -> tf.DType:
    """The dtype of the images the host sends (see `data.images_in_compute_dtype`)."""
    return compute_dtype if cfg.images_in_compute_dtype else tf.float32


def train_image_dtype(cfg: DataConfig, normalized: tf.DType) -> tf.DType:
    """The dtype of the training images the host sends: uint8, float32 pixels, or normalized in `normalized`."""
    if cfg.normalize_on_device:
        return tf.uint8
    return tf.float32 if cfg.normalize_in_step else normalized


class TFRecordSource:
    def __init__(self, cfg: DataConfig, compute_dtype: tf.DType = tf.float32) -> None:
        self.cfg = cfg
        self.prep = PREPROCESSING[cfg.preprocessing]
        self.image_dtype = image_dtype(cfg, compute_dtype)
        self.normalizes_in_step = cfg.normalize_in_step and not cfg.normalize_on_device
        self.train_image_dtype = train_image_dtype(cfg, self.image_dtype)

    def files(self, pattern: str) -> list[str]:
        return list_files(self.cfg.data_dir, pattern, "ImageNet shards")

    def counts(self) -> dict[str, int]:
        """Records in the training and eval files (from the record headers, cached beside the data)."""
        return {"train_samples": counted_records(self.files(self.cfg.train_pattern)),
                "eval_samples": counted_records(self.files(self.cfg.eval_pattern))}

    def validate(self) -> None:
        """The files exist and hold exactly data.train_samples / data.eval_samples images."""
        for key, counted in self.counts().items():
            pattern = self.cfg.train_pattern if key == "train_samples" else self.cfg.eval_pattern
            check_count(key, getattr(self.cfg, key), counted, "images", f"{pattern} under {self.cfg.data_dir}")
        for pattern in (self.cfg.train_pattern, self.cfg.eval_pattern):
            check_examples(self.files(pattern), FEATURES, "ImageNet images (image/encoded JPEG, "
                           "image/class/label)")

    def parse(self, record: tf.Tensor, where: list | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        return self._parse(record, FEATURES, where)[:2]

    def parse_with_boxes(self, record: tf.Tensor, where: list | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Image, label and the record's object boxes as [1, N, 4] (N = 0 when it has none)."""
        return self._parse(record, {**FEATURES, **BOX_FEATURES}, where)

    def _parse(self, record: tf.Tensor, features: dict,
               where: list | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """`where` names the record in a failed check (items of a tf.debugging.Assert: strings and tensors)."""
        where = where or [f"a record under {self.cfg.data_dir}"]
        ex = tf.io.parse_single_example(record, features)
        if BOX_FEATURES.keys() <= ex.keys():
            coords = [ex[f"image/object/bbox/{k}"] for k in BOX_KEYS]
            boxes = tf.expand_dims(tf.stack(coords, axis=-1), 0)
        else:
            boxes = tf.zeros([1, 0, 4])
        label = tf.cast(ex["image/class/label"], tf.int32) - self.cfg.label_offset
        # A wrong label_offset would otherwise give all-zero one-hot targets and train on silently.
        check = tf.debugging.Assert(
            tf.logical_and(label >= 0, label < self.cfg.num_classes),
            [BAD_DATA_MARK, *where, "has image/class/label minus data.label_offset =", label,
             f"outside [0, {self.cfg.num_classes}) (data.num_classes; a wrong data.label_offset?)"])
        with tf.control_dependencies([check]):
            return tf.identity(ex["image/encoded"]), tf.identity(label), boxes

    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        """Training examples (`repeat=False`: one epoch, for the tf.data service). Element order follows
        the dataset options' `deterministic` (data.deterministic, applied by the harness)."""
        c = self.cfg
        ds = sharded_records(self.files(c.train_pattern), ctx, c.shuffle_buffer, cycle_length=c.parallel_reads,
                             deterministic=None, repeat=repeat, read_threads=c.read_threads,
                             read_ahead=True, reader=numbered_records)
        size = c.image_size
        base = tf.constant([ctx.seed, ctx.host_id], tf.int64)

        prep = self.prep

        def preprocess(index: tf.Tensor, item: tuple[tf.Tensor, tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
            file, number, record = item
            where = ["record", number, "of", file]
            encoded, label, boxes = self.parse_with_boxes(record, where)
            # A record whose image is not a JPEG at all (another format, garbage) is named here; the decoder's
            # own error could not say which record it met.
            is_jpeg = tf.debugging.Assert(tf.io.is_jpeg(encoded), [BAD_DATA_MARK, *where,
                                                                   "has an image/encoded that is not a JPEG"])
            with tf.control_dependencies([is_jpeg]):
                encoded = tf.identity(encoded)
            seed = tf.stack([base[0] * 1000003 + base[1], index])
            image = random_resized_crop_jpeg(encoded, size, seed, prep, boxes if prep.dataset_boxes else None,
                                             c.decode_and_crop, flip=not c.flip_on_device)
            return train_features(image, label, seed, c, prep, self.image_dtype)

        if not repeat:  # every service job would restart the index at 0: draw each example's crop seed
            return ds.map(lambda *item: preprocess(tf.random.uniform([], 0, 1 << 62, tf.int64), item),
                          num_parallel_calls=tf.data.AUTOTUNE)
        return ds.enumerate().map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)

    def eval_records(self) -> tf.data.Dataset:
        """The eval files' records in order, each with its file and number (a dict: the eval padding maps a
        single element), so that a bad label or image met mid-run names its record and file."""
        files = tf.data.Dataset.from_tensor_slices(self.files(self.cfg.eval_pattern))
        return files.flat_map(lambda f: numbered_records(f).map(
            lambda file, number, record: {"file": file, "number": number, "record": record}))

    def eval_parse(self, item: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        where = ["eval record", item["number"], "of", item["file"]]
        encoded, label = self.parse(item["record"], where)
        is_jpeg = tf.debugging.Assert(tf.io.is_jpeg(encoded), [BAD_DATA_MARK, *where,
                                                               "has an image/encoded that is not a JPEG"])
        with tf.control_dependencies([is_jpeg]):
            image = tf.image.decode_jpeg(encoded, channels=3)
        image = normalize(eval_crop(image, self.cfg.image_size, self.prep), self.prep)
        return {"image": tf.cast(image, self.image_dtype), "label": label}


# ----------------------------------------------------------------------------------------- TFDS

class TFDSSource:
    """imagenet2012 (or any image classification dataset) from a local TFDS data dir; no downloads.

    TFDS imagenet2012 carries no object boxes, so the training crop samples over the whole image (what
    the reference does for a record without boxes).
    """

    def __init__(self, cfg: DataConfig, compute_dtype: tf.DType = tf.float32) -> None:
        self.cfg = cfg
        self.prep = PREPROCESSING[cfg.preprocessing]
        self.image_dtype = image_dtype(cfg, compute_dtype)
        self.normalizes_in_step = cfg.normalize_in_step and not cfg.normalize_on_device
        self.train_image_dtype = train_image_dtype(cfg, self.image_dtype)

    def builder(self) -> Any:
        import tensorflow_datasets as tfds

        try:
            return tfds.builder(self.cfg.tfds_name, data_dir=self.cfg.data_dir or None)
        except Exception as e:  # noqa: BLE001 - tfds raises many types for a missing dataset
            raise HarnessError(f"TFDS dataset {self.cfg.tfds_name} not found in {self.cfg.data_dir!r}: "
                               f"{str(e).splitlines()[0]}") from None

    def validate(self) -> None:
        if self.cfg.data_dir and not os.path.isdir(self.cfg.data_dir):
            raise HarnessError(f"data.data_dir {self.cfg.data_dir} does not exist")

    def _load(self, split: str, shuffle: bool, ctx: InputContext | None) -> tf.data.Dataset:
        import tensorflow_datasets as tfds

        read_config = tfds.ReadConfig(shuffle_seed=ctx.seed if ctx else None,
                                      input_context=(tf.distribute.InputContext(ctx.num_hosts, ctx.host_id)
                                                     if ctx and ctx.num_hosts > 1 else None))
        try:
            return self.builder().as_dataset(split=split, shuffle_files=shuffle, read_config=read_config,
                                             decoders=None)
        except Exception as e:  # noqa: BLE001
            raise HarnessError(f"cannot read TFDS {self.cfg.tfds_name}[{split}] from {self.cfg.data_dir!r}: "
                               f"{str(e).splitlines()[0]}") from None

    def train(self, ctx: InputContext) -> tf.data.Dataset:
        ds = self._load("train", True, ctx).repeat().shuffle(self.cfg.shuffle_buffer, seed=ctx.seed)
        size, prep = self.cfg.image_size, self.prep

        def preprocess(index: tf.Tensor, ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            seed = tf.stack([tf.constant(ctx.seed * 1000003 + ctx.host_id, tf.int64), index])
            image = random_resized_crop_decoded(ex["image"], size, seed, prep, flip=not self.cfg.flip_on_device)
            return train_features(image, tf.cast(ex["label"], tf.int32), seed, self.cfg, prep, self.image_dtype)

        return ds.enumerate().map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)

    def eval_records(self) -> tf.data.Dataset:
        return self._load("validation", False, None)

    def eval_parse(self, ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        image = normalize(eval_crop(ex["image"], self.cfg.image_size, self.prep), self.prep)
        return {"image": tf.cast(image, self.image_dtype), "label": tf.cast(ex["label"], tf.int32)}


# ------------------------------------------------------------------------------------ synthetic

class SyntheticSource:
    """Learnable images: a smooth random prototype per class plus pixel noise.

    Deterministic from `synthetic_seed` (the data) and the run seed (the order). A fraction
    `synthetic_label_noise` of images shows another class's prototype, which keeps accuracy below 1.0
    (the checker rejects 1.0) while a small ResNet still passes 0.759 within a few epochs. Train and
    eval images come from disjoint index streams. Images are generated at the model's size and already
    centred, so `data.preprocessing` does not apply: crops of a smooth random prototype would only
    make a smoke run slower, not closer to the reference.
    """

    EVAL_STREAM = 1 << 40

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        rng = np.random.default_rng(cfg.synthetic_seed)
        low = rng.normal(size=(cfg.num_classes, 4, 4, 3)).astype(np.float32)
        self.prototypes = tf.image.resize(low, [cfg.image_size, cfg.image_size], method="bicubic")

    def validate(self) -> None:
        pass

    def example(self, index: tf.Tensor) -> dict[str, tf.Tensor]:
        c = self.cfg
        seed = tf.stack([tf.constant(c.synthetic_seed, tf.int64), index])
        label = tf.random.stateless_uniform([], seed, 0, c.num_classes, dtype=tf.int32)
        u = tf.random.stateless_uniform([], seed + 1)
        other = tf.random.stateless_uniform([], seed + 2, 0, c.num_classes, dtype=tf.int32)
        shown = tf.where(u < c.synthetic_label_noise, other, label)
        noise = tf.random.stateless_normal([c.image_size, c.image_size, 3], seed + 3, stddev=c.synthetic_noise)
        return {"image": tf.gather(self.prototypes, shown) + noise, "label": label}

    CACHE_BYTES = 1 << 30

    def train(self, ctx: InputContext, repeat: bool = True) -> tf.data.Dataset:
        c = self.cfg
        ds = tf.data.Dataset.range(c.train_samples).shard(ctx.num_hosts, ctx.host_id)
        per_host = -(-c.train_samples // ctx.num_hosts)
        if not repeat:  # one epoch (tf.data service): the workers generate, shuffled afresh per job
            return ds.shuffle(min(per_host, c.shuffle_buffer)).map(self.example, num_parallel_calls=tf.data.AUTOTUNE)
        if per_host * c.image_size ** 2 * 3 * 4 <= self.CACHE_BYTES:
            # Small sets are generated once (during the first epoch) and replayed from memory, so later
            # epochs leave the CPU to the model, as a real input pipeline on its own hosts would.
            ds = ds.map(self.example, num_parallel_calls=tf.data.AUTOTUNE).cache()
            return ds.shuffle(min(per_host, c.shuffle_buffer), seed=ctx.seed,
                              reshuffle_each_iteration=True).repeat()
        ds = ds.shuffle(min(per_host, c.shuffle_buffer), seed=ctx.seed, reshuffle_each_iteration=True).repeat()
        return ds.map(self.example, num_parallel_calls=tf.data.AUTOTUNE)

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.Dataset.range(self.EVAL_STREAM, self.EVAL_STREAM + self.cfg.eval_samples)

    def eval_parse(self, index: tf.Tensor) -> dict[str, tf.Tensor]:
        return self.example(index)


def make_source(cfg: DataConfig, compute_dtype: tf.DType = tf.float32) -> Any:
    if cfg.source == "synthetic":
        return SyntheticSource(cfg)
    return {"tfrecord": TFRecordSource, "tfds": TFDSSource}[cfg.source](cfg, compute_dtype)
