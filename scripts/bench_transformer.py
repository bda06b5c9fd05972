"""Transformer in one process: training token slots/s of the harness loop against a bare tf.function step
of the same model, and beam-search sentences/s with the key/value cache against without it.

Training reuses bench_loop_overhead (rounds alternate, headline = median of paired ratios); tokens are
row slots (global_batch_size rows x data.row_length), of which the real-token share is printed too.
Decoding runs the workload's own `translate` on the eval set's first sentences, cached then uncached,
alternating, with identical hypotheses required.

    python scripts/bench_transformer.py [CONFIG] [--set key=value ...] [--rounds 3] [--steps 20] [--sentences 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from scripts.bench_loop_overhead import measure  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default="configs/transformer/smoke.yaml")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--jit", action="store_true", help="XLA on the per-replica steps (runtime.jit_compile=true); "
                   "the bare baseline is compiled the same way")
    p.add_argument("--sentences", type=int, default=64)
    a = p.parse_args()
    if a.jit:
        a.overrides.append("runtime.jit_compile=true")

    h, b, runtime, workload = measure(a.config, a.overrides, a.rounds, a.steps)
    row = workload.source.row_length
    rows = workload.source.rows if hasattr(workload.source, "rows") else None
    real = f", {rows['targets_segmentation'].astype(bool).mean():.0%} of target slots real" if rows else ""
    paired = statistics.median(x / y for x, y in zip(h, b))
    data = "SYNTHETIC data" if workload.is_synthetic else f"{workload.data_source} data"
    print(f"config {a.config} {' '.join(a.overrides)} | {runtime.description} | rows of {row} tokens | {data}")
    print(f"train harness loop : {statistics.median(h) * row:10.0f} token slots/s{real}")
    print(f"train bare step    : {statistics.median(b) * row:10.0f} token slots/s")
    print(f"train ratio harness/bare = {paired:.3f} (median of per-round paired ratios)")

    e = workload.eval_cfg
    sources = workload.source.eval_set[0][:a.sentences]
    inputs = np.zeros([len(sources), workload.eval_length], np.int32)
    for i, ids in enumerate(sources):
        inputs[i, :len(ids)] = ids
    inputs = tf.constant(inputs)
    decode = {c: tf.function(lambda x, c=c: workload.model.translate(x, e.beam_size, e.alpha, e.extra_decode_length,
                                                                      workload.decode_length, cached=c))
              for c in (True, False)}
    outputs = {c: decode[c](inputs).numpy() for c in (True, False)}  # compile both
    assert np.array_equal(outputs[True], outputs[False]), "cached and uncached decoding differ"
    rates: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(a.rounds):
        for c in (True, False):
            t = time.perf_counter()
            decode[c](inputs).numpy()
            rates[c].append(len(sources) / (time.perf_counter() - t))
    cached, uncached = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"beam search (beam {e.beam_size}, up to {workload.decode_length} steps, {len(sources)} sentences, "
          f"untrained model): cached {cached:.1f} sentences/s, uncached {uncached:.1f} sentences/s, "
          f"ratio {cached / uncached:.2f}")


if __name__ == "__main__":
    main()
