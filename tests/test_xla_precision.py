"""Every workload's per-replica train and eval steps under XLA on one CPU device, against the same steps
without XLA, and in bfloat16 against float32; float16 (dynamic loss scaling) for the workloads
step_cases.FLOAT16 names (the loss scaling is the loop's, the same for every workload: that list says which
workloads' own ops float16 adds something for).

Small variants of the smoke configs, two train steps and a tiny eval each, one subprocess for the
selected workloads (tests/helpers/step_case.py, shared with the workload contract through
tests/step_cases.py). The full smoke runs under XLA and in each precision are manual checks
(docs/accelerators.md and the workload pages).
"""
from __future__ import annotations

import math

import pytest

from benchmarks import registry
from step_cases import FLOAT16, SMALL, STEPS, step_case

# bfloat16 keeps 8 significant bits: the first loss of an untrained model agrees with float32 to well
# within 2%; float16 keeps 11 bits.
RTOL = {"bfloat16": 2e-2, "float16": 5e-3}


def test_every_registered_workload_has_a_case():
    assert sorted(SMALL) == registry.names()
    assert set(FLOAT16) <= set(SMALL) and "resnet" in FLOAT16  # resnet's float16 steps make the overflow case


@pytest.mark.step_cases(onednn=("1",))
@pytest.mark.parametrize("name", registry.names())
def test_xla_train_and_eval_match_the_plain_steps(name):
    r = step_case(name)
    assert r["xla_compiled"]
    assert len(r["xla_losses"]) == STEPS and all(math.isfinite(x) for x in r["xla_losses"])
    assert r["xla_losses"] == pytest.approx(r["plain_losses"], rel=1e-4)
    if name == "ssd":
        # Top-k and NMS under XLA: scores differ in the last float32 bits, so near-tied boxes can swap
        # places in the ranking COCOeval walks; the mAP then moves by far less than 1e-3.
        assert r["xla_eval_same_weights"] == pytest.approx(r["plain_eval"], abs=1e-3)
    elif name in ("gpt_oss_20b", "llama31_8b", "llama2_70b_lora", "deepseekv3_671b"):
        # A token-weighted mean of float32 cross-entropies: XLA fuses the sums in another order.
        assert r["xla_eval_same_weights"] == pytest.approx(r["plain_eval"], rel=1e-6)
    elif name == "flux1":
        # Mean squared errors of float32 latents whose noise comes by Box-Muller: XLA's log, cos and sqrt
        # differ from TensorFlow's kernels in the last bit (measured: 5e-8 relative).
        assert r["xla_eval_same_weights"] == pytest.approx(r["plain_eval"], rel=1e-6)
    else:
        assert r["xla_eval_same_weights"] == r["plain_eval"]


@pytest.mark.step_cases(onednn=("1",))
@pytest.mark.parametrize("name,precision", [(n, "bfloat16") for n in registry.names()]
                         + [(n, "float16") for n in registry.names() if n in FLOAT16])
def test_low_precision_steps_track_float32_with_float32_state(name, precision):
    r = step_case(name)
    p = r[precision]
    assert all(math.isfinite(x) for x in p["losses"])
    assert p["losses"][0] == pytest.approx(r["plain_losses"][0], rel=RTOL[precision])
    if registry.get(name).HIGHER_IS_BETTER:
        assert 0.0 <= p["eval"] <= 1.0
    else:  # a loss in nats: after the same two steps it tracks float32's as the first loss does
        assert p["eval"] == pytest.approx(r["plain_eval"], rel=RTOL[precision])
    # Master weights, optimizer slots, step counters, loss scale and batch-norm statistics; a frozen base
    # keeps the dtype it is held in whatever the compute precision (llama2_70b_lora's bf16, norms float32).
    assert set(p["variable_dtypes"]) <= {"float32", "int64"}
    assert set(p["frozen_dtypes"]) == ({"bfloat16", "float32"} if name == "llama2_70b_lora" else set())
    if precision == "float16":
        skipped = p["loss_scale"]["skipped_steps"]
        assert p["optimizer_step"] == STEPS - skipped
        # growth_steps=1: each finite step doubles the scale, each skipped one halves it.
        assert p["loss_scale"]["scale"] == 32768.0 * 2.0 ** (STEPS - 2 * skipped)
    else:
        assert p["loss_scale"] is None and p["optimizer_step"] == STEPS


@pytest.mark.step_cases(onednn=("1",), name="resnet")
def test_float16_overflow_skips_the_update_and_lowers_the_scale():
    o = step_case("resnet")["float16_overflow"]
    assert o["loss_scale"]["skipped_steps"] == STEPS
    assert o["optimizer_step"] == 0 and o["weights_unchanged"]
    assert o["loss_scale"]["scale"] == pytest.approx(1e38 / 2 ** STEPS, rel=1e-6)
    assert all(math.isfinite(x) for x in o["losses"])  # the float32 loss itself stays finite


def test_loss_scale_rule_in_isolation():
    import tensorflow as tf

    from harness.config import RuntimeConfig
    from harness.nn.loss_scale import DynamicLossScale
    from harness.runtime import make_runtime

    rt = make_runtime(RuntimeConfig(precision="float16"))
    ls = DynamicLossScale(rt, initial=8.0, growth_steps=2)

    @tf.function
    def step(grads):
        scale = ls.scale.read_value()
        unscaled, finite = ls.unscale(grads, scale)
        ls.update(finite, scale)
        return unscaled, finite

    got, finite = step([tf.constant([8.0, 16.0])])
    assert bool(finite) and got[0].numpy().tolist() == [1.0, 2.0] and float(ls.scale.numpy()) == 8.0
    step([tf.constant([1.0])])
    assert float(ls.scale.numpy()) == 16.0 and int(ls.good_steps.numpy()) == 0  # 2 good steps: doubled
    _, finite = step([tf.constant([1.0, float("inf")])])
    assert not bool(finite) and float(ls.scale.numpy()) == 8.0 and int(ls.skipped.numpy()) == 1
