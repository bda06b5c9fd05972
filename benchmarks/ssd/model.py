"""SSD300 on the MLPerf reference's modified ResNet-34.

Backbone: ResNet-34's conv1, max-pool, conv2_x and conv3_x, then conv4_x **not strided**, so SSD300's first
feature map is 38x38 (4 x width channels). Extra layers (1x1 then 3x3 conv, both with bias and ReLU, no batch
norm) make the smaller maps. One fused 3x3 head per map predicts both box offsets and class logits.

Head channel layout (chosen here, documented for checkpoints and tests): for a map with A anchors a cell,
channels [0, 4A) are the box offsets, channel 4a + k being coordinate k of anchor kind a, and channels
[4A, 4A + A*C) are the class logits, channel 4A + a*C + c being class c of anchor kind a. That is the reference's
separate loc and conf convs concatenated along the output channels, which is also how the head is initialized.

Outputs are flattened in the anchor order of `anchors.default_boxes`: map by map; within a map, anchor kind
outermost, then row, then column. Images come in already normalized by the input pipeline.

Variable paths: `ssd/backbone/stem/{conv,bn}`, `ssd/backbone/stage{1..3}/block{b}/{conv1,conv2,proj}/{conv,bn}`
(stage 1..3 = conv2_x..conv4_x), `ssd/extra{k}/{conv1x1,conv3x3}` (extra k makes feature map k) and
`ssd/head{k}` for map k.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError
from harness.nn.layers import BatchNorm, Block, Conv2D, Initializer, constant, glorot_uniform
from harness.runtime.base import Runtime

from benchmarks.ssd.anchors import anchors_per_location
from benchmarks.ssd.config import ModelConfig

BACKBONE = "ssd/backbone"
STAGE_STRIDES = (1, 2, 1)
"""conv2_x, conv3_x, conv4_x: the reference sets conv4_x's stride to 1 (torchvision's is 2)."""
STAGE_WIDTHS = (1, 2, 4)
STRIDED, VALID = "stride2", "valid"


# ------------------------------------------------------------------------------------------ structure

@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """One basic block of the backbone (stage and index 1-based)."""
    stage: int
    index: int
    in_ch: int
    out_ch: int
    stride: int

    @property
    def path(self) -> str:
        return f"{BACKBONE}/stage{self.stage}/block{self.index}"

    @property
    def projection(self) -> bool:
        """A 1x1 conv + BN shortcut, when the block changes resolution or channels (as the reference)."""
        return self.stride != 1 or self.in_ch != self.out_ch


def backbone_blocks(cfg: ModelConfig) -> list[BlockSpec]:
    """The backbone's basic blocks in order, from the config alone (shared with tensor_names)."""
    out, in_ch = [], cfg.width
    for s, count in enumerate(cfg.blocks):
        out_ch = cfg.width * STAGE_WIDTHS[s]
        for i in range(count):
            out.append(BlockSpec(s + 1, i + 1, in_ch, out_ch, STAGE_STRIDES[s] if i == 0 else 1))
            in_ch = out_ch
    return out


def extra_path(k: int) -> str:
    """The extra layer making feature map k (k >= 1)."""
    return f"ssd/extra{k}"


def head_path(k: int) -> str:
    return f"ssd/head{k}"


def _halve(n: int) -> int:
    return -(-n // 2)


def extra_kind(current: int, following: int) -> str:
    """How an extra layer's 3x3 conv turns a `current`-sized map into a `following`-sized one.

    VALID (stride 1, pad 0) when following == current - 2, else STRIDED (stride 2, pad 1) when following ==
    ceil(current / 2). VALID is tried first because 5 -> 3 fits both and the reference uses pad 0 there
    (SSD300: 38 -> 19 -> 10 -> 5 strided, 5 -> 3 -> 1 valid).
    """
    if following == current - 2 and following >= 1:
        return VALID
    if following == _halve(current):
        return STRIDED
    raise HarnessError(f"model.feature_sizes: no extra layer goes from a {current}x{current} map to "
                       f"{following}x{following}; a 3x3 conv gives {_halve(current)} (stride 2) or "
                       f"{current - 2} (stride 1, no padding)")


def extra_kinds(feature_sizes: Sequence[int]) -> list[str]:
    return [extra_kind(a, b) for a, b in zip(feature_sizes[:-1], feature_sizes[1:])]


def backbone_size(cfg: ModelConfig) -> int:
    """Side of the backbone's output: conv1 (stride 2, pad 3), SAME max-pool /2, then the strided stages."""
    n = _halve(_halve(cfg.image_size))
    for s in range(len(cfg.blocks)):
        if STAGE_STRIDES[s] == 2:
            n = _halve(n)
    return n


def feature_map_sizes(cfg: ModelConfig) -> list[int]:
    """The map sizes the network produces at cfg.image_size (pure Python, no TensorFlow).

    The extra layers' kinds come from the anchor layout cfg.feature_sizes (`extra_kinds`); they are then
    applied to the backbone's actual output. 0 marks a map the input is too small to produce.
    """
    sizes = [backbone_size(cfg)]
    for kind in extra_kinds(cfg.feature_sizes):
        n = sizes[-1]
        n = _halve(n) if kind == STRIDED else n - 2
        sizes.append(n if n >= 1 and sizes[-1] >= 1 else 0)
    return sizes


def check_layout(cfg: ModelConfig) -> None:
    """HarnessError (one line) unless the network built from cfg yields exactly the anchor layout."""
    if len(cfg.blocks) != len(STAGE_STRIDES) or min(cfg.blocks) < 1:
        raise HarnessError(f"model.blocks={list(cfg.blocks)}: the SSD backbone has {len(STAGE_STRIDES)} stages "
                           f"(conv2_x, conv3_x, conv4_x) of at least one block each (ResNet-34: [3, 4, 6])")
    n = len(cfg.feature_sizes)
    if n < 1:
        raise HarnessError("model.feature_sizes is empty; give at least one feature map size")
    if len(cfg.extra_channels) != n - 1:
        raise HarnessError(f"model.extra_channels has {len(cfg.extra_channels)} entries; the {n} feature maps of "
                           f"model.feature_sizes need {n - 1} (one extra layer per map after the first)")
    bad = [c for c in cfg.extra_channels if len(c) != 2 or min(c) < 1]
    if bad:
        raise HarnessError(f"model.extra_channels: each entry is [1x1 channels, 3x3 channels], both positive; "
                           f"got {bad[0]}")
    if len(cfg.aspect_ratios) != n:
        raise HarnessError(f"model.aspect_ratios has {len(cfg.aspect_ratios)} entries for {n} feature maps")
    got = feature_map_sizes(cfg)
    if got != list(cfg.feature_sizes):
        lo, hi = 8 * (cfg.feature_sizes[0] - 1) + 1, 8 * cfg.feature_sizes[0]
        raise HarnessError(f"model.image_size={cfg.image_size} gives feature maps {got} but the anchor layout "
                           f"model.feature_sizes is {list(cfg.feature_sizes)}; use an image size in "
                           f"{lo}..{hi} or the layout of that image size")


# ------------------------------------------------------------------------------------------ layers

class ConvBN(Block):
    """Backbone conv (no bias, He fan-in init, fixed padding when strided) + batch norm."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, in_ch: int, out_ch: int,
                 size: int, stride: int, bn_group: int) -> None:
        super().__init__(runtime, path, seed)
        self.conv = Conv2D(runtime, f"{path}/conv", seed, in_ch, out_ch, size, stride)
        self.bn = BatchNorm(runtime, f"{path}/bn", seed, out_ch, cfg.bn_momentum, cfg.bn_epsilon,
                            group_size=bn_group)

    def __call__(self, x: tf.Tensor, training: bool, relu: bool = True) -> tf.Tensor:
        y = self.bn(self.conv(x), training)
        return tf.nn.relu(y) if relu else y


class BasicBlock(Block):
    """ResNet-34's block: 3x3 conv-BN-ReLU, 3x3 conv-BN, plus the shortcut, then ReLU."""

    def __init__(self, runtime: Runtime, spec: BlockSpec, seed: int, cfg: ModelConfig, bn_group: int) -> None:
        super().__init__(runtime, spec.path, seed)
        p = spec.path
        self.conv1 = ConvBN(runtime, f"{p}/conv1", seed, cfg, spec.in_ch, spec.out_ch, 3, spec.stride, bn_group)
        self.conv2 = ConvBN(runtime, f"{p}/conv2", seed, cfg, spec.out_ch, spec.out_ch, 3, 1, bn_group)
        self.proj = (ConvBN(runtime, f"{p}/proj", seed, cfg, spec.in_ch, spec.out_ch, 1, spec.stride, bn_group)
                     if spec.projection else None)

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        shortcut = self.proj(x, training, relu=False) if self.proj else x
        y = self.conv2(self.conv1(x, training), training, relu=False)
        return tf.nn.relu(y + shortcut)


class BiasConv(Block):
    """Conv with bias for the extras and heads: glorot-uniform kernel (REF xavier_uniform), zero bias.

    padding: "same" (stride 1), STRIDED (stride 2 after one pixel of zeros each side, PyTorch's pad 1, which
    TF's SAME is not for even sizes) or VALID (stride 1, no padding).
    """

    def __init__(self, runtime: Runtime, path: str, seed: int, in_ch: int, out_ch: int, size: int,
                 padding: str = "same", init: Initializer | None = None) -> None:
        super().__init__(runtime, path, seed)
        self.padding = padding
        self.kernel = self.var("kernel", (size, size, in_ch, out_ch), (None, None, None, "channels"),
                               init or glorot_uniform(size * size * in_ch, size * size * out_ch,
                                                      f"{path}/kernel", seed))
        self.bias = self.var("bias", (out_ch,), ("channels",), constant(0.0))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        x, kernel = tf.cast(x, self.dtype), tf.cast(self.kernel, self.dtype)
        if self.padding == STRIDED:
            x = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
            y = tf.nn.conv2d(x, kernel, 2, "VALID")
        else:
            y = tf.nn.conv2d(x, kernel, 1, "SAME" if self.padding == "same" else "VALID")
        return y + tf.cast(self.bias, self.dtype)


def fused_head_init(in_ch: int, anchors: int, num_classes: int, path: str, seed: int) -> Initializer:
    """The reference's separate loc and conf 3x3 convs, each glorot-uniform with its own fans, concatenated."""
    loc = glorot_uniform(9 * in_ch, 9 * anchors * 4, f"{path}/kernel/loc", seed)
    conf = glorot_uniform(9 * in_ch, 9 * anchors * num_classes, f"{path}/kernel/conf", seed)
    return lambda shape, dtype: tf.concat([loc((3, 3, in_ch, anchors * 4), dtype),
                                           conf((3, 3, in_ch, anchors * num_classes), dtype)], axis=-1)


def split_head(y: tf.Tensor, anchors: int, num_classes: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Fused head output [B, H, W, A*(4+C)] -> loc [B, A*H*W, 4], logits [B, A*H*W, C] in anchor order."""
    h, w = int(y.shape[1]), int(y.shape[2])

    def flat(t: tf.Tensor, k: int) -> tf.Tensor:
        t = tf.reshape(t, [-1, h, w, anchors, k])
        return tf.reshape(tf.transpose(t, [0, 3, 1, 2, 4]), [-1, anchors * h * w, k])

    return flat(y[..., :anchors * 4], 4), flat(y[..., anchors * 4:], num_classes)


class SSD(Block):
    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, bn_group: int) -> None:
        super().__init__(runtime, "ssd", seed)
        check_layout(cfg)
        self.cfg = cfg
        self.stem = ConvBN(runtime, f"{BACKBONE}/stem", seed, cfg, 3, cfg.width, 7, 2, bn_group)
        self.blocks = [BasicBlock(runtime, spec, seed, cfg, bn_group) for spec in backbone_blocks(cfg)]
        channels = [cfg.width * STAGE_WIDTHS[-1]] + [out for _, out in cfg.extra_channels]
        self.extras = []
        for k, (kind, (mid, out)) in enumerate(zip(extra_kinds(cfg.feature_sizes), cfg.extra_channels), start=1):
            p = extra_path(k)
            self.extras.append((BiasConv(runtime, f"{p}/conv1x1", seed, channels[k - 1], mid, 1),
                                BiasConv(runtime, f"{p}/conv3x3", seed, mid, out, 3, kind)))
        self.num_anchors = anchors_per_location(cfg.aspect_ratios)
        self.heads = []
        for k, (ch, a) in enumerate(zip(channels, self.num_anchors)):
            p = head_path(k)
            self.heads.append(BiasConv(runtime, p, seed, ch, a * (4 + cfg.num_classes), 3,
                                       init=fused_head_init(ch, a, cfg.num_classes, p, seed)))

    def features(self, images: tf.Tensor, training: bool) -> list[tf.Tensor]:
        x = self.stem(images, training)
        x = tf.nn.max_pool2d(x, 3, 2, "SAME")
        for block in self.blocks:
            x = block(x, training)
        maps = [x]
        for reduce, expand in self.extras:
            x = tf.nn.relu(expand(tf.nn.relu(reduce(x))))
            maps.append(x)
        return maps

    def __call__(self, images: tf.Tensor, training: bool) -> tuple[tf.Tensor, tf.Tensor]:
        """images [B, S, S, 3] -> (box offsets [B, N, 4], class logits [B, N, num_classes]), float32."""
        locs, confs = [], []
        for x, head, a in zip(self.features(images, training), self.heads, self.num_anchors):
            loc, conf = split_head(head(x), a, self.cfg.num_classes)
            locs.append(loc)
            confs.append(conf)
        return tf.cast(tf.concat(locs, 1), tf.float32), tf.cast(tf.concat(confs, 1), tf.float32)


# ------------------------------------------------------------------------------------------ backbone checkpoint

def checkpoint_key(path: str, names: dict[str, str]) -> str:
    """A backbone variable path -> its checkpoint key: each (regex -> replacement) applied in order."""
    for pattern, repl in names.items():
        try:
            path = re.sub(pattern, repl, path)
        except re.error as e:
            raise HarnessError(f"model.backbone_checkpoint_names: bad regex or replacement {pattern!r} -> "
                               f"{repl!r}: {e}") from None
    return path


def _shown(items: list[str], limit: int = 4) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _assign(runtime: Runtime, var: tf.Variable, value: np.ndarray) -> None:
    """Cross-replica assignment: a mirrored variable takes it on every replica; a mesh variable is split."""
    to_mesh = getattr(runtime, "to_mesh", None)
    if to_mesh is None:
        var.assign(value)
        return
    from tensorflow.experimental import dtensor

    var.assign(to_mesh(value, dtensor.fetch_layout(var)))


def load_backbone(runtime: Runtime, cfg: ModelConfig) -> int:
    """Fills every backbone variable (weights and batch-norm statistics) from cfg.backbone_checkpoint.

    Call it after the model is built, outside any replica function. Every key and shape is checked
    before any variable changes. Returns the number of variables loaded.
    """
    where = f"model.backbone_checkpoint {cfg.backbone_checkpoint!r}"
    if not cfg.backbone_checkpoint:
        raise HarnessError("model.backbone_checkpoint is empty: nothing to load")
    try:
        reader = tf.train.load_checkpoint(cfg.backbone_checkpoint)
    except (tf.errors.OpError, ValueError) as e:
        raise HarnessError(f"{where}: cannot read a TF checkpoint there "
                           f"({(str(e).strip().splitlines() or [type(e).__name__])[0][:200]})") from None
    shapes = reader.get_variable_to_shape_map()
    variables = [v for v in runtime.variables() if v.path.startswith(BACKBONE + "/")]
    if not variables:
        raise HarnessError(f"{where}: the model has no backbone variables (build the SSD model first)")
    keys = {v.path: checkpoint_key(v.path, cfg.backbone_checkpoint_names) for v in variables}
    missing = [f"{v.path} -> {keys[v.path]}" for v in variables if keys[v.path] not in shapes]
    if missing:
        raise HarnessError(f"{where}: {len(missing)} of {len(variables)} backbone variables have no tensor "
                           f"there ({_shown(missing)}); map variable paths to checkpoint keys with "
                           f"model.backbone_checkpoint_names")
    wrong = [f"{v.path} {list(v.variable.shape)} vs {keys[v.path]} {list(shapes[keys[v.path]])}"
             for v in variables if tuple(shapes[keys[v.path]]) != tuple(v.variable.shape)]
    if wrong:
        raise HarnessError(f"{where}: {len(wrong)} backbone variables differ in shape from their checkpoint "
                           f"tensors ({_shown(wrong, 3)}); check model.width / model.blocks")
    for v in variables:
        value = np.asarray(reader.get_tensor(keys[v.path])).astype(v.variable.dtype.as_numpy_dtype)
        _assign(runtime, v.variable, value)
    return len(variables)
