"""ResNet-50 v1.5 as an MLPerf workload: LARS or SGD, label smoothing, configurable BN span."""
from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.nn.optim import LARS, SGDMomentum, poly_warmup_schedule
from harness.train.reference import ReferenceModel
from harness.train.workload import LossTerm, Workload

from benchmarks.resnet import tensor_names, config, data
from benchmarks.resnet.model import ResNet


# ResNet-50 v1.5 on 224 px ImageNet-1k (the MLPerf reference); both TF references start every BN gamma at 1.
REFERENCE_VALUES = {
    "model.blocks": [3, 4, 6, 3], "model.width": 64, "model.stem": "imagenet", "model.zero_init_residual": False,
    "data.image_size": 224, "data.num_classes": 1000}


class ResNetWorkload(Workload):
    NAME = "resnet"
    MLPERF_KEY = "resnet"
    # 1.1.0-2.1.0 need weights_initialization events for the ResNet-50 tensors (tensor_names.py).
    RULESETS = ("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0")
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    METRIC = "top-1"

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.make_source(cfg.data, runtime.compute_dtype)
        self.model: ResNet | None = None
        # Batch-norm statistics pool this many replicas' (micro-)batches: MLPerf's model_bn_span.
        self.bn_group = runtime.batch_norm_group(cfg.model.bn_span, self.replica_batch)
        self.bn_span = self.bn_group * self.replica_batch

    def reference_model(self) -> ReferenceModel:
        """ResNet-50 v1.5 with the strided-conv padding of the run's ruleset's reference (config.TF1_RULESETS)."""
        padding = config.strided_padding(config.ModelConfig(), self.cfg.ruleset)
        return ReferenceModel("ResNet-50 v1.5", {**REFERENCE_VALUES, "model.conv_padding": padding})

    def model_settings(self) -> dict[str, Any]:
        settings = super().model_settings()
        settings["model.conv_padding"] = self.padding
        return settings

    @property
    def padding(self) -> str:
        return config.strided_padding(self.cfg.model, self.cfg.ruleset)

    def validate(self) -> None:
        self.validate_config()
        self.source.validate()

    def validate_closed(self) -> None:
        """Training rules for closed ResNet (the record's cadence): an eval every 4 epochs, the first after 1,
        2, 3 or 4 epochs (offset 1-3, or 0 for 4), and a budget that ends on that cadence (as the reference
        rounds it)."""
        s = self.cfg.schedule
        rule = rules.cadence(self.MLPERF_KEY, self.cfg.ruleset, s.global_batch_size)
        every, offsets = rule.every, tuple(int(c) % int(rule.every) for c in rule.first_choices)
        shown = ", ".join(str(o) for o in sorted(offsets))
        fix = "; or set submission.division=open"
        if s.eval_epochs:
            raise HarnessError(f"closed ResNet evaluates every {every:g} epochs: use schedule.eval_every_epochs="
                               f"{every:g} and eval_offset_epochs {min(offsets)}-{max(offsets)}, not "
                               f"schedule.eval_epochs{fix}")
        if s.eval_every_epochs != every or s.eval_offset_epochs not in offsets:
            raise HarnessError(f"closed ResNet evaluates every {every:g} epochs from epoch {min(rule.first_choices):g}-"
                               f"{max(rule.first_choices):g}: schedule.eval_every_epochs={s.eval_every_epochs:g} and "
                               f"eval_offset_epochs={s.eval_offset_epochs:g} must be {every:g} and one of {shown}{fix}")
        first = s.eval_offset_epochs or every
        if s.max_epochs < first or (s.max_epochs - first) % every:
            below = first + every * math.floor(max(s.max_epochs - first, 0) / every)
            raise HarnessError(f"closed ResNet: schedule.max_epochs={s.max_epochs:g} is off the eval cadence "
                               f"(evals at {first:g}, {first + every:g}, ...); use {below:g} or {below + every:g}{fix}")

    # ----------------------------------------------------------------------------- schedule
    def steps_per_epoch(self) -> float:
        return self.train_samples / self.cfg.schedule.global_batch_size

    def warmup_steps(self) -> int:
        return int(round(self.cfg.optimizer.warmup_epochs * self.steps_per_epoch()))

    def decay_steps(self) -> int:
        o, s = self.cfg.optimizer, self.cfg.schedule
        epochs = o.decay_epochs or max(s.max_epochs - o.warmup_epochs, 0.0)
        return max(1, int(math.ceil(epochs * self.steps_per_epoch())))

    def build(self) -> None:
        c = self.cfg
        self.model = ResNet(self.runtime, c.seed, c.model, c.data.num_classes, self.bn_group, self.padding)
        o = c.optimizer
        schedule = poly_warmup_schedule(o.base_learning_rate, self.warmup_steps(), self.decay_steps(),
                                        o.end_learning_rate, o.poly_power)
        params = self.runtime.variables(trainable=True)
        common = dict(weight_decay=o.weight_decay, exclude_from_decay=o.exclude_from_decay,
                      momentum=o.momentum)
        if o.name == "lars":
            self.optimizer = LARS(self.runtime, params, schedule, eta=o.lars_eta, epsilon=o.lars_epsilon,
                                  **common)
        else:
            self.optimizer = SGDMomentum(self.runtime, params, schedule, **common)
        self.optimizer.build()

    # ----------------------------------------------------------------------------------- inputs
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
        self.validate_config()
        size = self.cfg.data.image_size
        dtype = getattr(self.source, "image_dtype", tf.float32)  # what the real run's host would send
        example = {"image": tf.TensorSpec([size, size, 3], dtype), "label": tf.TensorSpec([], tf.int32)}
        train = dict(example, image=tf.TensorSpec([size, size, 3], getattr(self.source, "train_image_dtype", dtype)))
        if hasattr(self.source, "train_image_dtype") and self.cfg.data.flip_on_device:
            train["flip"] = tf.TensorSpec([], tf.bool)
        return train, example, []

    # ------------------------------------------------------------------------------ computation
    def cross_entropy(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Per-example softmax cross-entropy with label smoothing."""
        onehot = tf.one_hot(labels, self.cfg.data.num_classes)
        return tf.nn.softmax_cross_entropy_with_logits(
            onehot * (1 - self.cfg.model.label_smoothing) + self.cfg.model.label_smoothing
            / self.cfg.data.num_classes, logits)

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        logits = self.model(data.train_image(batch, self.source), training=True)
        per_example = self.cross_entropy(logits, batch["label"])
        return {"cross_entropy": LossTerm(tf.reduce_sum(per_example), tf.shape(per_example)[0])}

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = self.model(data.device_image(batch["image"], getattr(self.source, "prep", None)), training=False)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), batch["label"]), tf.float32)
        return {"correct": tf.reduce_sum(correct * mask), "examples": tf.reduce_sum(mask)}

    def eval_finalize(self, state: dict[str, float]) -> dict[str, float]:
        return {self.METRIC: state["correct"] / max(state["examples"], 1.0)}

    # ---------------------------------------------------------------------------------- logging
    def mllog_hparams(self) -> dict[str, Any]:
        o = self.cfg.optimizer
        keys: dict[str, Any] = {"opt_name": o.name, "model_bn_span": self.bn_span}
        if o.name == "lars":
            keys.update({
                "lars_opt_base_learning_rate": o.base_learning_rate,
                "lars_opt_end_learning_rate": o.end_learning_rate,
                "lars_opt_learning_rate_decay_poly_power": o.poly_power,
                "lars_opt_learning_rate_decay_steps": self.decay_steps(),
                "lars_epsilon": o.lars_epsilon,
                "lars_opt_learning_rate_warmup_epochs": o.warmup_epochs,
                "lars_opt_momentum": o.momentum,
                "lars_opt_weight_decay": o.weight_decay,
            })
        else:
            keys.update({
                "sgd_opt_base_learning_rate": o.base_learning_rate,
                "sgd_opt_end_learning_rate": o.end_learning_rate,
                "sgd_opt_learning_rate_decay_poly_power": o.poly_power,
                "sgd_opt_learning_rate_decay_steps": self.decay_steps(),
                "sgd_opt_weight_decay": o.weight_decay,
                "sgd_opt_momentum": o.momentum,
                "opt_learning_rate_warmup_epochs": o.warmup_epochs,
            })
        return keys

    def weights_initialization_map(self) -> dict[str, str]:
        return tensor_names.weights_initialization_map(self.cfg)
