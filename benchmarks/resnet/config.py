"""ResNet's own config sections."""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.train.input_pipeline import PipelineConfig


@dataclasses.dataclass
class DataConfig(PipelineConfig):
    """ImageNet sources and steps; the input-technique keys (parallel_reads, deterministic, threads,
    cache_eval, prefetch_to_device, service) come from harness.train.input_pipeline.PipelineConfig."""

    source: str = field("synthetic", choices=("synthetic", "tfrecord", "tfds"))
    data_dir: str = field("", doc="tfrecord: folder of train-*/validation-* shards; tfds: TFDS data dir")
    train_pattern: str = field("train-*-of-*")
    eval_pattern: str = field("validation-*-of-*")
    tfds_name: str = field("imagenet2012")
    image_size: int = field(224, min=8)
    num_classes: int = field(1000, min=2)
    label_offset: int = field(1, doc="subtracted from image/class/label (ImageNet TFRecords use 1..1000)")
    train_samples: int = field(1281167, min=1)
    eval_samples: int = field(50000, min=1)
    shuffle_buffer: int = field(10000, min=1)
    preprocessing: str = field(
        "reference", choices=("reference", "google_tpu"),
        doc="tfrecord/tfds image steps. reference: the MLPerf TF reference's (crop area 5%-100%, 100 "
        "attempts, dataset boxes; eval resize shorter side to 256 then central 224; mean subtraction). "
        "google_tpu: Google's accepted v0.7 TPU submission's (area 8%-100%, 10 attempts, whole image; "
        "eval central 224/256 crop then resize; mean/stddev)")
    decode_and_crop: bool = field(True, doc="tfrecord training: decode only the random crop window of each "
                                  "JPEG (decode_and_crop_jpeg); false decodes the whole image, then crops")
    normalize_on_device: bool = field(
        False, doc="tfrecord/tfds training: the host sends the resized crop as uint8 (rounded) and the device "
        "casts and normalizes it: a quarter of the bytes to copy and batch, no float pass on the host; "
        "false = the reference's float pipeline on the host")
    read_threads: int = field(1, min=0, doc="tfrecord training: threads reading the parallel_reads files (1 = "
                              "the files read in turn by the pipeline's own thread: the least CPU per record from "
                              "local disks or the page cache; 0 = AUTOTUNE, which hides remote storage's latency; "
                              "N = N reads at once; through the tf.data service always AUTOTUNE)")
    normalize_in_step: bool = field(
        True, doc="tfrecord/tfds training: the host sends the resized crop's float32 pixels as they are and the "
        "train step normalizes them (the same ops, so the same numbers as the host's normalization): one pass "
        "over the pixels less per image on the host, twice a bfloat16 image's bytes to batch and copy. "
        "normalize_on_device=true (uint8) takes precedence")
    flip_on_device: bool = field(
        True, doc="tfrecord/tfds training: the host resizes the crop unflipped and sends each image's flip coin "
        "(the same draw, one per image); the train step mirrors the images whose coin came up. Exact for "
        "google_tpu preprocessing (which flips after the resize). The reference preprocessing flips the crop "
        "before its v1 resize, whose sampling grid hugs its input's left edge: there a flipped image is the "
        "mirror of the unflipped one, while the reference's samples the crop up to (crop width / image_size - 1) "
        "source pixels further right (a sub-pixel shift of the output)")
    images_in_compute_dtype: bool = field(
        True, doc="tfrecord/tfds: with runtime.precision bfloat16 or float16 the host sends the normalized "
        "images already cast to it; the model's first op casts its input to that dtype anyway, so the "
        "numerics are identical and half the bytes are batched and copied. false = float32 images")
    synthetic_seed: int = field(0, doc="fixes the synthetic dataset itself; the run seed fixes the order")
    synthetic_noise: float = field(1.0, min=0.0, doc="pixel noise stddev of synthetic images")
    synthetic_label_noise: float = field(0.2, min=0.0, max=0.9,
                                         doc="fraction of synthetic images drawn from another class")


@dataclasses.dataclass
class ModelConfig:
    blocks: list[int] = field(default_factory=lambda: [3, 4, 6, 3], doc="bottleneck blocks per stage")
    width: int = field(64, min=1, doc="filters of the first stage (x4 at a stage's output)")
    stem: str = field("imagenet", choices=("imagenet", "small"),
                      doc="imagenet: 7x7/2 conv + max pool; small: 3x3/1 conv for tiny images")
    bn_momentum: float = field(0.9, min=0.0, max=1.0)
    bn_epsilon: float = field(1e-5, min=0.0)
    bn_span: int = field(0, min=0, doc="samples per batch-norm statistic (0 = one replica's batch)")
    zero_init_residual: bool = field(
        False, doc="last batch norm of each block starts at gamma 0 (Google's TPU code, NVIDIA's BNZeroInit); "
        "false = gamma 1, as both TF references")
    label_smoothing: float = field(0.1, min=0.0, max=1.0)
    conv_padding: str = field(
        "ruleset", choices=("ruleset", "same", "fixed"),
        doc="how the stride-2 3x3 convs pad. same: TF 'SAME' (0/1 at even sizes), the TF2 reference's; "
        "fixed: 1/1 whatever the size, the TF1 reference's; ruleset: the reference of the run's `ruleset` "
        "(0.7.0: fixed, 1.0.0 on: same). The 7x7/2 stem pads 3/3 and the max pool 'SAME' in both")


def strided_padding(model: ModelConfig, ruleset: str) -> str:
    """The padding of the stride-2 3x3 convs for a run of `ruleset`: `model.conv_padding`, or with
    `ruleset`, the padding of the MLPerf reference that ruleset names (below)."""
    if model.conv_padding != "ruleset":
        return model.conv_padding
    return "fixed" if ruleset in TF1_RULESETS else "same"


# The MLPerf ResNet references in mlcommons/training, by the rulesets whose rounds name them:
# - 0.7.0: the TF1 reference, image_classification/tensorflow/official/resnet/resnet_model.py (one blob, ea77cb15,
#   from 6cb3d426392b7b13f239899c13a153feb49a1c20 (2019) to the v0.7 round's 373dfedaa34a5c502e2e0d762e2b9fb20074762e):
#   conv2d_fixed_padding pads every strided conv (kernel - 1) // 2 before and the rest after, then a VALID conv
#   (3x3/2: 1/1; 7x7/2: 3/3); the max pool is max_pooling2d(3, 2, 'SAME').
# - 1.0.0-4.0.0: the TF2 reference, image_classification/tensorflow2/resnet_model.py (one blob, 6a04b2cb, from
#   e821074526f6d6619baacf70a216a59318adb32c (May 2021; its README: "the README for v1.0 using the TensorFlow2
#   model") through tag v4.0, 10786e3c3b844c1138d6a702fc6c8ba1d376c7bb): conv_block's strided 3x3 is
#   Conv2D(padding='same'), 0/1 at 56, 28 and 14; the stem is ZeroPadding2D(3) then a valid 7x7/2 (3/3); the
#   max pool is MaxPooling2D(3, 2, padding='same').
# The two differ only in the strided 3x3 convs (the 1x1/2 projections pad nothing in either).
TF1_RULESETS = ("0.7.0",)


@dataclasses.dataclass
class OptimizerConfig:
    name: str = field("lars", choices=("lars", "sgd"))
    base_learning_rate: float = field(10.0, min=0.0)
    end_learning_rate: float = field(0.0001, min=0.0)
    warmup_epochs: float = field(2.0, min=0.0)
    decay_epochs: float = field(0.0, min=0.0, doc="poly decay length after warmup (0 = to the budget)")
    poly_power: float = field(2.0, min=0.0)
    momentum: float = field(0.9, min=0.0, max=1.0)
    weight_decay: float = field(5e-5, min=0.0)
    lars_eta: float = field(0.001, min=0.0)
    lars_epsilon: float = field(0.0, min=0.0)
    exclude_from_decay: list[str] | None = field(
        None, doc="regexes of variable paths without weight decay (and, for LARS, adaptation); "
        "null = the reference's list for the optimizer (lars: batch norm and biases; sgd: batch norm only)")

    def __post_init__(self) -> None:
        if self.exclude_from_decay is None:
            self.exclude_from_decay = list(REFERENCE_EXCLUDE[self.name])


# The references' skip lists, as variable-path regexes. LARS (lars_optimizer.py) skips names containing
# 'batch_normalization', 'bn' or 'bias'; the SGD path adds an L2 loss over every trainable variable whose
# name lacks 'bn', so the FC bias is decayed there.
REFERENCE_EXCLUDE = {"lars": (r"/bn\d*/", r"/bias$"), "sgd": (r"/bn\d*/",)}
