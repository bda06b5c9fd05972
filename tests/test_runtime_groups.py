"""Batch norm over groups of replicas (MLPerf model_bn_span) on the mirrored runtime, and the
runtime.spatial_partition checks that run before any device is touched.

Logical CPU devices can be configured once per process, so the 4-replica case runs in one subprocess that
compares everything against statistics and gradients computed on one device, and reports the differences.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, SMOKE
from harness import config as config_lib
from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.runtime import make_runtime

GROUPS_SCRIPT = """
    import json
    import numpy as np
    import tensorflow as tf
    from harness.config import RuntimeConfig
    from harness.errors import HarnessError
    from harness.nn.layers import BatchNorm
    from harness.runtime import make_runtime

    N, B, H, W, C, EPS, GAMMA, MOMENTUM = 4, 3, 2, 2, 3, 1e-5, 1.5, 0.9
    rt = make_runtime(RuntimeConfig(kind="mirrored", cpu_devices=N))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, B, H, W, C)).astype(np.float32)
    x[2:] = x[2:] * 3.0 + 5.0  # replicas 2+3 differ from 0+1 on purpose
    w = rng.normal(size=x.shape).astype(np.float32)
    bns = {k: BatchNorm(rt, f"bn{k}", 0, C, momentum=MOMENTUM, epsilon=EPS, gamma_init=GAMMA, group_size=k)
           for k in (1, 2, 4)}

    def step(k):
        def replica_fn():
            r = rt.replica_id()
            xr, wr = tf.gather(tf.constant(x), r), tf.gather(tf.constant(w), r)
            with tf.GradientTape() as tape:
                tape.watch(xr)
                y = bns[k](xr, training=True)
                loss = tf.reduce_sum(wr * y) / (N * B)  # the harness convention: pre-divided by global count
            gx, gg = tape.gradient(loss, [xr, bns[k].gamma])
            return y, gx, rt.all_reduce_gradients([gg])[0]  # gradients summed over replicas
        return tf.function(lambda: rt.run(replica_fn, ()))()

    def one_device(k):
        # A different formulation (tf.nn.moments) on one device, over each group's concatenated batch.
        ys, gxs, gg = [], [], np.zeros(C, np.float32)
        gamma = tf.Variable(tf.fill([C], GAMMA))
        for g in range(N // k):
            xg = tf.constant(x[g * k:(g + 1) * k].reshape(k * B, H, W, C))
            wg = tf.constant(w[g * k:(g + 1) * k].reshape(k * B, H, W, C))
            with tf.GradientTape() as tape:
                tape.watch(xg)
                mean, var = tf.nn.moments(xg, [0, 1, 2])
                y = tf.nn.batch_normalization(xg, mean, var, 0.0, gamma, EPS)
                loss = tf.reduce_sum(wg * y) / (N * B)
            gx, dg = tape.gradient(loss, [xg, gamma])
            ys.append(y.numpy().reshape(k, B, H, W, C))
            gxs.append(gx.numpy().reshape(k, B, H, W, C))
            gg += dg.numpy()
        return np.concatenate(ys), np.concatenate(gxs), gg

    out = {}
    for k in (1, 2, 4):
        y, gx, gg = (np.stack([t.numpy() for t in rt.strategy.experimental_local_results(v)]) for v in step(k))
        # By hand (numpy): each group's statistics over its replicas' pixels.
        groups = x.reshape(N // k, -1, C)
        means, variances = groups.mean(1), groups.var(1)
        y_hand = np.concatenate([(x[g * k:(g + 1) * k] - means[g]) / np.sqrt(variances[g] + EPS) * GAMMA
                                 for g in range(N // k)])
        y_ref, gx_ref, gg_ref = one_device(k)
        # The moving statistics average the replicas' (= the groups') statistics (sync="mean").
        mm = [t.numpy() for t in rt.strategy.experimental_local_results(bns[k].moving_mean)]
        mv = [t.numpy() for t in rt.strategy.experimental_local_results(bns[k].moving_var)]
        mm_hand = (1 - MOMENTUM) * means.mean(0)
        mv_hand = MOMENTUM + (1 - MOMENTUM) * variances.mean(0)
        out[k] = dict(
            y_hand=float(np.abs(y - y_hand).max()), y_ref=float(np.abs(y - y_ref).max()),
            gx=float(np.abs(gx - gx_ref).max()), gx_scale=float(np.abs(gx_ref).max()),
            gg=float(np.abs(gg - gg_ref).max()), gg_scale=float(np.abs(gg_ref).max()),
            gg_replicas=float(np.abs(gg - gg[0]).max()),
            mm=float(max(np.abs(m - mm_hand).max() for m in mm)),
            mv=float(max(np.abs(v - mv_hand).max() for v in mv)), mv_value=mv[0].tolist())

    errors = []
    for span in (3 * B, 4, 8 * B):
        try:
            rt.batch_norm_group(span, B)
        except HarnessError as e:
            errors.append(str(e))
    try:
        tf.function(lambda: rt.run(lambda: rt.replica_all_sum([tf.ones(2)], 3), ()))()
    except HarnessError as e:
        errors.append(str(e))
    groups = [rt.batch_norm_group(span, B) for span in (0, B, 2 * B, 4 * B)]
    print("RESULT " + json.dumps(dict(stats=out, errors=errors, groups=groups)))
"""


@pytest.fixture(scope="module")
def groups_result() -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(GROUPS_SCRIPT)], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), timeout=300)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("k", ["1", "2", "4"])
def test_grouped_batch_norm_matches_one_device_per_group(groups_result, k):
    r = groups_result["stats"][k]
    # Outputs: normalized with each group's own statistics (by hand and by tf.nn on one device).
    assert r["y_hand"] < 1e-4 and r["y_ref"] < 1e-4, r
    # Gradients through the grouped all-gather: input and gamma as on one device over the group's batch.
    assert r["gx"] < 1e-4 * r["gx_scale"] and r["gx_scale"] > 1e-3, r
    assert r["gg"] < 1e-4 * max(1.0, r["gg_scale"]) and r["gg_replicas"] == 0.0, r
    # Moving statistics: the average of the groups' statistics, identical on every replica.
    assert r["mm"] < 1e-5 and r["mv"] < 1e-4, r


def test_groups_of_two_differ_from_global_statistics(groups_result):
    # Replicas 2+3 are shifted: pooled variance (global) exceeds the mean of the pairs' variances.
    pairs, everything = groups_result["stats"]["2"]["mv_value"], groups_result["stats"]["4"]["mv_value"]
    assert all(g > p + 0.1 for p, g in zip(pairs, everything)), (pairs, everything)


def test_spans_that_do_not_divide_the_replicas_are_refused(groups_result):
    assert groups_result["groups"] == [1, 1, 2, 4]
    not_divisor, not_multiple, too_big, traced = groups_result["errors"]
    assert not_divisor == ("model.bn_span=9 with a per-replica batch of 3 on 4 replicas: the span must be the "
                           "per-replica batch times a divisor of 4 (valid spans: 3, 6, 12; 0 = 3)")
    assert "model.bn_span=4 " in not_multiple and "valid spans: 3, 6, 12" in not_multiple
    assert "model.bn_span=24 " in too_big
    assert "groups of 3 replicas" in traced
    assert all("\n" not in e for e in groups_result["errors"])


@pytest.mark.parametrize("dims, message", [
    ([1, 8], "must have rank 4"),
    ([1, 1, 2, 1], "only dimension 1 (image height) may be split"),
    ([1, 0, 1, 1], "every entry must be >= 1"),
    ([1, 3, 1, 1], "a TPU replica can span 2, 4, 8, 16 cores, not 3"),
])
def test_spatial_partition_field_is_validated_before_connecting(dims, message):
    # kind=tpu: the checks run before any connection attempt, so no TPU is needed to see them.
    with pytest.raises(HarnessError, match="runtime.spatial_partition=") as e:
        make_runtime(RuntimeConfig(kind="tpu", tpu="grpc://127.0.0.1:1", spatial_partition=dims))
    assert message in str(e.value)


@pytest.mark.parametrize("kind", ["default", "mirrored", "multi_worker", "mesh"])
def test_spatial_partition_is_refused_off_tpu_in_one_line(kind):
    # The path the CLI takes: load_config, then make_runtime first thing (before the run directory and
    # log exist); the CLI prints the HarnessError as one `error:` line and exits 2.
    cfg = config_lib.load_config(SMOKE, [f"runtime.kind={kind}", "runtime.spatial_partition=[1,2,1,1]"])
    assert cfg.runtime.spatial_partition == [1, 2, 1, 1]
    with pytest.raises(HarnessError) as e:
        make_runtime(cfg.runtime)
    assert str(e.value) == (f"runtime.spatial_partition=[1, 2, 1, 1]: spatial partitioning needs a TPU "
                            f"(runtime.kind=tpu, here {kind}): the halo exchange a height-split convolution "
                            f"needs exists only on TPU; remove runtime.spatial_partition")


def test_no_split_is_off():
    from harness.runtime.base import check_spatial_partition

    assert check_spatial_partition([], "mirrored") == ()
    assert check_spatial_partition([1, 1, 1, 1], "mirrored") == ()
    assert check_spatial_partition([1, 8, 1, 1], "tpu") == (1, 8, 1, 1)


def test_one_hot_take_along_axis1_equals_the_gather():
    """The mesh takes rows (e.g. beams) by one-hot contractions; they must pick exactly what the gather of
    the tf.distribute runtimes picks, for ints, bools and floats of any rank."""
    import numpy as np
    import tensorflow as tf

    from harness.runtime.base import one_hot_take_along_axis1
    rng = np.random.default_rng(0)
    index = tf.constant(rng.integers(0, 4, [3, 8]), tf.int32)
    for x in (tf.constant(rng.integers(0, 33000, [3, 4, 11]), tf.int32), tf.constant(rng.random([3, 4]) > 0.5),
              tf.constant(rng.normal(size=[3, 4, 5, 2, 6]) * 1e4, tf.float32)):
        np.testing.assert_array_equal(one_hot_take_along_axis1(x, index).numpy(),
                                      tf.gather(x, index, batch_dims=1).numpy())
