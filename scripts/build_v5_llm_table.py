"""Builds scripts/data/mlperf-llm-v5.0.csv, the LLM rows scripts/validate_plan.py checks `plan` on, from the
public MLPerf Training v5.0 results (github.com/mlcommons/training_results_v5.0, commit 0fdc28f):
`<submitter>/results/<system>/<benchmark>/result_N.txt` joined to `<submitter>/systems/<system>.json`
(number_of_nodes x accelerators_per_node = chips). Benchmarks: llama2_70b_lora (v5.0 has no llama31_8b;
llama31_405b's few systems are at one scale each).

Per system: the olympic mean of the run times (run_stop - run_start; the fastest and slowest successful run
dropped, as the v5.0 results summarizer scores), the mean samples to converge (`samples_count` of the last
eval), the logged global batch, the mean eval interval (eval_start -> eval_stop, synchronous in every
llama2_70b_lora log) and evals per run, and the median training step: (run time - its evals) / (samples /
global batch).

    python scripts/build_v5_llm_table.py REPO   # a clone (or bare mirror) of training_results_v5.0
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.review import logparse  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mlperf-llm-v5.0.csv")
BENCHMARKS = ("llama2_70b_lora", "llama31_8b")
COLUMNS = ("round", "submitter", "system", "benchmark", "accelerator", "chips", "global_batch", "runs",
           "olympic_minutes", "mean_samples", "step_seconds", "eval_seconds", "evals_per_run")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def summarize(paths: list[str]) -> dict | None:
    runs = []
    for path in paths:
        events = logparse.parse_log(path)
        s = logparse.summarize(events, path)
        if not s.succeeded or s.run_stop_ms is None or not s.global_batch_size:
            runs.append(None)
            continue
        evals = logparse.match_intervals(events, "eval_start", "eval_stop", ("samples_count", "epoch_num"))
        eval_s = [(b.time_ms - a.time_ms) / 1000.0 for a, b in evals]
        run_s = (s.run_stop_ms - s.run_start_ms) / 1000.0
        samples = s.epochs_or_samples_to_converge
        runs.append((run_s, samples, s.global_batch_size, eval_s))
    ok = [r for r in runs if r is not None]
    if len(ok) < 3 or len(runs) - len(ok) > 1:
        return None
    times = sorted(r[0] for r in ok) + ([float("inf")] if len(ok) < len(runs) else [])
    olympic = statistics.mean(times[1:-1])
    evals = [e for r in ok for e in r[3]]
    return {"global_batch": ok[0][2], "runs": len(ok), "olympic_minutes": round(olympic / 60.0, 4),
            "mean_samples": round(statistics.mean(r[1] for r in ok), 1),
            "step_seconds": round(statistics.median((r[0] - sum(r[3])) / (r[1] / r[2]) for r in ok), 5),
            "eval_seconds": round(statistics.mean(evals), 4) if evals else "",
            "evals_per_run": round(statistics.mean(len(r[3]) for r in ok), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", help="a clone or bare mirror of mlcommons/training_results_v5.0")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    files = git(args.repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    systems: dict[tuple[str, str, str], list[str]] = {}
    for f in files:
        parts = f.split("/")
        if len(parts) == 5 and parts[1] == "results" and parts[3] in BENCHMARKS and parts[4].startswith("result_"):
            systems.setdefault((parts[0], parts[2], parts[3]), []).append(f)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (submitter, system, bench), logs in sorted(systems.items()):
            desc = json.loads(git(args.repo, "show", f"HEAD:{submitter}/systems/{system}.json"))
            chips = int(desc["number_of_nodes"]) * int(desc["accelerators_per_node"])
            paths = []
            for i, f in enumerate(sorted(logs)):
                path = os.path.join(tmp, f"{i}.txt")
                with open(path, "w") as out:
                    out.write(git(args.repo, "show", f"HEAD:{f}"))
                paths.append(path)
            s = summarize(paths)
            if s is None:
                print(f"skipped: {submitter} {system} {bench}: fewer than 3 successful runs")
                continue
            rows.append({"round": "v5.0", "submitter": submitter, "system": system, "benchmark": bench,
                         "accelerator": desc["accelerator_model_name"], "chips": chips, **s})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} rows: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
