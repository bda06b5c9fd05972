"""Writes tests/data/rcp_pilots/: public MLPerf result sets trimmed to the lines the RCP reader reads.

Usage: python scripts/make_rcp_pilots.py GIT_DIR [COMMIT]
GIT_DIR: a clone (or bare mirror) of github.com/mlcommons/training_results_v4.0; COMMIT defaults to HEAD.

The RCP reader of mlperf-logging (`rcp_checker.read_submission_file`) looks at MLLOG lines holding one of
READER_KEYS; every other line is dropped, so the committed logs stay small. The script checks that the
reader gets the same (converged, samples, batch, benchmark) from each trimmed log as from the full one,
and writes a README naming the source of every set.
"""
from __future__ import annotations

import os
import logging
import subprocess
import sys
import tempfile

from mlperf_logging.rcp_checker import rcp_checker as official

# (directory under tests/data/rcp_pilots, path in the repository, ruleset of the round)
SETS = [
    ("nvidia_eos_n128_llama2_70b_lora", "NVIDIA/results/eos_n128_ngc24.04_nemo/llama2_70b_lora", "4.0.0"),
    ("nvidia_eos_n8_bert", "NVIDIA/results/eos_n8_ngc23.04_pytorch/bert", "4.0.0"),
]
READER_KEYS = ("submission_benchmark", "global_batch_size", "eval_accuracy", "eval_error", "train_samples",
               "run_stop")
REPO = "mlcommons/training_results_v4.0"
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "rcp_pilots")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True, encoding="latin-1").stdout


def trim(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True)
                   if ":::MLLOG" in line and any(k in line for k in READER_KEYS))


def read(text: str, ruleset: str) -> tuple:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="latin-1") as f:
        f.write(text)
        f.flush()
        return official.read_submission_file(f.name, ruleset, False)


def main(git_dir: str, commit: str = "HEAD") -> None:
    logging.disable(logging.WARNING)  # the reader warns about each non-converged run on the root logger
    if os.path.isdir(os.path.join(git_dir, ".git")):
        git_dir = os.path.join(git_dir, ".git")
    commit = git(git_dir, "rev-parse", commit).strip()
    readme = ["# Public result sets for the RCP preflight tests", "",
              "Written by `scripts/make_rcp_pilots.py` from the public MLPerf Training v4.0 results. Each log keeps",
              "only the MLLOG lines holding a key mlperf-logging's RCP reader reads:",
              f"{', '.join(READER_KEYS)}.",
              "The script checks that the reader gets the same result from the trimmed log as from the full one.",
              "File names are the originals.", "",
              "| directory | source (repository, path, commit) | ruleset |", "| --- | --- | --- |"]
    for name, path, ruleset in SETS:
        files = sorted(f for f in git(git_dir, "ls-tree", "--name-only", f"{commit}:{path}").split()
                       if f.startswith("result_") and f.endswith(".txt"))
        os.makedirs(os.path.join(OUT, name), exist_ok=True)
        for f in files:
            full = git(git_dir, "show", f"{commit}:{path}/{f}")
            short = trim(full)
            assert read(short, ruleset) == read(full, ruleset), f"{path}/{f}: trimming changed what the reader reads"
            with open(os.path.join(OUT, name, f), "w", encoding="latin-1") as out:
                out.write(short)
        readme.append(f"| `{name}/` | {REPO}, `{path}/result_*.txt`, {commit} | {ruleset} |")
        print(f"{name}: {len(files)} logs from {path}")
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("\n".join(readme) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
