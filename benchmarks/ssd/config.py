"""SSD's own config sections (defaults: the MLPerf reference, SSD300 on the modified ResNet-34, COCO 2017)."""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.train.input_pipeline import PipelineConfig

from benchmarks.ssd.anchors import SSD300


@dataclasses.dataclass
class DataConfig(PipelineConfig):
    """COCO sources and augmentation; the input-technique keys (parallel_reads, deterministic, threads,
    cache_eval, prefetch_to_device, service) come from harness.train.input_pipeline.PipelineConfig."""

    source: str = field("synthetic", choices=("synthetic", "tfrecord", "tfds"))
    data_dir: str = field("", doc="tfrecord: folder of COCO shards, tensorflow/tpu's train-*/val-* or the TF "
                          "Object Detection API's coco_train.record-*/coco_val.record-*; tfds: the TFDS data_dir "
                          "holding coco/2017")
    train_pattern: str = field("train-*", doc="tfrecord: glob of training shards under data_dir (the default also "
                               "finds coco_train.record-*)")
    eval_pattern: str = field("val-*", doc="tfrecord: glob of eval shards under data_dir (the default also finds "
                              "coco_val.record-*)")
    annotation_file: str = field("", doc="tfrecord: instances_val2017.json, the ground truth COCOeval scores "
                                 "against (its image ids must be those of the eval records)")
    tfds_name: str = field("coco/2017")
    tfds_train_split: str = field("train")
    tfds_eval_split: str = field("validation")
    train_samples: int = field(117266, min=1, doc="training images with at least one box (images without "
                               "boxes are dropped from training, as the reference does)")
    eval_samples: int = field(5000, min=1, doc="eval images, all of them, boxes or not")
    max_boxes: int = field(100, min=1, doc="boxes kept per image (padded and masked to this static size)")
    max_samples: int = field(1, choices=(1, 50), doc="SSD random-crop tries per pick (MLPerf max_samples)")
    augment: bool = field(True, doc="training augmentation (SSD random crop, flip, colour jitter); false "
                          "keeps the horizontal flip only")
    decode_crop_window: bool = field(True, doc="with augment: the SSD crop window (drawn from the boxes alone) is "
                                     "drawn before decoding and only the JPEG blocks around it are decoded, the same "
                                     "pixels as decoding the whole image (false: decode the whole image, then crop)")
    jitter_on_device: bool = field(True, doc="with augment: the host draws each image's colour jitter factors "
                                   "and sends the resized [0, 1] image; the train step applies the jitter and "
                                   "normalization to the batch (the same formulas and draws; the host's costliest "
                                   "float work moves to the accelerator)")
    read_threads: int = field(1, min=0, doc="tfrecord training: threads reading the parallel_reads files (1 = "
                              "the files read in turn by the pipeline's own thread: the least CPU per record from "
                              "local disks or the page cache; 0 = AUTOTUNE, which hides remote storage's latency; "
                              "N = N reads at once; through the tf.data service always AUTOTUNE)")
    flip_on_device: bool = field(True, doc="training: the host draws the horizontal flip (one coin per image, the "
                                 "same draw) and flips the boxes; the train step mirrors the images whose coin came "
                                 "up, after the resize (the reference flips before it: with the half-pixel bilinear "
                                 "resize the two are the same image to float rounding, a test compares)")
    scale_in_step: bool = field(True, doc="with augment and jitter_on_device: the host sends the bilinear resize's "
                                "0..255 float32 pixels as they are and the train step scales them to [0, 1] before "
                                "its jitter (the host's float32 division; no division and cast pass on the host, "
                                "and no rounding to the compute dtype before the jitter, which the reference has "
                                "not either); twice a bfloat16 image's bytes to batch and copy")
    normalize_on_device: bool = field(
        False, doc="training: the host sends the resized image rounded to uint8 (at most half a grey level from the "
        "reference's float pixels, hence off by default) and the train step scales, jitters (with augment, whatever "
        "jitter_on_device says) and normalizes it: a quarter of float32's bytes, no float pass on the host")
    images_in_compute_dtype: bool = field(
        True, doc="with runtime.precision bfloat16 or float16 the host sends images already cast to it (half the "
        "bytes batched and copied to the device): normalized images are what the model's first conv casts to "
        "anyway (identical numerics); with jitter_on_device the resized [0, 1] pixels are rounded to it (bfloat16: "
        "steps of 1/256 near 1, the JPEG's own 8-bit levels) and jittered in float32. false = float32 images")
    shuffle_buffer: int = field(10000, min=1)
    synthetic_seed: int = field(0, doc="fixes the synthetic shapes; the run seed fixes the order")
    synthetic_classes: int = field(3, min=1, max=4, doc="synthetic: shape classes (category ids 1, 5, 9, 13)")
    synthetic_max_objects: int = field(3, min=1, doc="synthetic: objects per image at most")


@dataclasses.dataclass
class ModelConfig:
    image_size: int = field(SSD300["image_size"], min=8, doc="square input side in pixels")
    width: int = field(64, min=1, doc="channels of ResNet-34's conv1 and conv2_x (x2 in conv3_x, x4 in conv4_x)")
    blocks: list[int] = field(default_factory=lambda: [3, 4, 6],
                              doc="basic blocks of conv2_x, conv3_x and conv4_x (ResNet-34: 3, 4, 6)")
    extra_channels: list[list[int]] = field(
        default_factory=lambda: [[256, 512], [256, 512], [128, 256], [128, 256], [128, 256]],
        doc="[1x1, 3x3] channels of each extra layer after conv4_x (one per feature map after the first)")
    feature_sizes: list[int] = field(default_factory=lambda: list(SSD300["feature_sizes"]))
    steps: list[float] = field(default_factory=lambda: list(SSD300["steps"]))
    scales: list[float] = field(default_factory=lambda: list(SSD300["scales"]))
    aspect_ratios: list[list[float]] = field(default_factory=lambda: [list(r) for r in SSD300["aspect_ratios"]])
    num_classes: int = field(81, min=2, doc="classes including background 0 (COCO: 80 + 1)")
    bn_momentum: float = field(0.9, min=0.0, max=1.0)
    bn_epsilon: float = field(1e-5, min=0.0)
    bn_span: int = field(0, min=0, doc="images per batch-norm statistic, MLPerf model_bn_span (0 = one "
                         "replica's batch; a multiple of it pools that many replicas)")
    neg_ratio: int = field(3, min=1, doc="hard negatives per positive anchor")
    backbone_checkpoint: str = field("", doc="a TF checkpoint holding the ResNet-34 backbone (required for "
                                     "real data in the closed division; '' trains from scratch)")
    backbone_checkpoint_names: dict[str, str] = field(
        default_factory=dict, doc="regex -> replacement applied to a backbone variable path to get its name "
        "in the checkpoint (empty: the same path)")


@dataclasses.dataclass
class OptimizerConfig:
    base_learning_rate: float = field(2.5e-3, min=0.0, doc="lr at a batch of 32; the run uses base * gbs / 32, "
                                      "logged as opt_base_learning_rate")
    momentum: float = field(0.9, min=0.0, max=1.0)
    weight_decay: float = field(5e-4, min=0.0)
    warmup_epochs: float = field(1.0, min=0.0, doc="linear warmup length (at least one step is logged)")
    warmup_factor: int = field(0, min=0, doc="warmup starts at base - base / 2**factor (0: from zero)")
    decay_boundary_epochs: list[float] = field(default_factory=lambda: [40.0, 50.0],
                                               doc="lr x0.1 at the start of each of these epochs")
