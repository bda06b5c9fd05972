"""SSD-ResNet34 on COCO as an MLPerf workload (the `ssd` key of rulesets 0.7.0-1.1.0).

Training matches each image's padded box list to the anchors on device, and the loss is the reference's:
smooth-L1 on positives plus cross entropy on positives and 3:1 hard negatives, divided by each image's
positives and averaged over images. The eval runs the detector, decode and per-class NMS on every replica;
the chief converts the gathered detections to COCO rows and scores them with pycocotools COCOeval.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError
from harness import benchmark_rules as rules
from harness.train.workload import INDEX
from harness.nn.optim import TF1Momentum, warmup_step_decay_schedule
from harness.train.reference import ReferenceModel
from harness.train.workload import LossTerm, Workload, epoch_schedule

from benchmarks.ssd import anchors, boxes, coco_metric, config, data, postprocess, tensor_names
from benchmarks.ssd.model import SSD, check_layout, load_backbone

BOUNDARY_BASE = (40, 50)
# SSD300 on the modified ResNet-34 with 81 classes: the config's defaults (config.py, anchors.SSD300).
_DEFAULTS = config.ModelConfig()
REFERENCE_MODEL = ReferenceModel("SSD300 on ResNet-34", {
    f"model.{k}": getattr(_DEFAULTS, k) for k in ("image_size", "width", "blocks", "extra_channels", "feature_sizes",
                                                  "steps", "scales", "aspect_ratios", "num_classes")})


def check_spatial_partition(model: config.ModelConfig, dims: list[int]) -> None:
    """The image rows split evenly over a replica's cores: TPUStrategy's split needs divisible dims, and this
    harness does not pad the input rows (Google's v0.7 8-way split padded 150 rows to 152). Config-only, so it
    is checked on any machine; XLA pads the smaller feature maps itself. Off-TPU the runtime refuses the split."""
    ways = dims[1] if len(dims) == 4 else 1
    if ways > 1 and model.image_size % ways:
        fits = ", ".join(str(k) for k in (2, 4, 8, 16) if not model.image_size % k) or "none"
        raise HarnessError(f"runtime.spatial_partition splits the {model.image_size} image rows {ways} ways, which "
                           f"does not divide them; this harness does not pad input rows, so use ways that divide "
                           f"{model.image_size} (e.g. {fits})")


class SSDWorkload(Workload):
    NAME = "ssd"
    MLPERF_KEY = "ssd"
    # From 2.0.0 on the `ssd` key means RetinaNet on OpenImages (target 0.34): a different benchmark.
    RULESETS = ("0.7.0", "1.0.0", "1.1.0")
    RULESET_NOTE = "from 2.0.0 on, MLPerf's 'ssd' is RetinaNet on OpenImages, which this workload is not"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    METRIC = "mAP"

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.make_source(cfg.data, cfg.model, runtime.compute_dtype)
        self.model: SSD | None = None
        self.bn_group = runtime.batch_norm_group(cfg.model.bn_span, self.replica_batch)
        self.bn_span = self.bn_group * self.replica_batch
        m = cfg.model
        self.anchors_xywh = anchors.default_boxes(m.image_size, m.feature_sizes, m.steps, m.scales,
                                                  m.aspect_ratios)
        self._ground_truth = None

    def reference_model(self) -> ReferenceModel:
        return REFERENCE_MODEL

    # ---------------------------------------------------------------------------------- schedule
    @property
    def steps_per_epoch(self) -> float:
        return self.train_samples / self.cfg.schedule.global_batch_size

    @property
    def learning_rate(self) -> float:
        """The reference scales the rate linearly with the batch: base * gbs / 32."""
        return self.cfg.optimizer.base_learning_rate * self.cfg.schedule.global_batch_size / 32

    @property
    def warmup_steps(self) -> int:
        return int(self.cfg.optimizer.warmup_epochs * self.steps_per_epoch)

    @property
    def boundary_steps(self) -> list[int]:
        return [int(math.ceil(e * self.steps_per_epoch - 1e-9)) for e in self.cfg.optimizer.decay_boundary_epochs]

    def eval_schedule(self):
        s = self.cfg.schedule
        if self.cfg.submission.division == "closed":
            return epoch_schedule(self.rules_epochs(), self.train_samples, s.global_batch_size, None)
        return super().eval_schedule()

    def rules_epochs(self) -> list[float]:
        """The epochs closed SSD evaluates at under the configured ruleset, up to the budget (the record's
        cadence: 0.7.0/1.0.0 at 40, 50, 55, ...; 1.1.0 every 5)."""
        s = self.cfg.schedule
        return rules.cadence(self.MLPERF_KEY, self.cfg.ruleset, s.global_batch_size).positions(s.max_epochs)

    # -------------------------------------------------------------------------------- validation
    def validate(self) -> None:
        m = self.cfg.model
        self.validate_config()
        self.source.validate()
        categories = self.source.category_map.num_classes
        if m.num_classes != categories + 1:
            raise HarnessError(f"model.num_classes={m.num_classes} but the data has {categories} categories "
                               f"(+1 background = {categories + 1})")

    def validate_model(self) -> None:
        check_layout(self.cfg.model)
        check_spatial_partition(self.cfg.model, self.cfg.runtime.spatial_partition)

    def validate_closed(self) -> None:
        """Closed SSD: the rules' eval epochs, decay boundaries [40, 50] * (1 + k/10), a logged warmup."""
        s, o = self.cfg.schedule, self.cfg.optimizer
        fix = "; or set submission.division=open"
        rule = rules.cadence(self.MLPERF_KEY, self.cfg.ruleset, s.global_batch_size)
        if s.eval_epochs:
            raise HarnessError(f"closed SSD evaluates at the rules' epochs (ruleset {self.cfg.ruleset}: "
                               f"{rule.text()}): drop schedule.eval_epochs{fix}")
        epochs = self.rules_epochs()
        if not epochs or abs(epochs[-1] - s.max_epochs) > 1e-9:
            near = epochs[-1] if epochs else rule.first
            raise HarnessError(f"closed SSD (ruleset {self.cfg.ruleset}): schedule.max_epochs={s.max_epochs:g} is "
                               f"not one of the rules' eval epochs; use {near:g}{fix}")
        b = o.decay_boundary_epochs
        k = b[0] / BOUNDARY_BASE[0] * 10 - 10 if len(b) == 2 else -1
        if (len(b) != 2 or k < -1e-9 or abs(k - round(k)) > 1e-6
                or abs(b[1] - BOUNDARY_BASE[1] * (1 + round(k) / 10)) > 1e-6):
            raise HarnessError(f"closed SSD: optimizer.decay_boundary_epochs={b} must be [40, 50] * (1 + k/10) for "
                               f"an integer k >= 0 (e.g. [40, 50], [44, 55]){fix}")
        if self.warmup_steps < 1:
            raise HarnessError(f"closed SSD logs at least one warmup step: optimizer.warmup_epochs="
                               f"{o.warmup_epochs:g} gives {self.warmup_steps} steps at this batch{fix}")
        m = self.cfg.model
        if m.neg_ratio != 3:
            raise HarnessError(f"closed SSD mines 3 hard negatives per positive: model.neg_ratio={m.neg_ratio}{fix}")
        # A real-data closed run is a result: the reference model (checked by the harness against
        # reference_model() before validate) starting from an ImageNet-trained backbone.
        if not self.is_synthetic:
            if not m.backbone_checkpoint:
                raise HarnessError("closed SSD starts from an ImageNet-trained ResNet-34: set "
                                   f"model.backbone_checkpoint{fix}")

    # ---------------------------------------------------------------------------- model and inputs
    def build(self) -> None:
        c, o = self.cfg, self.cfg.optimizer
        self.model = SSD(self.runtime, c.seed, c.model, self.bn_group)
        if c.model.backbone_checkpoint:
            load_backbone(self.runtime, c.model)
        schedule = warmup_step_decay_schedule(self.learning_rate, self.warmup_steps, o.warmup_factor,
                                              self.boundary_steps)
        self.optimizer = TF1Momentum(self.runtime, self.runtime.variables(trainable=True), schedule,
                                     weight_decay=o.weight_decay, momentum=o.momentum)
        self.optimizer.build()

    def train_dataset(self, ctx) -> tf.data.Dataset:
        return self.source.train(ctx)

    def train_epoch_dataset(self, ctx) -> tf.data.Dataset:
        if not isinstance(self.source, (data.TFRecordSource, data.SyntheticSource)):
            return super().train_epoch_dataset(ctx)
        return self.source.train(ctx, repeat=False)

    def eval_records(self, ctx) -> tf.data.Dataset:
        return self.source.eval_records()

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return self.source.eval_parse(record)

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        c, m = self.cfg, self.cfg.model
        self.validate_config()
        notes = [f"model.num_classes={m.num_classes} not checked against the data's categories"]
        if m.backbone_checkpoint:
            notes.append(f"model.backbone_checkpoint {m.backbone_checkpoint} not read: weights from the initializers")
            m.backbone_checkpoint = ""  # the dry run's own config: build() then reads no file
        size, boxes = m.image_size, c.data.max_boxes
        image = tf.TensorSpec([size, size, 3], self.source.image_dtype)
        train = {"image": tf.TensorSpec([size, size, 3], self.source.train_image_dtype),
                 "boxes": tf.TensorSpec([boxes, 4], tf.float32), "labels": tf.TensorSpec([boxes], tf.int32)}
        if c.data.augment and (c.data.jitter_on_device or c.data.normalize_on_device):
            train["jitter"] = tf.TensorSpec([4], tf.float32)
        if c.data.flip_on_device:
            train["flip"] = tf.TensorSpec([], tf.bool)
        return train, {"image": image}, notes

    # ---------------------------------------------------------------------------------- training
    def targets(self, gt_boxes: tf.Tensor, gt_labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Encoded offsets [B, N, 4] and labels [B, N] of every anchor, from the padded box lists."""
        anchors_xywh = tf.constant(self.anchors_xywh)
        matched, labels = boxes.match(gt_boxes, gt_labels, gt_labels > 0, boxes.xywh_to_ltrb(anchors_xywh))
        return boxes.encode(matched, anchors_xywh), labels

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        images = self.runtime.split_spatially(data.device_image(batch, self.source.scales_in_step))
        loc, logits = self.model(images, training=True)
        gt_loc, gt_labels = self.targets(batch["boxes"], batch["labels"])
        per_image, num_pos = boxes.ssd_loss(loc, logits, gt_loc, gt_labels, self.cfg.model.neg_ratio)
        # The reference: each image's loss over its positives, averaged over images (none has zero boxes).
        return {"ssd": LossTerm(tf.reduce_sum(tf.math.divide_no_nan(per_image, num_pos)),
                                tf.shape(per_image)[0])}

    # -------------------------------------------------------------------------------------- eval
    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        # The eval forward splits like the train forward (identity unless runtime.spatial_partition).
        loc, logits = self.model(self.runtime.split_spatially(batch["image"]), training=False)
        return postprocess.postprocess(loc, logits, tf.constant(self.anchors_xywh))

    def eval_accumulate(self, state: dict[str, Any], outputs: dict[str, np.ndarray]) -> None:
        """COCO detection rows of this batch's real images (pixel xywh of the original image, raw ids)."""
        index = np.asarray(outputs[INDEX], np.int64)
        rows = postprocess.to_coco_detections(
            self.source.eval_image_ids[index], self.source.eval_image_sizes[index], outputs["boxes"],
            outputs["scores"], outputs["classes"], outputs["num_detections"],
            self.source.category_map.category_ids)
        state.setdefault("detections", []).append(rows)
        state["images"] = state.get("images", 0) + len(index)

    def eval_finalize(self, state: dict[str, Any]) -> dict[str, float]:
        detections = np.concatenate(state.get("detections") or [np.zeros((0, 7))], axis=0)
        if self._ground_truth is None:
            self._ground_truth = self.source.ground_truth()
        return {self.METRIC: coco_metric.evaluate(self._ground_truth, detections)}

    # ----------------------------------------------------------------------------------- logging
    def mllog_hparams(self) -> dict[str, Any]:
        o = self.cfg.optimizer
        return {
            "model_bn_span": self.bn_span,
            "opt_base_learning_rate": self.learning_rate,
            "opt_weight_decay": o.weight_decay,
            "opt_learning_rate_warmup_steps": self.warmup_steps,
            "opt_learning_rate_warmup_factor": o.warmup_factor,
            "opt_learning_rate_decay_boundary_epochs": [int(e) if float(e).is_integer() else e
                                                        for e in o.decay_boundary_epochs],
            "max_samples": self.cfg.data.max_samples,
        }

    def weights_initialization_map(self) -> dict[str, str]:
        return tensor_names.weights_initialization_map(self.cfg.model)
