"""Training samples/s of the smoke BERT on a 2x2 DTensor mesh versus data parallelism, on this machine.

Each variant runs in its own process (logical CPU devices are fixed at TensorFlow start-up), builds the
model, compiles and warms up, then times `--steps` training steps in compiled loops of `--loop` steps.
On a 2-core CPU, splitting into 4 logical devices adds overhead rather than speed: the figure measures
the cost of the mesh machinery, not a speed-up.

    python scripts/bench_mesh_vs_dp.py [--steps 60] [--loop 20]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "mesh 2x2 (data=2, model=2)": ["runtime.kind=mesh", "runtime.cpu_devices=4", "runtime.mesh={data: 2, model: 2}"],
    "mesh 4x1 (DTensor data parallel)": ["runtime.kind=mesh", "runtime.cpu_devices=4",
                                          "runtime.mesh={data: 4, model: 1}"],
    "mirrored x4 (tf.distribute data parallel)": ["runtime.kind=mirrored", "runtime.cpu_devices=4"],
    "default (one device)": ["runtime.kind=default", "runtime.cpu_devices=0"],
}


def measure(overrides: list[str], steps: int, loop_steps: int) -> dict:
    import tensorflow as tf

    from harness import config as config_lib
    from harness.train import loop
    from harness.runtime import make_runtime
    from benchmarks.bert.workload import BertWorkload

    cfg = config_lib.load_config(os.path.join(REPO, "configs", "bert", "smoke.yaml"),
                                 ["data.eval_samples=64"] + overrides)
    runtime = make_runtime(cfg.runtime)
    workload = BertWorkload(cfg, runtime)
    workload.validate()
    with runtime.scope():
        workload.build()
    compiled = loop.CompiledSteps(runtime, workload)
    gbs = cfg.schedule.global_batch_size
    iterator = iter(loop.train_input(runtime, workload, gbs, cfg.seed))
    float(compiled.train_loop(iterator, tf.constant(loop_steps))["loss"])  # compile + warm up
    t0 = time.perf_counter()
    done = 0
    while done < steps:
        float(compiled.train_loop(iterator, tf.constant(loop_steps))["loss"])
        done += loop_steps
    elapsed = time.perf_counter() - t0
    return {"samples_per_s": done * gbs / elapsed, "steps": done, "seconds": elapsed,
            "runtime": runtime.description}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--loop", type=int, default=20)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(measure(VARIANTS[args.variant], args.steps, args.loop)), flush=True)
        return
    results = {}
    for name in VARIANTS:
        proc = subprocess.run([sys.executable, __file__, "--variant", name, "--steps", str(args.steps),
                               "--loop", str(args.loop)], cwd=REPO, capture_output=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{name}: failed\n{proc.stderr[-2000:]}")
            continue
        results[name] = json.loads(lines[-1][len("RESULT "):])
        print(f"{name:45s} {results[name]['samples_per_s']:8.1f} samples/s  ({results[name]['runtime']})",
              flush=True)
    mesh = results.get("mesh 2x2 (data=2, model=2)")
    for base in ("mesh 4x1 (DTensor data parallel)", "mirrored x4 (tf.distribute data parallel)",
                 "default (one device)"):
        if mesh and base in results:
            print(f"mesh 2x2 / {base}: {mesh['samples_per_s'] / results[base]['samples_per_s']:.2f}x")


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    main()
