"""The harness's decoder train step against KerasHub's Llama (Keras 3 on TensorFlow) at the same shape, in one run.

Two long-lived worker processes, each driven round by round over a pipe so rounds alternate (harness round,
KerasHub round, repeat) without recompiling, and drift of the machine's speed hits both alike:
- the harness worker (this repository's virtualenv) builds the llama31_8b workload from
  configs/llama31_8b/smoke.yaml with the shape's overrides and runs its real compiled train loop
  (`CompiledSteps.train_loop`, fed by the workload's own input pipeline, synthetic rows);
- the KerasHub worker (a separate virtualenv, `--kerashub-python`; never install keras-hub into the
  harness's) builds `keras_hub.models.LlamaCausalLM` at the same shape and trains it with `fit` on random
  tokens, one in-memory batch repeated.
Both: float32, AdamW (the config's base learning rate, beta 0.9/0.95, epsilon 1e-5, weight decay 0.1, global
clip 1.0), next-token cross-entropy, no dropout, no rematerialization, untied embeddings; XLA off and on
(runtime.jit_compile against compile(jit_compile=...)). Parameter counts must be equal or no ratio is printed.
Per round: tokens per second (wall) and tokens per CPU second (the worker's process CPU time); the table
shows medians and the median of per-round ratios harness/KerasHub.

Shapes: `smoke` = configs/llama31_8b/smoke.yaml's (hidden 64, 2 layers, 4 query / 2 key-value heads, head
dim 16, feed-forward 128, vocab 64, seq 256, batch 8); `wide` = hidden 256, 4 layers, 4 query / 2 key-value
heads, head dim 64, feed-forward 768, vocab 32,000, seq 512, batch 4.

    python scripts/bench_lm_step.py --kerashub-python PATH/TO/kerashub/bin/python \\
        [--shapes smoke wide] [--xla off on] [--rounds 5] [--seconds 3]
    python scripts/bench_lm_step.py --attention [--shapes smoke wide] [--rounds 7]

`--attention` (no KerasHub needed) times the attention alone, forward and backward of a sum of squares under
XLA, in three formulations of the same numbers, rounds alternating, per CPU second of this process: the
shipped XLA one (`benchmarks/lm/attention.py`, keys and values broadcast over the query groups), grouped
einsums that never copy the keys and values (queries [b, c, kv, g, d] against keys [b, keys, kv, d]), and the
shipped TensorFlow-kernel one (batched matmuls over [b, kv]) compiled by XLA too. It prints each one's time
over the shipped XLA one's (> 1: slower than it) and the largest difference of their gradients.

The KerasHub virtualenv and measured numbers: docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SHAPES = {
    "smoke": dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=64, seq=256, batch=8),
    "wide": dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, ffn=768, vocab=32000, seq=512, batch=4),
}
LEARNING_RATE = 0.004  # configs/llama31_8b/smoke.yaml's base learning rate
ADAMW = dict(beta_1=0.9, beta_2=0.95, epsilon=1e-5, weight_decay=0.1, clip_norm=1.0)


# ------------------------------------------------------------------------------------------ workers

class HarnessSide:
    """The llama31_8b workload through the harness's config, runtime and compiled train loop."""

    def __init__(self, shape: dict, xla: bool) -> None:
        sys.path.insert(0, REPO)
        import tensorflow as tf

        from benchmarks import registry
        from harness import config as config_lib
        from harness.runtime import make_runtime
        from harness.train.loop import CompiledSteps, train_input

        s = shape
        overrides = [
            f"model.hidden_size={s['hidden']}", f"model.num_layers={s['layers']}", f"model.num_heads={s['heads']}",
            f"model.num_kv_heads={s['kv_heads']}", f"model.head_dim={s['head_dim']}",
            f"model.ffn_hidden={s['ffn']}", f"model.vocab_size={s['vocab']}", f"data.seq_length={s['seq']}",
            f"schedule.global_batch_size={s['batch']}", "model.remat=false", "runtime.precision=float32",
            "runtime.kind=default", f"runtime.jit_compile={str(xla).lower()}",
            f"optimizer.base_learning_rate={LEARNING_RATE}", f"optimizer.beta_1={ADAMW['beta_1']}",
            f"optimizer.beta_2={ADAMW['beta_2']}", f"optimizer.epsilon={ADAMW['epsilon']}",
            f"optimizer.weight_decay={ADAMW['weight_decay']}", f"optimizer.clip_norm={ADAMW['clip_norm']}",
        ]
        cfg = config_lib.load_config(os.path.join(REPO, "configs", "llama31_8b", "smoke.yaml"), overrides)
        self.runtime = make_runtime(cfg.runtime)
        self.workload = registry.get(cfg.workload)(cfg, self.runtime)
        self.workload.validate_config()
        with self.runtime.scope():
            self.workload.build()
        self.tf = tf
        self.compiled = CompiledSteps(self.runtime, self.workload)
        self.iterator = iter(train_input(self.runtime, self.workload, s["batch"], cfg.seed))
        self.params = int(sum(p.variable.shape.num_elements() for p in self.workload.optimizer.params))

    def run(self, steps: int) -> float:
        return float(self.compiled.train_loop(self.iterator, self.tf.constant(steps))["loss"])


class KerasHubSide:
    """keras_hub.models.LlamaCausalLM at the same shape, trained with `fit` on random tokens."""

    def __init__(self, shape: dict, xla: bool) -> None:
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
        import keras
        import keras_hub
        import numpy as np
        import tensorflow as tf

        s = shape
        if s["hidden"] != s["heads"] * s["head_dim"]:
            raise SystemExit("KerasHub's Llama has head dim = hidden / query heads")
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=s["vocab"], num_layers=s["layers"], num_query_heads=s["heads"],
            hidden_dim=s["hidden"], intermediate_dim=s["ffn"], num_key_value_heads=s["kv_heads"],
            rope_max_wavelength=500000, layer_norm_epsilon=1e-5, dropout=0.0, tie_word_embeddings=False,
            dtype="float32")
        self.model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
        optimizer = keras.optimizers.AdamW(learning_rate=LEARNING_RATE, weight_decay=ADAMW["weight_decay"],
                                           beta_1=ADAMW["beta_1"], beta_2=ADAMW["beta_2"],
                                           epsilon=ADAMW["epsilon"], global_clipnorm=ADAMW["clip_norm"])
        self.model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           weighted_metrics=[], jit_compile=xla)
        tokens = np.random.default_rng(0).integers(0, s["vocab"], [s["batch"], s["seq"] + 1]).astype(np.int32)
        x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones([s["batch"], s["seq"]], np.int32)}
        self.data = tf.data.Dataset.from_tensors((x, tokens[:, 1:])).repeat()
        self.params = int(self.model.count_params())

    def run(self, steps: int) -> float:
        history = self.model.fit(self.data, steps_per_epoch=steps, epochs=1, verbose=0)
        return float(history.history["loss"][-1])


def worker(side: str, shape: str, xla: bool) -> None:
    """Answers the driver over stdin/stdout, one JSON line per request: {"steps": n} runs n train steps
    and returns the wall and process CPU seconds they took; an empty line ends the worker."""
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter must not reach the protocol pipe
    model = (HarnessSide if side == "harness" else KerasHubSide)(SHAPES[shape], xla)
    print(json.dumps({"params": model.params}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        steps = json.loads(line)["steps"]
        wall, cpu = time.perf_counter(), time.process_time()
        loss = model.run(steps)
        print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "loss": loss}),
              file=out, flush=True)


# ------------------------------------------------------------------------------------------ attention

def grouped_attention(q, k, v, bias):
    """Softmax attention as `attention._attend` computes it, by einsums over the query groups: q [b, c, kv, g,
    d], k/v [b, keys, kv, d], `bias` [c, keys]; no copy of the keys and values per group."""
    import tensorflow as tf

    b, c, kv, g, d = q.shape
    keys = k.shape[1]
    scores = tf.reshape(tf.einsum("bqhgd,bkhd->bhgqk", q, k), [b, kv * g, c, keys])
    probs = tf.nn.softmax(tf.cast(scores, tf.float32) * d ** -0.5 + bias, axis=-1)
    return tf.einsum("bhgqk,bkhd->bqhgd", tf.reshape(tf.cast(probs, v.dtype), [b, kv, g, c, keys]), v)


def attention_ab(shape: str, rounds: int) -> None:
    sys.path.insert(0, REPO)
    import tensorflow as tf

    from benchmarks.lm import attention

    s = SHAPES[shape]
    b, seq, kv, d = s["batch"], s["seq"], s["kv_heads"], s["head_dim"]
    g = s["heads"] // kv
    q = tf.random.stateless_normal([b, seq, kv, g, d], [1, 2])
    k, v = (tf.random.stateless_normal([b, seq, kv, d], [i, 3]) for i in (1, 2))
    bias = attention.causal_bias(0, seq, seq)
    forms = {"shipped XLA (k/v broadcast)": lambda q, k, v: attention._attend(q, k, v, bias, True),
             "grouped einsums": lambda q, k, v: grouped_attention(q, k, v, bias),
             "TensorFlow-kernel form": lambda q, k, v: attention._attend(q, k, v, bias, False)}

    def compiled(fn):
        @tf.function(jit_compile=True)
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = fn(q, k, v)
                loss = tf.reduce_sum(out * out)
            return tape.gradient(loss, [q, k, v])
        return step

    steps = {name: compiled(fn) for name, fn in forms.items()}
    grads = {name: step(q, k, v) for name, step in steps.items()}
    first = next(iter(forms))
    n = max(2, round(2.0 / max(1e-3, _cpu(steps[first], q, k, v, 2) / 2)))
    times: dict = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(_cpu(step, q, k, v, n))
    for name in steps:
        ratio = statistics.median(t / f for t, f in zip(times[name], times[first]))
        diff = max(float(tf.reduce_max(tf.abs(a - c))) for a, c in zip(grads[name], grads[first]))
        print(f"{shape:6} {name:<28} CPU time / shipped XLA's {ratio:6.3f}  (gradients differ by {diff:.2g})")


def _cpu(step, q, k, v, n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        out = step(q, k, v)
    out[0].numpy()
    return time.process_time() - t


# ------------------------------------------------------------------------------------------- driver

class Worker:
    def __init__(self, python: str, side: str, shape: str, xla: bool) -> None:
        cmd = [python, os.path.abspath(__file__), "--worker", side, "--shape", shape, "--jit", str(int(xla))]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        self.side = side
        self.params = self._read()["params"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"error: the {self.side} worker died (its stderr is above)")
        return json.loads(line)

    def round(self, steps: int) -> dict:
        self.proc.stdin.write(json.dumps({"steps": steps}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait()


def compare(pythons: dict, shape: str, xla: bool, rounds: int, seconds: float) -> dict:
    """Rates per round of both sides at one shape and XLA setting, rounds alternating."""
    s = SHAPES[shape]
    tokens_per_step = s["batch"] * s["seq"]
    workers = {side: Worker(pythons[side], side, shape, xla) for side in ("harness", "kerashub")}
    try:
        if workers["harness"].params != workers["kerashub"].params:
            return {"params": {k: w.params for k, w in workers.items()}}
        # Compile and warm, then size the rounds to about `seconds` of the slower side.
        for w in workers.values():
            w.round(2)
        per_step = max(w.round(2)["wall"] / 2 for w in workers.values())
        steps = max(2, round(seconds / per_step))
        rates: dict = {side: {"wall": [], "cpu": []} for side in workers}
        for _ in range(rounds):
            for side, w in workers.items():
                r = w.round(steps)
                rates[side]["wall"].append(steps * tokens_per_step / r["wall"])
                rates[side]["cpu"].append(steps * tokens_per_step / r["cpu"])
        return {"params": workers["harness"].params, "steps": steps, "rates": rates}
    finally:
        for w in workers.values():
            w.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kerashub-python", default=os.environ.get("KERASHUB_PYTHON", ""),
                   help="python of the virtualenv with keras-hub (default: $KERASHUB_PYTHON; docs/performance.md)")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["smoke", "wide"])
    p.add_argument("--xla", nargs="+", choices=["off", "on"], default=["off", "on"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=3.0, help="about this long per timed round")
    p.add_argument("--attention", action="store_true", help="time the attention's formulations alone under XLA")
    p.add_argument("--worker", choices=["harness", "kerashub"], help=argparse.SUPPRESS)
    p.add_argument("--shape", choices=sorted(SHAPES), help=argparse.SUPPRESS)
    p.add_argument("--jit", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.shape, bool(a.jit))
        return
    if a.attention:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for shape in a.shapes:
            attention_ab(shape, a.rounds)
        return
    if not a.kerashub_python or not os.path.exists(a.kerashub_python):
        raise SystemExit(f"error: no KerasHub python at {a.kerashub_python!r}: create its virtualenv as "
                         "docs/performance.md shows and pass --kerashub-python (or set KERASHUB_PYTHON)")
    pythons = {"harness": sys.executable, "kerashub": a.kerashub_python}
    print(f"{'shape':6} {'XLA':4} {'params':>10} {'harness tok/s':>14} {'KerasHub tok/s':>15} {'ratio':>6} "
          f"{'harness tok/CPU-s':>18} {'KerasHub tok/CPU-s':>19} {'ratio':>6}")
    xla_rates: dict = {}
    for shape in a.shapes:
        for mode in a.xla:
            r = compare(pythons, shape, mode == "on", a.rounds, a.seconds)
            if "rates" not in r:
                print(f"{shape:6} {mode:4} parameter counts differ: {r['params']}; no ratio")
                continue
            h, k = r["rates"]["harness"], r["rates"]["kerashub"]
            ratio = {m: statistics.median(x / y for x, y in zip(h[m], k[m])) for m in ("wall", "cpu")}
            xla_rates[shape, mode] = {(side, m): statistics.median(r["rates"][side][m])
                                      for side in ("harness", "kerashub") for m in ("wall", "cpu")}
            print(f"{shape:6} {mode:4} {r['params']:>10,} {statistics.median(h['wall']):>14,.0f} "
                  f"{statistics.median(k['wall']):>15,.0f} {ratio['wall']:>6.3f} "
                  f"{statistics.median(h['cpu']):>18,.0f} {statistics.median(k['cpu']):>19,.0f} "
                  f"{ratio['cpu']:>6.3f}", flush=True)
    for shape in a.shapes:
        if (shape, "on") in xla_rates and (shape, "off") in xla_rates:
            on, off = xla_rates[shape, "on"], xla_rates[shape, "off"]
            x = {k: on[k] / off[k] for k in on}
            print(f"{shape}: XLA on / off (> 1: XLA faster; medians of separate runs, not paired): "
                  f"harness {x['harness', 'wall']:.3f} (per CPU second {x['harness', 'cpu']:.3f}), "
                  f"KerasHub {x['kerashub', 'wall']:.3f} (per CPU second {x['kerashub', 'cpu']:.3f})")
    print("ratio: median of per-round ratios harness / KerasHub (rounds alternate); >= 1: the harness is faster")


if __name__ == "__main__":
    main()
