"""ResNet v1.5: the stride-2 of a downsampling bottleneck sits in its 3x3 conv (not the first 1x1).

How that strided 3x3 conv pads is the one place the MLPerf TF1 and TF2 references differ (`padding`, chosen
by `config.strided_padding`); the 7x7/2 stem pads 3/3 and the max pool 'SAME' in both.
"""
from __future__ import annotations

import tensorflow as tf

from harness.nn.layers import BatchNorm, Block, Conv2D, Dense, normal
from harness.runtime.base import Runtime

from benchmarks.resnet.config import ModelConfig


def max_pool(x: tf.Tensor) -> tf.Tensor:
    """The imagenet stem's 3x3/2 max pool, TF 'SAME' as in both references: 0 before and 1 after at 112 (even),
    1/1 at odd sizes; the padding never wins the max."""
    return tf.nn.max_pool2d(x, 3, 2, "SAME")


class ConvBN(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, in_ch: int, out_ch: int,
                 size: int, stride: int, bn_group: int, gamma: float = 1.0, padding: str = "fixed") -> None:
        super().__init__(runtime, path, seed)
        self.conv = Conv2D(runtime, f"{path}/conv", seed, in_ch, out_ch, size, stride, padding)
        self.bn = BatchNorm(runtime, f"{path}/bn", seed, out_ch, cfg.bn_momentum, cfg.bn_epsilon, gamma,
                            bn_group)

    def __call__(self, x: tf.Tensor, training: bool, relu: bool = True) -> tf.Tensor:
        y = self.bn(self.conv(x), training)
        return tf.nn.relu(y) if relu else y


class Bottleneck(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, in_ch: int, filters: int,
                 stride: int, bn_group: int, padding: str) -> None:
        super().__init__(runtime, path, seed)
        out_ch = 4 * filters
        last_gamma = 0.0 if cfg.zero_init_residual else 1.0
        self.a = ConvBN(runtime, f"{path}/a", seed, cfg, in_ch, filters, 1, 1, bn_group)
        self.b = ConvBN(runtime, f"{path}/b", seed, cfg, filters, filters, 3, stride, bn_group, padding=padding)
        self.c = ConvBN(runtime, f"{path}/c", seed, cfg, filters, out_ch, 1, 1, bn_group, last_gamma)
        self.proj = (ConvBN(runtime, f"{path}/proj", seed, cfg, in_ch, out_ch, 1, stride, bn_group)
                     if stride != 1 or in_ch != out_ch else None)

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        shortcut = self.proj(x, training, relu=False) if self.proj else x
        y = self.c(self.b(self.a(x, training), training), training, relu=False)
        return tf.nn.relu(y + shortcut)


class ResNet(Block):
    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, num_classes: int, bn_group: int,
                 padding: str = "same") -> None:
        """padding: the stride-2 3x3 convs' ("same": the TF2 reference, rulesets 1.0.0 on; "fixed": TF1)."""
        super().__init__(runtime, "resnet", seed)
        self.cfg = cfg
        self.padding = padding
        if cfg.stem == "imagenet":
            # Both references pad the 7x7/2 stem 3/3 (TF2: ZeroPadding2D(3) then a valid conv): "fixed".
            self.stem = ConvBN(runtime, "resnet/stem", seed, cfg, 3, cfg.width, 7, 2, bn_group, padding="fixed")
        else:
            self.stem = ConvBN(runtime, "resnet/stem", seed, cfg, 3, cfg.width, 3, 1, bn_group)
        self.blocks = []
        in_ch = cfg.width
        for stage, count in enumerate(cfg.blocks):
            filters = cfg.width * 2 ** stage
            for i in range(count):
                stride = 2 if (i == 0 and stage > 0) else 1
                self.blocks.append(Bottleneck(runtime, f"resnet/stage{stage + 1}/block{i + 1}", seed, cfg,
                                              in_ch, filters, stride, bn_group, padding))
                in_ch = 4 * filters
        self.fc = Dense(runtime, "resnet/fc", seed, in_ch, num_classes,
                        init=normal(0.01, "resnet/fc/kernel", seed))

    def __call__(self, images: tf.Tensor, training: bool) -> tf.Tensor:
        x = self.stem(images, training)
        if self.cfg.stem == "imagenet":
            x = max_pool(x)
        for block in self.blocks:
            x = block(x, training)
        x = tf.reduce_mean(x, axis=[1, 2])
        return tf.cast(self.fc(x), tf.float32)
