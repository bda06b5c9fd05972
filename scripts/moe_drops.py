"""How many expert assignments a capacity factor would drop on a trained router: gpt_oss_20b's routing of real
rows after some training, re-slotted offline at several capacity factors and routing-group sizes.

Trains CONFIG (default: the 1-device smoke, dropless) for --steps loops of schedule.steps_per_loop steps, then
routes --rows eval rows and, for each layer, takes each token's top-k experts (what a dropless run computes).
A capacity factor cf gives each expert ceil(cf x group x k / experts) slots per routing group
(benchmarks/lm/moe_capacity.py expert_capacity), filled in the router's priority order (first choices first,
earlier tokens first); the rest are dropped. Prints, per group size, the dropped share at each cf and the
largest load any expert took in any group relative to the mean (the cf a dropless capacity would need there).

    python scripts/moe_drops.py [CONFIG] [--set key=value ...] [--steps 8] [--rows 4]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

CAPACITY_FACTORS = (1.0, 1.25, 1.5, 2.0, 4.0)


def dropped(index: np.ndarray, experts: int, group: int, capacity_factor: float) -> tuple[int, float]:
    """index [rows, seq, k] -> (assignments dropped at this capacity, peak load / mean load over groups)."""
    rows, seq, k = index.shape
    g = index.reshape(rows * seq // group, group, k)
    capacity = max(1, min(group, math.ceil(capacity_factor * group * k / experts)))
    drops, peak = 0, 0
    for tokens in g:
        counts = np.zeros(experts, np.int64)
        for choice in range(k):                 # priority: every first choice, then every second, ...
            for e in tokens[:, choice]:
                drops += counts[e] >= capacity
                counts[e] += 1
        peak = max(peak, counts.max())
    return drops, peak / (group * k / experts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default="configs/gpt_oss_20b/smoke.yaml")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--steps", type=int, default=8, help="train loops before routing")
    parser.add_argument("--rows", type=int, default=4, help="eval rows routed")
    args = parser.parse_args()

    from harness.train import loop
    from tests.helpers.step_case import build

    cfg, rt, wl = build(args.config, args.overrides)
    m = cfg.model
    steps = loop.CompiledSteps(rt, wl)
    it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
    loss = float("nan")
    for _ in range(args.steps):
        loss = float(steps.train_loop(it, tf.constant(cfg.schedule.steps_per_loop))["loss"])
    print(f"trained {args.steps * cfg.schedule.steps_per_loop} steps, last loss {loss:.4f}")
    batch = next(iter(loop.eval_input(rt, wl, args.rows, cfg.seed)))
    _, routings = wl.model(batch["tokens"][:, :-1])
    index = np.concatenate([r.index.numpy().reshape(args.rows, -1, m.experts_per_token) for r in routings])
    total = index.size
    seq = index.shape[1]
    for group in sorted({min(m.moe_group_size, seq), 512, seq} & set(range(1, seq + 1))):
        if seq % group:
            continue
        cells = []
        for cf in CAPACITY_FACTORS:
            n, peak = dropped(index, m.num_experts, group, cf)
            cells.append(f"cf {cf:g}: {n / total:.2%}")
        print(f"group {group:5d} tokens ({m.num_experts} experts, top-{m.experts_per_token}, {len(routings)} "
              f"layers x {args.rows} rows): dropped " + ", ".join(cells) + f"; peak expert load {peak:.2f}x mean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
