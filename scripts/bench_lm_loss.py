"""The decoder LMs' loss + gradients: time and peak host memory of the blockwise cross-entropy
(harness/nn/cross_entropy.py) against the whole-logits one-hot formulation it replaced, as ratios measured
in this run.

Each measurement is a fresh process (peak memory is per process: the kernel's high-water mark of resident
memory, less the process's resident size once its inputs exist), one step of loss + gradients of the LM head
and its input at batch x seq x vocab, float32, compiled by tf.function (and with --xla, by XLA). Rounds
alternate blockwise / one-hot; the time is the median step (wall and process CPU seconds) of the rounds after
one warm-up step each. A one-hot
run the host cannot hold is reported as killed (its memory then is at least what the host had).

    python scripts/bench_lm_loss.py [--case 8x1024x128256x64 ...] [--rounds 2] [--steps 3] [--xla]

Default cases: the issue's CPU run (8 rows of 1,024 tokens, Llama 3.1's 128,256 ids, hidden 64), and a
device's share of the reference (1 row of 8,192 tokens, hidden 256: the reference's 4,096 makes the
head's matmuls the whole cost and minutes per step on a CPU; the memory does not depend on it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = ["8x1024x128256x64", "1x8192x128256x256"]
FORMS = ("blockwise", "one-hot")


def worker(case: str, form: str, steps: int, xla: bool) -> dict:
    """One process's measurement: {"seconds": [wall per step], "cpu": [process CPU seconds per step],
    "peak_bytes": the steps' high-water mark over the baseline}."""
    import resource
    import time

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from harness.nn.cross_entropy import token_cross_entropy

    class OneDevice:
        def shards(self, dim: str) -> int:
            return 1

        def place(self, t, dims):
            return t

    b, s, v, m = (int(n) for n in case.split("x"))
    x = tf.random.stateless_normal([b, s, m], [1, 2])
    w = tf.random.stateless_normal([m, v], [3, 4]) * 0.02
    targets = tf.random.stateless_uniform([b, s], [5, 6], maxval=v, dtype=tf.int32)

    def one_hot(x, w, t):
        z = tf.einsum("bsm,mv->bsv", x, w)
        return tf.reduce_logsumexp(z, -1) - tf.reduce_sum(z * tf.one_hot(t, v), -1)

    loss_fn = {"blockwise": lambda x, w, t: token_cross_entropy(OneDevice(), x, w, t), "one-hot": one_hot}[form]

    @tf.function(jit_compile=xla)
    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            loss = tf.reduce_mean(loss_fn(x, w, targets))
        dx, dw = tape.gradient(loss, [x, w])
        return loss, tf.reduce_sum(dx), tf.reduce_sum(dw)

    step.get_concrete_function(x, w)  # traced (and, under XLA, compiled at the first call) before the baseline
    base = _rss_bytes()
    seconds, cpu = [], []
    for _ in range(steps + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        [t.numpy() for t in step(x, w)]
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds[1:], "cpu": cpu[1:], "peak_bytes": max(0, peak - base)}


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def measure(case: str, form: str, steps: int, xla: bool) -> dict | None:
    """A fresh process's measurement, or None when it was killed (out of memory)."""
    args = [sys.executable, __file__, "--worker", case, form, str(steps)] + (["--xla"] if xla else [])
    p = subprocess.run(args, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        if p.returncode < 0 or p.returncode == 137:
            return None
        raise SystemExit(f"error: {case} {form} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    return json.loads(line[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="batch x seq x vocab x hidden, e.g. 8x1024x128256x64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--xla", action="store_true", help="compile the steps with XLA (jit_compile)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        case, form, steps = a.worker
        print("RESULT " + json.dumps(worker(case, form, int(steps), a.xla)), flush=True)
        return
    gib = 2.0 ** 30
    print(f"loss + gradients of the LM head, float32, {'XLA' if a.xla else 'no XLA'}, {a.rounds} rounds x "
          f"{a.steps} steps, {os.cpu_count()} CPUs")
    for case in a.case or CASES:
        runs: dict[str, list[dict | None]] = {f: [] for f in FORMS}
        for _ in range(a.rounds):
            for form in FORMS:
                runs[form].append(measure(case, form, a.steps, a.xla))
        row = {}
        for form, results in runs.items():
            done = [r for r in results if r]
            row[form] = (statistics.median(t for r in done for t in r["seconds"]) if done else None,
                         statistics.median(t for r in done for t in r["cpu"]) if done else None,
                         max(r["peak_bytes"] for r in done) / gib if done else None, len(results) - len(done))
        (t_new, c_new, m_new, _), (t_old, c_old, m_old, killed) = row["blockwise"], row["one-hot"]
        print(f"{case} (b x s x vocab x hidden)")
        for form, (t, cpu, mem, k) in row.items():
            text = f"  {form:>9}: " + (f"{t * 1e3:9.1f} ms/step ({cpu:6.2f} CPU s), peak {mem:6.2f} GiB"
                                       if t is not None else "-")
            print(text + (f", {k} of {a.rounds} runs killed (out of memory)" if k else ""))
        if t_new is not None and t_old is not None:
            print(f"  blockwise / one-hot: time {t_new / t_old:.2f} (CPU time {c_new / c_old:.2f}), "
                  f"peak memory {m_new / m_old:.3f}")
        elif killed:
            print("  blockwise / one-hot: the one-hot formulation did not fit this host")


if __name__ == "__main__":
    main()
