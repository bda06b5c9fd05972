"""The training input pipeline alone, against the bare rate of its most expensive op, in one process.

The pipeline side is the harness's own training input (`harness.train.loop.train_input`: records ->
parsed -> the reference preprocessing -> batched -> device-ready) over files this script writes at real
sizes in a temp dir. The bare side is the pipeline's most expensive op alone in a tight tf.data map with
the same parallelism and the pipeline's tf.data options, over the same encoded images already in memory. Rounds
alternate between the sides (A B C, then C B A; every side's iterator warmed up once and kept), the pipeline
and its floor always back to back: the headline `pipeline / floor` is the median of the rounds' ratios (the
machine's other load moves between rounds far more than within one), printed with their spread and the load
average over the rounds.

    python scripts/bench_input.py {resnet,ssd,bert,transformer,lm} [CONFIG] [--set key=value ...] [--seconds 2]
        [--rounds 8] [--ablate]

resnet: ImageNet-like JPEGs of 500x375 with one object box each; the bare op is
`decode_and_crop_jpeg` of the same crop windows the reference's sampler draws. A third side, the floor,
adds to that decode the least a pipeline feeding fixed-size images must do (nearest resize, uint8,
batched): the ratio pipeline / floor is the overhead the harness could still remove. Runs in bfloat16
(what the GPU and TPU configs compute in) unless `--set runtime.precision=...`.

ssd: COCO-like JPEGs of 640x480 with 1-6 boxes each and an 80-category instances json; the bare op is the
decode of each image's SSD crop window (drawn by the reference's sampler from the boxes alone, so before any
pixel is decoded; only the JPEG blocks around it, as data.decode_crop_window does); the floor adds a nearest
resize to 300x300, uint8. With data.jitter_on_device (the default) the colour jitter is the train step's work.

bert: MLPerf BERT records at the reference's sizes (512 tokens, 76 predictions); the bare op is the parse
itself (tf.io.parse_example over blocks, or parse_single_example with data.parse_block=1).
transformer: subword pairs with WMT-like lengths, packed into rows of 256; both sides count pairs (the
pipeline's are in packed rows); the bare op is tf.io.parse_example over blocks, as the pipeline parses.
lm: the decoder LMs' indexed reader (benchmarks/lm, `data.source=indexed`; gpt_oss_20b's reference config, or
CONFIG, e.g. configs/llama31_8b/reference.yaml) over Megatron .bin/.idx files of C4-like documents; the bare op
reads the same token rows with TensorFlow alone (fixed-length records, decode_raw). For bert, transformer and lm
the floor is the bare read and parse.

`--ablate` repeats the
measurement with each `data.*` input technique off (and each optional one on) and prints each ratio.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from benchmarks import registry  # noqa: E402
from harness import config as config_lib  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402
from harness.train.input_pipeline import pipeline_config, train_options  # noqa: E402
from harness.train.loop import eval_input, eval_steps_for, train_input  # noqa: E402

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ------------------------------------------------------------------------------------------ data

def photo_like(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth random scene with edges and grain: JPEG sizes and decode cost near a real photo's."""
    low = rng.uniform(0, 255, size=(height // 25 + 1, width // 25 + 1, 3)).astype(np.float32)
    image = tf.image.resize(low, [height, width], method="bicubic").numpy()
    for _ in range(6):  # a few hard-edged objects
        y, x = rng.integers(0, height - 40), rng.integers(0, width - 40)
        h, w = rng.integers(20, height // 2), rng.integers(20, width // 2)
        image[y:y + h, x:x + w] = rng.uniform(0, 255, size=3)
    image += rng.normal(0, 12, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_imagenet_like(out_dir: str, images: int, shards: int = 8,
                        seed: int = 0) -> tuple[list[bytes], np.ndarray]:
    """`train-*`/`validation-*` shards of 500x375 JPEGs with one object box each; returns the encoded
    JPEGs and their boxes [N, 4] (ymin, xmin, ymax, xmax)."""
    rng = np.random.default_rng(seed)
    encoded = []
    for i in range(images):
        h, w = (375, 500) if i % 4 else (500, 375)
        encoded.append(tf.io.encode_jpeg(photo_like(rng, h, w), quality=90).numpy())
    corner = rng.uniform(0, 0.4, size=(images, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(0.3, 0.6, size=(images, 2))], axis=1).astype(np.float32)
    for split in ("train", "validation"):
        writers = [tf.io.TFRecordWriter(os.path.join(out_dir, f"{split}-{k:05d}-of-{shards:05d}"))
                   for k in range(shards)]
        for i, jpeg in enumerate(encoded):
            y0, x0, y1, x1 = boxes[i].tolist()
            f = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                 "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1 + i % 1000])),
                 **{f"image/object/bbox/{k}": tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
                    for k, v in zip(("ymin", "xmin", "ymax", "xmax"), (y0, x0, y1, x1))}}
            writers[i % shards].write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
        for wr in writers:
            wr.close()
    return encoded, boxes


COCO_CATEGORIES = 80


def write_coco_like(out_dir: str, images: int, shards: int = 8,
                    seed: int = 0) -> tuple[list[bytes], str, list[np.ndarray]]:
    """`train-*`/`val-*` shards of 640x480 (and 480x640) photo-like JPEGs with 1-6 boxes each, in
    tensorflow/tpu's create_coco_tf_record schema, and `instances_val.json` with 80 categories; returns the
    encoded JPEGs, the json's path and each image's boxes [n, 4] (ltrb, normalized)."""
    from benchmarks.ssd.tfrecord_writer import coco_example

    rng = np.random.default_rng(seed)
    names = {c: f"category_{c}" for c in range(1, COCO_CATEGORIES + 1)}
    records, encoded, gt_images, annotations, all_boxes = [], [], [], [], []
    for i in range(images):
        h, w = (480, 640) if i % 4 else (640, 480)
        pixels = photo_like(rng, h, w)
        n = int(rng.integers(1, 7))
        lt = rng.uniform(0, 0.6, size=(n, 2))
        boxes = np.concatenate([lt, lt + rng.uniform(0.1, 0.4, size=(n, 2))], axis=1).clip(0, 1)
        cats = rng.integers(1, COCO_CATEGORIES + 1, size=n)
        all_boxes.append(boxes.astype(np.float32))
        record = coco_example(pixels, i + 1, boxes, cats, names, image_format="jpeg")
        records.append(record)
        encoded.append(tf.train.Example.FromString(record).features.feature["image/encoded"].bytes_list.value[0])
        gt_images.append({"id": i + 1, "width": w, "height": h, "file_name": f"{i + 1:012d}.jpg"})
        for (l, t, r, b), c in zip(boxes.tolist(), cats.tolist()):
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": c, "iscrowd": 0,
                                "bbox": [l * w, t * h, (r - l) * w, (b - t) * h], "area": (r - l) * w * (b - t) * h})
    for split in ("train", "val"):
        writers = [tf.io.TFRecordWriter(os.path.join(out_dir, f"{split}-{k:05d}-of-{shards:05d}"))
                   for k in range(shards)]
        for i, record in enumerate(records):
            writers[i % shards].write(record)
        for wr in writers:
            wr.close()
    path = os.path.join(out_dir, "instances_val.json")
    with open(path, "w") as f:
        json.dump({"images": gt_images, "annotations": annotations,
                   "categories": [{"id": c, "name": n, "supercategory": "thing"} for c, n in names.items()]}, f)
    return encoded, path, all_boxes


def write_bert_like(out_dir: str, sequences: int, shards: int = 8, seed: int = 0) -> list[bytes]:
    """`part-*` and `eval_10k` shards of MLPerf BERT records at the reference's sizes (512 tokens, 76
    predictions), from the synthetic grammar; returns the serialized records."""
    from benchmarks.bert import tfrecord_writer
    from benchmarks.bert.config import DataConfig
    from benchmarks.bert.data import SyntheticSource

    cfg = DataConfig(seq_length=512, max_predictions=76, synthetic_seed=seed)
    arrays = SyntheticSource(cfg, 30522).generate(sequences, stream=1)
    records = [tfrecord_writer.to_example(row).SerializeToString() for row in tfrecord_writer.rows(arrays)]
    for k in range(shards):
        with tf.io.TFRecordWriter(os.path.join(out_dir, f"part-{k:05d}-of-{shards:05d}")) as w:
            for record in records[k::shards]:
                w.write(record)
    with tf.io.TFRecordWriter(os.path.join(out_dir, "eval_10k")) as w:
        for record in records:
            w.write(record)
    return records


def write_wmt_like(out_dir: str, pairs: int, shards: int = 8, seed: int = 0,
                   max_length: int = 80, row_length: int = 256) -> tuple[list[bytes], list[str]]:
    """`*encoded-train*` shards of (inputs, targets) subword-id pairs with WMT14 en-de-like lengths (EOS
    included: lognormal around 30 subwords, a few longer than the 80 the length filter keeps), and the
    vocab and newstest files the source validates; returns the records and the `data.*` overrides."""
    from benchmarks.transformer import packing, tfrecord_writer

    info = tfrecord_writer.write_synthetic(out_dir, 16, 8, seed=seed, shards=1)  # vocab + eval files
    for f in os.listdir(out_dir):
        if "encoded-train" in f:
            os.remove(os.path.join(out_dir, f))
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(28), 0.55, size=(pairs, 2)), 2, 160).astype(np.int64)
    records = [tfrecord_writer._example(rng.integers(3, 300, n_in).tolist() + [1],
                                        rng.integers(3, 300, n_tgt).tolist() + [1])
               for n_in, n_tgt in lengths - 1]
    writers = [tf.io.TFRecordWriter(os.path.join(out_dir, f"wmt-encoded-train-{k + 1:05d}-of-{shards:05d}"))
               for k in range(shards)]
    for i, record in enumerate(records):  # round-robin: the order the source packs in
        writers[i % shards].write(record)
    for w in writers:
        w.close()
    rows = packing.count_rows(lengths.tolist(), row_length, max_length, True)
    return records, [f"data.{k}={v}" for k, v in info.items() if k not in ("train_samples", "row_length",
                                                                          "max_sequence_length")] + [
        f"data.train_samples={rows}", f"data.max_sequence_length={max_length}", f"data.row_length={row_length}"]


def write_c4_like(out_dir: str, rows: int, seq_length: int, vocab: int, eod_id: int, seed: int = 0) -> tuple[str, int]:
    """`c4-like.{bin,idx}`: Megatron indexed uint32/uint16 token documents (lognormal lengths around 500 tokens,
    each ending in EOD) holding `rows` rows of seq_length + 1 tokens; returns the prefix and the token bytes."""
    from benchmarks.lm import indexed_dataset

    rng = np.random.default_rng(seed)
    dtype = np.uint16 if vocab <= 1 << 16 else np.int32
    need, docs = rows * seq_length + 1, []
    while need > 0:
        n = int(min(need, max(2, rng.lognormal(np.log(500), 0.8))))
        docs.append(np.append(rng.integers(0, vocab, n - 1), eod_id).astype(dtype))
        need -= n
    prefix = os.path.join(out_dir, "c4-like")
    indexed_dataset.write(prefix, docs, dtype)
    return prefix, np.dtype(dtype).itemsize


# ------------------------------------------------------------------------------------- pipelines

def harness_batches(config: str, overrides: list[str], batch: int) -> tuple[Any, Any]:
    """(the harness's device-ready training batches, an iterable; (workload, runtime, config))."""
    cfg = config_lib.load_config(config, overrides)
    runtime = make_runtime(cfg.runtime)
    workload = registry.get(cfg.workload)(cfg, runtime)
    workload.validate()
    return train_input(runtime, workload, batch, cfg.seed), (workload, runtime, cfg)


def bare_resnet(encoded: list[bytes], boxes: np.ndarray, workload: Any, batch: int) -> Any:
    """decode_and_crop_jpeg alone, on crop windows the reference sampler draws from the same boxes,
    AUTOTUNE parallelism, over the encoded images in memory."""
    from benchmarks.resnet import data

    prep = data.PREPROCESSING[workload.cfg.data.preprocessing]

    def decode(index: tf.Tensor, item: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        jpeg, box = item
        begin, crop = data.sample_crop(tf.io.extract_jpeg_shape(jpeg), tf.reshape(box, [1, 1, 4]),
                                       tf.stack([tf.constant(7, tf.int64), index]), prep)
        window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
        return tf.shape(tf.image.decode_and_crop_jpeg(jpeg, window, channels=3))

    ds = tf.data.Dataset.from_tensor_slices((encoded, boxes)).repeat().enumerate()
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.batch(batch).prefetch(tf.data.AUTOTUNE)


def floor_resnet(encoded: list[bytes], boxes: np.ndarray, workload: Any, batch: int) -> Any:
    """The least any pipeline feeding fixed-size images must do: the same crop decode, then the cheapest
    resize to the model's size (nearest neighbour, uint8 kept) and batching those pixels."""
    from benchmarks.resnet import data

    prep = data.PREPROCESSING[workload.cfg.data.preprocessing]
    size = workload.cfg.data.image_size

    def decode(index: tf.Tensor, item: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        jpeg, box = item
        begin, crop = data.sample_crop(tf.io.extract_jpeg_shape(jpeg), tf.reshape(box, [1, 1, 4]),
                                       tf.stack([tf.constant(7, tf.int64), index]), prep)
        window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
        image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
        return tf.image.resize(image, [size, size], method="nearest")

    ds = tf.data.Dataset.from_tensor_slices((encoded, boxes)).repeat().enumerate()
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.batch(batch).prefetch(tf.data.AUTOTUNE)


def ssd_windows(encoded: list[bytes], boxes: list[np.ndarray], workload: Any, whole: bool) -> tf.data.Dataset:
    """Endless pixels each training image must be decoded to: the SSD crop window the reference's sampler draws
    from the image's boxes (`decode_window`: only the JPEG blocks around it), or (`whole`) the whole image."""
    from benchmarks.ssd import data

    max_samples = workload.cfg.data.max_samples
    ragged = tf.ragged.constant([b.tolist() for b in boxes], ragged_rank=1, dtype=tf.float32)
    ds = tf.data.Dataset.from_tensor_slices((encoded, ragged)).repeat().enumerate()

    def decode(index: tf.Tensor, item: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        jpeg, box = item
        if whole:
            return tf.io.decode_jpeg(jpeg, channels=3)
        window, _ = data.sample_ssd_crop(box, tf.stack([tf.constant(7, tf.int64), index]), max_samples)
        return data.decode_crop(jpeg, window)

    return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


def bare_ssd(encoded: list[bytes], boxes: list[np.ndarray], workload: Any, batch: int, whole: bool = False) -> Any:
    """The decode alone (`ssd_windows`), AUTOTUNE parallelism, over the encoded images in memory."""
    ds = ssd_windows(encoded, boxes, workload, whole).map(tf.shape)
    return ds.batch(batch).prefetch(tf.data.AUTOTUNE)


def floor_ssd(encoded: list[bytes], boxes: list[np.ndarray], workload: Any, batch: int, whole: bool = False) -> Any:
    """The same decode, then the least a pipeline feeding fixed-size images must do: nearest resize, uint8."""
    size = workload.cfg.model.image_size
    ds = ssd_windows(encoded, boxes, workload, whole).map(
        lambda image: tf.image.resize(image, [size, size], method="nearest"), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False)
    return ds.batch(batch).prefetch(tf.data.AUTOTUNE)


def bare_parse(records: list[bytes], spec: dict[str, Any], batch: int, block: int = 1) -> Any:
    """Parsing alone, over the records in memory, AUTOTUNE parallelism: parse_single_example a record
    (block 1), or tf.io.parse_example over blocks of `block` records (what the BERT and Transformer
    pipelines do)."""
    ds = tf.data.Dataset.from_tensor_slices(records).repeat()
    if block > 1:
        ds = ds.batch(block).map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=False)
        if any(isinstance(f, tf.io.VarLenFeature) for f in spec.values()):
            ds = ds.map(lambda ex: {k: tf.RaggedTensor.from_sparse(v).row_lengths() for k, v in ex.items()})
        return ds.prefetch(tf.data.AUTOTUNE)
    ds = ds.map(lambda r: tf.io.parse_single_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=False)
    if any(isinstance(f, tf.io.VarLenFeature) for f in spec.values()):
        ds = ds.map(lambda ex: {k: tf.size(v.values) for k, v in ex.items()})  # ragged: their lengths batch
    return ds.batch(batch).prefetch(tf.data.AUTOTUNE)


def bare_indexed(prefix: str, itemsize: int, workload: Any, batch: int) -> Any:
    """The rows read and parsed by TensorFlow alone: the .bin as fixed-length records of seq_length tokens
    (decode_raw), each joined to the next record's first token (rows of seq_length + 1, one token shared)."""
    seq = workload.cfg.data.seq_length
    dtype = {2: tf.uint16, 4: tf.int32}[itemsize]
    tail = os.path.getsize(prefix + ".bin") % (seq * itemsize)  # the tokens after the last whole record
    records = tf.data.FixedLengthRecordDataset(prefix + ".bin", seq * itemsize, footer_bytes=tail).map(
        lambda r: tf.cast(tf.io.decode_raw(r, dtype), tf.int32), num_parallel_calls=tf.data.AUTOTUNE)
    rows = tf.data.Dataset.zip((records, records.skip(1))).map(lambda a, b: tf.concat([a, b[:1]], 0))
    return rows.repeat().batch(batch).prefetch(tf.data.AUTOTUNE)


def leading(batch: Any) -> int:
    """Examples in a batch: the leading dimension of its first tensor."""
    return int(tf.nest.flatten(batch)[0].shape[0])


def packed_pairs(batch: Any) -> int:
    """Sentence pairs in a batch of packed rows: each row's segments."""
    return int(tf.reduce_sum(tf.reduce_max(batch["inputs_segmentation"], axis=1)))


def rate(iterator: Any, count: Callable[[Any], int], seconds: float) -> tuple[int, float, float]:
    """Samples (as `count` counts a batch), wall seconds and this process's CPU seconds (every thread's) of
    pulling batches for about `seconds`."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        n += count(next(iterator))
    return n, time.perf_counter() - t0, time.process_time() - c0


def interleaved(sides: dict[str, Any], seconds: float, rounds: int, warmup: float = 1.0, warmup_batches: int = 4,
                counts: dict[str, Callable[[Any], int]] | None = None,
                per_round: list[dict[str, float]] | None = None) -> dict[str, float]:
    """Samples/s of each side (an iterable of batches), rounds alternating between them; `per_round`, if
    given, receives each round's rates (wall clock, and per CPU second of this process) and load average.

    Only the measured side exists: each slice opens a fresh iterator, pulls `warmup_batches` and `warmup`
    s uncounted (thread pools, autotuning, shuffle buffers), counts `seconds`, and closes it, so no idle
    side's threads fill buffers on another side's clock or CPU time. Rounds alternate the order (A B C,
    then C B A), so a load drifting within a round favours no side, and the first two sides are always
    measured back to back (the machine's other load moves between rounds far more than within one).
    """
    counts = counts or {}
    totals = {k: [0, 0.0] for k in sides}
    order = list(sides)
    for r in range(rounds):
        this: dict[str, float] = {}
        for k in (order if r % 2 == 0 else order[::-1]):
            count = counts.get(k, leading)
            it = iter(sides[k])
            for _ in range(warmup_batches):
                next(it)
            rate(it, count, warmup)
            n, t, cpu = rate(it, count, seconds)
            del it
            totals[k][0] += n
            totals[k][1] += t
            this[k] = n / t
            this[k + " per cpu"] = n / max(cpu, 1e-9)
        this["load"] = os.getloadavg()[0]
        if per_round is not None:
            per_round.append(this)
    return {k: n / t for k, (n, t) in totals.items()}


def spread(ratios: list[float]) -> str:
    """The median of per-round ratios, and their range and interquartile range."""
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return (f"median {med:.3f}, interquartile {q1:.3f}-{q3:.3f}, range {min(ratios):.3f}-{max(ratios):.3f} "
            f"({len(ratios)} rounds)")


def eval_pass_rates(workload: Any, runtime: Any, cfg: Any, batch: int) -> tuple[float, float]:
    """Samples/s of the first eval pass (decoding) and the second (cached replay with data.cache_eval)."""
    steps = eval_steps_for(workload.eval_samples, batch)
    it = iter(eval_input(runtime, workload, batch, cfg.seed))  # one iterator: the cache lives across passes
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        for _ in range(steps):
            next(it)
        out.append(steps * batch / (time.perf_counter() - t0))
    return out[0], out[1]


# ------------------------------------------------------------------------------------------ main

ABLATIONS = {  # the technique, and the override that switches it off
    "crop before decode": "data.decode_and_crop=false",
    "SSD crop window decoded alone": "data.decode_crop_window=false",
    "parallel interleaved reads": "data.parallel_reads=1",
    "non-deterministic order": "data.deterministic=true",
    f"autotuned pool (vs private {CORES} threads)": f"data.threads={CORES}",
    "prefetch to device": "data.prefetch_to_device=false",
    "images in the compute dtype (vs float32)": "data.images_in_compute_dtype=false",
    "colour jitter on the device": "data.jitter_on_device=false",
    "records parsed in blocks (vs one at a time)": "data.parse_block=1",
    "normalized in the train step (float32 pixels sent)": "data.normalize_in_step=false",
    "images flipped in the train step (coins sent)": "data.flip_on_device=false",
    "SSD pixels scaled in the train step (0..255 float32 sent)": "data.scale_in_step=false",
    "files read in turn (vs AUTOTUNE parallel reads)": "data.read_threads=0",
}
OPTIONS = {  # off by default (they change the reference's numerics slightly), measured on
    "normalize on device (host sends uint8)": "data.normalize_on_device=true",
}


@dataclasses.dataclass
class Bench:
    """One workload's benchmark: its data (written once), config overrides and comparison sides."""
    described: str
    overrides: list[str]
    bare_name: str
    bare: Callable[[Any], Any]    # workload -> batches of the bare op
    floor: Callable[[Any], Any] | None  # workload -> batches of the floor (images only)
    dtype: Callable[[Any, Any], str]
    count: Callable[[Any], int] = leading  # samples in one pipeline batch


def resnet_bench(tmp: str, images: int, batch: int) -> Bench:
    encoded, boxes = write_imagenet_like(tmp, images)
    kb = np.mean([len(e) for e in encoded]) / 1024
    return Bench(f"{images} JPEGs ~500x375 ({kb:.0f} KB mean)",
                 ["data.source=tfrecord", f"data.data_dir={tmp}", "data.shuffle_buffer=1024",
                  f"data.train_samples={images}", f"data.eval_samples={images}"],
                 "decode_and_crop_jpeg", lambda wl: bare_resnet(encoded, boxes, wl, batch),
                 lambda wl: floor_resnet(encoded, boxes, wl, batch),
                 lambda wl, cfg: (wl.source.train_image_dtype.name
                                  + (" unnormalized" if wl.source.normalizes_in_step else "")
                                  + (" + flip coins" if cfg.data.flip_on_device else "")))


def ssd_bench(tmp: str, images: int, batch: int) -> Bench:
    encoded, annotations, boxes = write_coco_like(tmp, images)
    kb = np.mean([len(e) for e in encoded]) / 1024
    # Open division: a closed real-data run needs the backbone checkpoint, which a benchmark does not read.
    return Bench(f"{images} JPEGs ~640x480 with 1-6 boxes ({kb:.0f} KB mean)",
                 ["data.source=tfrecord", f"data.data_dir={tmp}", f"data.annotation_file={annotations}",
                  "data.shuffle_buffer=1024", f"data.train_samples={images}", f"data.eval_samples={images}",
                  "submission.division=open", "model.backbone_checkpoint=", f"schedule.global_batch_size={batch}",
                  "model.bn_span=0"],
                 "crop-window decode", lambda wl: bare_ssd(encoded, boxes, wl, batch),
                 lambda wl: floor_ssd(encoded, boxes, wl, batch), ssd_dtype)


def ssd_dtype(workload: Any, cfg: Any) -> str:
    scaled = " 0..255" if workload.source.scales_in_step else ""
    return workload.source.train_image_dtype.name + scaled + (" + flip coins" if cfg.data.flip_on_device else "")


def bert_bench(tmp: str, images: int, batch: int) -> Bench:
    from benchmarks.bert.data import feature_spec

    records = write_bert_like(tmp, images)
    kb = np.mean([len(r) for r in records]) / 1024
    spec = feature_spec(512, 76)
    return Bench(f"{images} MLPerf BERT records, 512 tokens, 76 predictions ({kb:.1f} KB mean)",
                 ["data.source=tfrecord", f"data.data_dir={tmp}", "data.shuffle_buffer=1024",
                  f"data.train_samples={images}", f"data.eval_samples={images}", "submission.division=open",
                  "model.init_checkpoint="],
                 "parse", lambda wl: bare_parse(records, spec, batch, wl.cfg.data.parse_block), None,
                 lambda wl, cfg: "int32")


def transformer_bench(tmp: str, images: int, batch: int) -> Bench:
    from benchmarks.transformer import packing
    from benchmarks.transformer.data import TFRecordSource

    records, overrides = write_wmt_like(tmp, images)
    return Bench(f"{images} WMT-like subword pairs (lognormal lengths around 28, filtered at 80), packed into "
                 "rows of 256; samples are pairs (in packed rows on the pipeline side)",
                 overrides + ["data.shuffle_buffer=1024", "submission.division=open", "model.vocab_size=0"],
                 "parse", lambda wl: bare_parse(records, TFRecordSource.SPEC, batch, packing.BLOCK), None,
                 lambda wl, cfg: "int32 packed-row", count=packed_pairs)


def lm_bench(tmp: str, rows: int, batch: int, config: str = "") -> Bench:
    from harness import config as config_lib

    cfg = config_lib.load_config(config or LM_CONFIG, [])
    d, vocab = cfg.data, cfg.model.vocab_size
    prefix, itemsize = write_c4_like(tmp, rows, d.seq_length, vocab, d.eod_id)
    return Bench(f"{rows} rows of {d.seq_length} + 1 tokens of Megatron indexed C4-like documents "
                 f"({itemsize}-byte tokens)",
                 ["data.source=indexed", f"data.data_dir={tmp}", "data.train_prefix=c4-like",
                  "data.eval_prefix=c4-like", f"data.eval_samples={min(16, rows)}", "submission.division=open",
                  "runtime.mesh={data: 1, model: 1}", "runtime.layout={}", "runtime.fsdp=false"],
                 "TF read of the .bin as fixed-length records", lambda wl: bare_indexed(prefix, itemsize, wl, batch),
                 None, lambda wl, cfg: "int32 token-row")


LM_CONFIG = "configs/gpt_oss_20b/reference.yaml"
BENCHES = {"resnet": resnet_bench, "ssd": ssd_bench, "bert": bert_bench, "transformer": transformer_bench,
           "lm": lm_bench}
DEFAULT_CONFIGS = {"lm": LM_CONFIG}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", choices=sorted(BENCHES))
    p.add_argument("config", nargs="?", default=None)
    p.add_argument("--set", action="append", default=[], help="config override key=value")
    p.add_argument("--images", type=int, default=256, help="distinct JPEGs written (the pipeline repeats them)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=2.0, help="per side per round (counted)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--ablate", action="store_true", help="also measure with each data.* technique off")
    a = p.parse_args()

    config = a.config or DEFAULT_CONFIGS.get(a.workload, f"configs/{a.workload}/reference.yaml")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        make = BENCHES[a.workload]
        bench = make(tmp, a.images, a.batch, config) if make is lm_bench else make(tmp, a.images, a.batch)
        # bfloat16: what every GPU and TPU config computes in.
        base = bench.overrides + ["runtime.kind=default", "runtime.precision=bfloat16"] + a.set
        print(f"{a.workload}: {bench.described}, batch {a.batch}, {CORES} cores, "
              f"{a.rounds} rounds x {a.seconds:g} s per side; load average {load[0]:.1f} at start", flush=True)

        rounds: list[dict[str, float]] = []

        def measure(extra: list[str], bare: bool = True) -> tuple[dict[str, float], list[dict[str, float]], Any]:
            """Rates of the pipeline, its floor (if any) and (`bare`) the bare op, and each round's; the floor
            and bare sides run with the pipeline's own tf.data options (threads, determinism, no autotuning)."""
            pipeline, (workload, runtime, cfg) = harness_batches(config, base + extra, a.batch)
            options = train_options(pipeline_config(cfg.data))
            options.autotune.enabled = False  # as train_input's pipeline runs (loop.without_autotune)
            sides = {"pipeline": pipeline}
            if bench.floor is not None:
                sides["floor"] = bench.floor(workload).with_options(options)
            if bare or bench.floor is None:
                sides["bare"] = bench.bare(workload).with_options(options)
            each: list[dict[str, float]] = []
            rates = interleaved(sides, a.seconds, a.rounds, counts={"pipeline": bench.count}, per_round=each)
            return rates, each, (workload, runtime, cfg)

        rates, rounds, (workload, runtime, cfg) = measure([])
        pipe, bare = rates["pipeline"], rates["bare"]
        against = "floor" if "floor" in rates else "bare"
        loads = [r["load"] for r in rounds]

        def cores(side: str) -> str:  # the cores a side kept busy (its CPU seconds per wall second)
            return f"{np.median([r[side] / r[side + ' per cpu'] for r in rounds]):.2f} cores busy"

        def per_cpu(side: str) -> float:
            return float(np.median([r[side + " per cpu"] for r in rounds]))

        print(f"pipeline (records -> device-ready {bench.dtype(workload, cfg)} batches): {pipe:8.1f} samples/s, "
              f"{per_cpu('pipeline'):.1f} per CPU second ({cores('pipeline')})")
        if "floor" in rates:
            print(f"floor: that decode + nearest resize, uint8: {rates['floor']:8.1f} samples/s, "
                  f"{per_cpu('floor'):.1f} per CPU second ({cores('floor')})")
        print(f"bare {bench.bare_name}, same parallelism: {bare:8.1f} samples/s, {per_cpu('bare'):.1f} per CPU "
              f"second ({cores('bare')})")
        print("per round, samples per CPU second of this process (what other processes' load leaves alone; sides "
              "measured back to back):")
        print(f"  pipeline / {against} {spread([r['pipeline per cpu'] / r[against + ' per cpu'] for r in rounds])}")
        if "floor" in rates:
            print(f"  floor / bare {spread([r['floor per cpu'] / r['bare per cpu'] for r in rounds])}")
            print(f"  pipeline / bare {spread([r['pipeline per cpu'] / r['bare per cpu'] for r in rounds])}")
        print(f"per round, wall clock (moves with the machine's load): pipeline / {against} "
              f"{spread([r['pipeline'] / r[against] for r in rounds])}")
        headline = float(np.median([r["pipeline per cpu"] / r[against + " per cpu"] for r in rounds]))
        name = "pipeline / floor" if "floor" in rates else "pipeline / floor (the bare read and parse)"
        print(f"{name}: {headline:.3f} (samples per CPU second, median of {len(rounds)} rounds; wall clock "
              f"{float(np.median([r['pipeline'] / r[against] for r in rounds])):.3f}); load average "
              f"{min(loads):.1f}-{max(loads):.1f} over the rounds, {os.getloadavg()[0]:.1f} at end", flush=True)
        if a.ablate:
            applies = {k: v for k, v in {**ABLATIONS, **OPTIONS}.items()
                       if v.split("=")[0].split(".")[-1] in vars(cfg.data)}
            for name, override in applies.items():
                r, each, _ = measure([override], bare=False)
                how = "on: " if name in OPTIONS else "off:"
                ratio = float(np.median([x["pipeline per cpu"] / x[against + " per cpu"] for x in each]))
                print(f"  {how} {name:<40} ({override}): pipeline / {against} {ratio:.3f} (per CPU second, median "
                      f"of rounds)  ({r['pipeline']:.1f} samples/s)", flush=True)
            first, cached = eval_pass_rates(workload, runtime, cfg, a.batch)
            print(f"  eval set decoded once and cached (data.cache_eval): first pass {first:.1f} samples/s, "
                  f"cached pass {cached:.1f} samples/s ({cached / first:.1f}x)")


if __name__ == "__main__":
    main()
