"""gpt_oss_20b in one process: training tokens/s of the harness loop against a bare tf.function step of the
same model, and the MoE layer's dispatch overhead against a dense SwiGLU feed-forward of the same active
FLOPs (hidden units = experts_per_token x expert_hidden), both as ratios measured in this run.

Training reuses bench_loop_overhead (rounds alternate, headline = median of paired ratios). The layer
comparison times forward + backward of one MoE layer (router, dispatch/combine einsums, experts at their
capacity) and of the dense layer on the same [batch, seq, hidden] input, alternating rounds; with the
dropless capacity (the whole group) the experts also compute experts/k times the active FLOPs, and the
ratio shows that cost too.

    python scripts/bench_moe.py [CONFIG] [--set key=value ...] [--rounds 3] [--steps 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from harness.nn.layers import normal  # noqa: E402
from scripts.bench_loop_overhead import measure  # noqa: E402


def layer_rates(workload, rounds: int) -> tuple[list[float], list[float], int]:
    """(MoE tokens/s per round, dense tokens/s per round, capacity) for forward + backward of one layer."""
    from benchmarks.gpt_oss.moe import MoE, expert_capacity

    c, rt = workload.cfg.model, workload.runtime
    b, seq, m = workload.cfg.schedule.global_batch_size, workload.cfg.data.seq_length, c.hidden_size
    h = c.experts_per_token * c.expert_hidden
    with rt.scope():
        moe = MoE(rt, "bench/moe", 0, c)
        dense = [rt.variable(f"bench/dense/{n}", shape, (None, None), normal(c.init_stddev, f"bench/{n}", 0))
                 for n, shape in (("gate", (m, h)), ("up", (m, h)), ("down", (h, m)))]
    x = tf.random.stateless_normal([b, seq, m], [1, 2])

    def grad_of(fn, variables):
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(fn()))
            return tape.gradient(loss, variables)
        return tf.function(step)

    moe_step = grad_of(lambda: moe(x)[0], list(moe.trainable_variables))
    dense_step = grad_of(lambda: tf.matmul(tf.nn.silu(x @ dense[0]) * (x @ dense[1]), dense[2]), dense)
    for fn in (moe_step, dense_step):
        fn()  # compile
    rates: dict[str, list[float]] = {"moe": [], "dense": []}
    for _ in range(rounds):
        for name, fn in (("moe", moe_step), ("dense", dense_step)):
            t = time.perf_counter()
            tf.nest.map_structure(lambda g: g.numpy(), fn())
            rates[name].append(b * seq / (time.perf_counter() - t))
    group = min(c.moe_group_size, seq)
    return rates["moe"], rates["dense"], expert_capacity(group, c.num_experts, c.experts_per_token,
                                                         c.capacity_factor)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default="configs/gpt_oss_20b/smoke.yaml")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()

    h, b, runtime, workload = measure(a.config, a.overrides, a.rounds, a.steps)
    seq = workload.cfg.data.seq_length
    paired = statistics.median(x / y for x, y in zip(h, b))
    data = "SYNTHETIC data" if workload.is_synthetic else f"{workload.data_source} data"
    print(f"config {a.config} {' '.join(a.overrides)} | {runtime.description} | rows of {seq} tokens | {data}")
    print(f"train harness loop : {statistics.median(h) * seq:10.0f} tokens/s")
    print(f"train bare step    : {statistics.median(b) * seq:10.0f} tokens/s")
    print(f"train ratio harness/bare = {paired:.3f} (median of per-round paired ratios)")

    moe, dense, capacity = layer_rates(workload, a.rounds)
    c = workload.cfg.model
    ratio = statistics.median(d / m for m, d in zip(moe, dense))
    print(f"MoE layer ({c.num_experts} experts, top-{c.experts_per_token}, group {min(c.moe_group_size, seq)}, "
          f"capacity {capacity}): {statistics.median(moe):10.0f} tokens/s fwd+bwd")
    print(f"dense SwiGLU of the same active FLOPs (hidden {c.experts_per_token * c.expert_hidden}): "
          f"{statistics.median(dense):10.0f} tokens/s fwd+bwd")
    print(f"MoE time / dense time = {ratio:.2f} (median of per-round paired ratios; dispatch, combine and "
          f"routing overhead, plus idle expert slots at this capacity)")


if __name__ == "__main__":
    main()
