"""ResNet-50 v1.5 as an MLPerf workload: LARS or SGD, label smoothing, configurable BN span."""
from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from harness.errors import HarnessError
from harness.optim import LARS, SGDMomentum, poly_warmup_schedule
from harness.workload import Workload

from benchmarks.resnet import tensor_names, config, data
from benchmarks.resnet.model import ResNet


class ResNetWorkload(Workload):
    NAME = "resnet"
    MLPERF_KEY = "resnet"
    # 1.1.0-2.1.0 need weights_initialization events for the ResNet-50 tensors (tensor_names.py).
    RULESETS = ("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0")
    DataConfig = config.DataConfig
    ModelConfig = config.ModelConfig
    OptimizerConfig = config.OptimizerConfig
    EVAL_UNIT = "epoch"
    METRIC_NAME = "top-1"

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.make_source(cfg.data)
        self.model: ResNet | None = None
        self.optimizer = None
        gbs = cfg.schedule.global_batch_size
        self.per_replica_batch = max(1, gbs // runtime.num_replicas)
        span = cfg.model.bn_span or self.per_replica_batch
        if runtime.kind == "mesh":
            # On a DTensor mesh the batch axis is sharded, so batch statistics cover the global batch.
            if cfg.model.bn_span not in (0, gbs):
                raise HarnessError(f"model.bn_span={cfg.model.bn_span}: on a mesh runtime batch norm spans "
                                   f"the global batch ({gbs}); set bn_span to 0 or {gbs}")
            span = self.per_replica_batch * runtime.num_replicas
        if span % self.per_replica_batch:
            raise HarnessError(f"model.bn_span={span} must be a multiple of the per-replica batch "
                               f"{self.per_replica_batch}")
        self.bn_span = span
        self.bn_group = span // self.per_replica_batch
        if self.bn_group > runtime.num_replicas:
            raise HarnessError(f"model.bn_span={span} exceeds the global batch {gbs}")
        if runtime.kind != "mesh" and self.bn_group not in (1, runtime.num_replicas):
            raise HarnessError(f"model.bn_span={span} spans {self.bn_group} of {runtime.num_replicas} replicas; "
                               f"the {runtime.kind} runtime supports one replica's batch "
                               f"({self.per_replica_batch}) or the global batch ({gbs})")

    def closed_target(self, ruleset: str) -> float:
        return 0.759

    def validate(self) -> None:
        self.source.validate()

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
        self.model = ResNet(self.runtime, c.seed, c.model, c.data.num_classes, self.bn_group)
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

    def eval_records(self, ctx) -> tf.data.Dataset:
        return self.source.eval_records()

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return self.source.eval_parse(record)

    # ------------------------------------------------------------------------------ computation
    def loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Per-example softmax cross-entropy with label smoothing."""
        onehot = tf.one_hot(labels, self.cfg.data.num_classes)
        return tf.nn.softmax_cross_entropy_with_logits(
            onehot * (1 - self.cfg.model.label_smoothing) + self.cfg.model.label_smoothing
            / self.cfg.data.num_classes, logits)

    def train_step(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        params = [p.variable for p in self.optimizer.params]
        with tf.GradientTape() as tape:
            logits = self.model(batch["image"], training=True)
            per_example = self.loss(logits, batch["label"])
            loss = tf.reduce_sum(per_example) / self.cfg.schedule.global_batch_size
        grads = self.runtime.all_reduce_gradients(tape.gradient(loss, params))
        self.optimizer.apply(grads)
        return {"loss": tf.reduce_mean(per_example)}

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = self.model(batch["image"], training=False)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), batch["label"]), tf.float32)
        return {"correct": tf.reduce_sum(correct * mask), "count": tf.reduce_sum(mask)}

    def eval_score(self, totals: dict[str, float]) -> float:
        return totals["correct"] / max(totals["count"], 1.0)

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
