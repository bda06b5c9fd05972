"""gpt_oss_20b in one process: training tokens/s of the harness loop against a bare tf.function step of the
same model, and the MoE layer under each dispatch (model.moe_dispatch: sorted blocks, dense one-hot) against
a dense SwiGLU feed-forward of the same active FLOPs (hidden units = experts_per_token x expert_hidden), all
as ratios measured in this run.

Training reuses bench_loop_overhead (rounds alternate, headline = median of paired ratios; it trains with
the config's own dispatch). The layer comparison times forward + backward of one MoE layer per dispatch
(router, dispatch, experts, combine) and of the dense layer on the same [batch, seq, hidden] input,
alternating rounds. The dense dispatch's dropless capacity (the whole group) makes its experts compute
experts/k times the active FLOPs; the sorted dispatch computes the assignments plus at most experts x
block padding rows.

    python scripts/bench_moe.py [CONFIG] [--set key=value ...] [--rounds 3] [--steps 4]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from harness.nn.layers import normal  # noqa: E402
from scripts.bench_loop_overhead import measure  # noqa: E402


def layer_rates(workload, rounds: int) -> tuple[dict[str, list[float]], int]:
    """({"sorted"|"dense-dispatch"|"dense SwiGLU": tokens/s per round}, dense capacity) for forward +
    backward of one layer."""
    from benchmarks.gpt_oss_20b.moe import MoE, expert_capacity

    c, rt = workload.cfg.model, workload.runtime
    b, seq, m = workload.cfg.schedule.global_batch_size, workload.cfg.data.seq_length, c.hidden_size
    h = c.experts_per_token * c.expert_hidden
    with rt.scope():
        moes = {name: MoE(rt, f"bench/moe_{name}", 0, dataclasses.replace(c, moe_dispatch=name))
                for name in ("sorted", "dense")}
        dense = [rt.variable(f"bench/dense/{n}", shape, (None, None), normal(c.init_stddev, f"bench/{n}", 0))
                 for n, shape in (("gate", (m, h)), ("up", (m, h)), ("down", (h, m)))]
    x = tf.random.stateless_normal([b, seq, m], [1, 2])

    def grad_of(fn, variables):
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(fn()))
            return tape.gradient(loss, variables)
        return tf.function(step)

    steps = {f"MoE {name} dispatch": grad_of(lambda layer=layer: layer(x)[0], list(layer.trainable_variables))
             for name, layer in moes.items()}
    steps["dense SwiGLU"] = grad_of(lambda: tf.matmul(tf.nn.silu(x @ dense[0]) * (x @ dense[1]), dense[2]), dense)
    for fn in steps.values():
        fn()  # compile
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            t = time.perf_counter()
            tf.nest.map_structure(lambda g: g.numpy(), fn())
            rates[name].append(b * seq / (time.perf_counter() - t))
    group = min(c.moe_group_size, seq)
    return rates, expert_capacity(group, c.num_experts, c.experts_per_token, c.capacity_factor)


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

    rates, capacity = layer_rates(workload, a.rounds)
    c = workload.cfg.model
    dense = rates["dense SwiGLU"]
    print(f"MoE layer: {c.num_experts} experts, top-{c.experts_per_token}, {workload.cfg.schedule.global_batch_size} "
          f"rows of {seq} tokens; sorted blocks of {c.moe_block_size} rows; dense dispatch: group "
          f"{min(c.moe_group_size, seq)}, capacity {capacity}")
    print(f"dense SwiGLU of the same active FLOPs (hidden {c.experts_per_token * c.expert_hidden}): "
          f"{statistics.median(dense):10.0f} tokens/s fwd+bwd")
    for name in ("MoE sorted dispatch", "MoE dense dispatch"):
        ratio = statistics.median(d / m for m, d in zip(rates[name], dense))
        print(f"{name:20s}: {statistics.median(rates[name]):10.0f} tokens/s fwd+bwd; time / dense SwiGLU time = "
              f"{ratio:.2f} (median of per-round paired ratios)")


if __name__ == "__main__":
    main()
