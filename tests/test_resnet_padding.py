"""ResNet's strided convolutions and max pool pad as the MLPerf references do.

The expected outputs come from numpy alone: pads from the two formulas (TF 'SAME', the TF2 reference's
strided 3x3 and max pool; "fixed", the TF1 reference's `fixed_padding` and both references' 7x7/2 stem),
np.pad, then a VALID convolution or max pool written as loops here. Odd and even input sizes, since 'SAME'
depends on the size and "fixed" does not.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from harness import config as config_lib
from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.nn.layers import Conv2D
from harness.runtime import make_runtime
from harness.train import reference

from benchmarks.resnet.config import ModelConfig
from benchmarks.resnet.model import ResNet, max_pool

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(REPO, "configs", "resnet", "reference.yaml")


def same_pads(size: int, k: int, stride: int) -> tuple[int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def fixed_pads(k: int) -> tuple[int, int]:
    return (k - 1) // 2, (k - 1) - (k - 1) // 2


def pads(padding: str, size: int, k: int, stride: int) -> tuple[int, int]:
    return same_pads(size, k, stride) if padding == "same" or stride == 1 else fixed_pads(k)


def np_windows(x: np.ndarray, k: int, stride: int):
    """(i, j, window [n, k, k, c]) of a VALID sliding window over x [n, h, w, c]."""
    for i in range((x.shape[1] - k) // stride + 1):
        for j in range((x.shape[2] - k) // stride + 1):
            yield i, j, x[:, i * stride:i * stride + k, j * stride:j * stride + k, :]


def np_conv(x: np.ndarray, w: np.ndarray, stride: int, before: int, after: int) -> np.ndarray:
    x = np.pad(x.astype(np.float64), ((0, 0), (before, after), (before, after), (0, 0)))
    k = w.shape[0]
    size = (x.shape[1] - k) // stride + 1
    out = np.zeros((x.shape[0], size, size, w.shape[3]))
    for i, j, window in np_windows(x, k, stride):
        out[:, i, j, :] = np.tensordot(window, w.astype(np.float64), axes=([1, 2, 3], [0, 1, 2]))
    return out


def np_max_pool(x: np.ndarray, k: int, stride: int, before: int, after: int) -> np.ndarray:
    x = np.pad(x, ((0, 0), (before, after), (before, after), (0, 0)), constant_values=-np.inf)
    size = (x.shape[1] - k) // stride + 1
    out = np.zeros((x.shape[0], size, size, x.shape[3]), x.dtype)
    for i, j, window in np_windows(x, k, stride):
        out[:, i, j, :] = window.max(axis=(1, 2))
    return out


def test_the_pad_formulas_give_the_references_numbers():
    # TF2 reference: 3x3/2 'same' at ResNet-50's 56, 28, 14 pads 0/1; the max pool at 112 too.
    assert [same_pads(n, 3, 2) for n in (56, 28, 14, 112)] == [(0, 1)] * 4
    assert same_pads(7, 3, 2) == (1, 1) and same_pads(224, 7, 2) == (2, 3) and same_pads(8, 1, 2) == (0, 0)
    # TF1 reference's fixed_padding: 1/1 for a 3x3 and 3/3 for the 7x7 stem, whatever the size.
    assert fixed_pads(3) == (1, 1) and fixed_pads(7) == (3, 3) and fixed_pads(1) == (0, 0)


def _layer(padding: str, size: int, k: int, stride: int, precision: str = "float32", in_ch: int = 3,
           out_ch: int = 4, seed: int = 5):
    runtime = make_runtime(RuntimeConfig(precision=precision))
    with runtime.scope():
        conv = Conv2D(runtime, "t/conv", seed, in_ch, out_ch, k, stride, padding)
    x = np.random.default_rng(size * 10 + k).normal(size=(2, size, size, in_ch)).astype(np.float32)
    return conv, x


@pytest.mark.parametrize("padding,k,stride", [("same", 3, 2), ("fixed", 3, 2), ("fixed", 7, 2), ("same", 1, 2),
                                               ("fixed", 1, 2), ("same", 3, 1), ("fixed", 3, 1)])
@pytest.mark.parametrize("size", [7, 8, 11, 12])
def test_conv_matches_numpy_pad_then_valid_conv(padding, k, stride, size):
    conv, x = _layer(padding, size, k, stride)
    want = np_conv(x, conv.kernel.numpy(), stride, *pads(padding, size, k, stride))
    assert want.shape[1] == -(-size // stride)  # ceil(in / stride) either way: shapes and FLOPs unchanged
    scale = np.abs(want).max()
    for jit in (False, True):
        got = tf.function(conv, jit_compile=jit)(tf.constant(x)).numpy()
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5 * scale, (jit, np.abs(got - want).max())


@pytest.mark.parametrize("size", [8, 12])
def test_same_and_fixed_differ_at_even_sizes_and_agree_at_odd(size):
    conv, x = _layer("same", size, 3, 2)
    fixed, _ = _layer("fixed", size, 3, 2)
    same_out, fixed_out = conv(tf.constant(x)).numpy(), fixed(tf.constant(x)).numpy()
    assert np.abs(same_out - fixed_out).max() > 0.1 * np.abs(same_out).max()  # the test can tell them apart
    conv, x = _layer("same", size - 1, 3, 2)
    fixed, _ = _layer("fixed", size - 1, 3, 2)
    assert np.array_equal(conv(tf.constant(x)).numpy(), fixed(tf.constant(x)).numpy())


@pytest.mark.parametrize("padding", ["same", "fixed"])
def test_bfloat16_conv_matches_numpy_on_the_rounded_operands(padding):
    conv, x = _layer(padding, 8, 3, 2, precision="bfloat16", in_ch=8)
    rounded = tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy()
    kernel = tf.cast(tf.cast(conv.kernel, tf.bfloat16), tf.float32).numpy()
    want = np_conv(rounded, kernel, 2, *pads(padding, 8, 3, 2))
    other = np_conv(rounded, kernel, 2, *pads("fixed" if padding == "same" else "same", 8, 3, 2))
    scale = np.abs(want).max()
    for jit in (False, True):
        got = tf.function(conv, jit_compile=jit)(tf.constant(x))
        assert got.dtype == tf.bfloat16
        err = np.abs(got.numpy().astype(np.float64) - want).max()
        assert err <= 2e-2 * scale < np.abs(other - want).max(), (jit, err)


@pytest.mark.parametrize("size", [7, 8, 112 // 8])
def test_max_pool_matches_numpy_same_padding(size):
    # All values negative: a zero pad would win the max where the -inf pad of 'SAME' never does.
    x = -1.0 - np.abs(np.random.default_rng(size).normal(size=(2, size, size, 3))).astype(np.float32)
    want = np_max_pool(x, 3, 2, *same_pads(size, 3, 2))
    for jit in (False, True):
        got = tf.function(max_pool, jit_compile=jit)(tf.constant(x)).numpy()
        assert np.array_equal(got, want), jit
    if size % 2 == 0:  # 1/1 (torchvision's MaxPool2d(3, 2, 1)) would pool other windows
        assert not np.array_equal(np_max_pool(x, 3, 2, 1, 1), want)


@pytest.mark.parametrize("padding", ["same", "fixed"])
def test_resnet50_layout_pads_its_strided_convs_and_keeps_the_shapes_at_224(padding):
    runtime = make_runtime(RuntimeConfig())
    with runtime.scope():
        net = ResNet(runtime, 1, ModelConfig(blocks=[1, 1, 1, 1], width=2), 10, 1, padding)
    assert net.stem.conv.padding == "fixed" and net.stem.conv.size == 7  # 3/3 in both references
    strided = [b.b.conv for b in net.blocks if b.b.conv.stride == 2]
    assert len(strided) == 3 and all(c.padding == padding and c.size == 3 for c in strided)
    x = net.stem(tf.zeros([1, 224, 224, 3]), False)
    sizes = [x.shape[1]]
    x = max_pool(x)
    sizes.append(x.shape[1])
    for block in net.blocks:
        x = block(x, False)
        sizes.append(x.shape[1])
    assert sizes == [112, 56, 56, 28, 14, 7]
    assert net(tf.zeros([1, 224, 224, 3]), False).shape == (1, 10)


def _workload(sets: list[str]):
    from benchmarks import registry
    cfg = config_lib.load_config(REFERENCE, ["runtime.kind=default", *sets])
    return registry.get("resnet")(cfg, make_runtime(RuntimeConfig()))


@pytest.mark.parametrize("sets,padding", [
    ([], "same"),                                                       # 4.0.0: the TF2 reference
    (["ruleset=1.0.0"], "same"),
    (["ruleset=0.7.0", "check_rulesets=[]"], "fixed"),                  # the TF1 reference
    (["ruleset=0.7.0", "check_rulesets=[]", "model.conv_padding=same"], "same"),
    (["model.conv_padding=fixed"], "fixed"),
])
def test_the_runs_ruleset_chooses_the_padding_unless_the_config_does(sets, padding):
    workload = _workload(sets)
    assert workload.padding == padding and workload.model_settings()["model.conv_padding"] == padding
    reference_padding = "fixed" if "ruleset=0.7.0" in sets else "same"
    assert workload.reference_model().values["model.conv_padding"] == reference_padding


def test_closed_real_data_refuses_the_other_references_padding():
    reference.check_closed_model(_workload([]))
    reference.check_closed_model(_workload(["ruleset=0.7.0", "check_rulesets=[]"]))
    for sets, have, want in ((["model.conv_padding=fixed"], "fixed", "same"),
                             (["ruleset=0.7.0", "check_rulesets=[]", "model.conv_padding=same"], "same", "fixed")):
        with pytest.raises(HarnessError, match=rf"^closed division on real data needs the reference ResNet-50 "
                                               rf"v1.5: model.conv_padding={have} \(reference {want}\); use "):
            reference.check_closed_model(_workload(sets))


def test_an_unknown_padding_is_one_error():
    with pytest.raises(HarnessError, match=r"^config model.conv_padding: 'valid' is not one of ruleset, same, fixed$"):
        config_lib.load_config(REFERENCE, ["model.conv_padding=valid"])


def test_both_paddings_compile_to_the_flops_the_cost_model_counts():
    from types import SimpleNamespace

    from harness.plan.hlo_flops import hlo_flops

    from benchmarks.resnet.cost import forward_macs_and_params

    cfg = SimpleNamespace(model=ModelConfig(blocks=[1, 1, 1, 1], width=4),
                          data=SimpleNamespace(image_size=64, num_classes=10))
    macs, _ = forward_macs_and_params(cfg)
    flops = {}
    for padding in ("same", "fixed"):
        runtime = make_runtime(RuntimeConfig())
        with runtime.scope():
            net = ResNet(runtime, 1, cfg.model, 10, 1, padding)
        step = tf.function(lambda x: net(x, training=False), jit_compile=True)
        flops[padding] = hlo_flops(step.experimental_get_compiler_ir(tf.zeros([2, 64, 64, 3]))(stage="hlo"))
    assert flops["same"] == flops["fixed"] == pytest.approx(2 * 2 * macs, rel=0.02)  # 2 images, 2 FLOPs a MAC
