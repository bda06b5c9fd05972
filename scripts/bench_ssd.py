"""SSD in one process: training images/s of the harness loop against a bare tf.function step of the same
model, then a real run of the config and the eval's share of its time to train.

Training reuses bench_loop_overhead (rounds alternate, headline = median of paired ratios). The share comes
from the run's own MLPerf log: the summed eval_start -> eval_stop intervals (device NMS, gather, COCOeval on
the chief) over run_start -> run_stop.

    python scripts/bench_ssd.py [CONFIG] [--set key=value ...] [--rounds 3] [--steps 20]
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from harness.review import logparse  # noqa: E402
from harness.train.run import execute  # noqa: E402
from scripts.bench_loop_overhead import measure  # noqa: E402


def eval_share(log_path: str) -> tuple[float, float, int]:
    """(eval seconds, run seconds, evals) from one result log."""
    events = logparse.parse_log(log_path)
    start = next(e for e in events if e.key == "run_start")
    stop = next(e for e in events if e.key == "run_stop")
    evals = logparse.match_intervals(events, "eval_start", "eval_stop", ("epoch_num", "samples_count"))
    seconds = sum(b.time_ms - a.time_ms for a, b in evals) / 1000
    return seconds, (stop.time_ms - start.time_ms) / 1000, len(evals)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default="configs/ssd/smoke.yaml")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--jit", action="store_true", help="XLA on the per-replica steps (runtime.jit_compile=true); "
                   "the bare baseline is compiled the same way")
    a = p.parse_args()
    if a.jit:
        a.overrides.append("runtime.jit_compile=true")

    h, b, runtime, workload = measure(a.config, a.overrides, a.rounds, a.steps)
    paired = statistics.median(x / y for x, y in zip(h, b))
    data = "SYNTHETIC data" if workload.is_synthetic else f"{workload.data_source} data"
    m = workload.cfg.model
    print(f"config {a.config} {' '.join(a.overrides)} | {runtime.description} | {m.image_size} px, "
          f"{len(workload.anchors_xywh)} anchors, batch {workload.cfg.schedule.global_batch_size} | {data}")
    print(f"train harness loop : {statistics.median(h):8.1f} images/s  (rounds: {', '.join(f'{x:.0f}' for x in h)})")
    print(f"train bare step    : {statistics.median(b):8.1f} images/s  (rounds: {', '.join(f'{x:.0f}' for x in b)})")
    print(f"train ratio harness/bare = {paired:.3f} (median of per-round paired ratios)")

    with tempfile.TemporaryDirectory() as out:
        code = execute(a.config, a.overrides + [f"output_dir={out}"])
        log = glob.glob(os.path.join(out, "**", "result_*.txt"), recursive=True)[0]
        evals, total, n = eval_share(log)
    print(f"run exit {code}: {n} eval(s) took {evals:.1f} s of {total:.1f} s run_start->run_stop "
          f"= {evals / total:.1%} of time to train")


if __name__ == "__main__":
    main()
