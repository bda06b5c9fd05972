"""The submission tree `package` writes (the layout mlperf_logging.package_checker reads):

    <out>/<org>/systems/<system>.json
    <out>/<org>/benchmarks/<benchmark>/implementations/<impl>/
        README.md, run_and_time.sh, config.yaml, requirements.txt   (what the runs ran, no local path)
        mlperf-harness/   the harness's source at the runs' commit (`git archive`), with a dirty tree's
                          recorded changes applied and kept beside it as harness_changes.diff
    <out>/<org>/results/<system>/<benchmark>/result_<i>.txt        (the submitted window, launch order)

MLPerf submissions ship their implementation's source; a README naming a commit, or a script with the
submitter's own data path in it, cannot be rerun by a reviewer.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from typing import Any

import yaml

from harness import sysinfo
from harness.errors import HarnessError
from harness.submission.runs import Run, names

SOURCE_DIR = "mlperf-harness"
# What a config value that names a local file or folder looks like: it is blanked in the packaged config.
LOCAL_PATH = re.compile(r"^(/|~|\$|\.\.?/)|^[A-Za-z]:\\")

RUN_AND_TIME = """#!/usr/bin/env bash
# Reproduces one {benchmark} result of this package with the mlperf-harness source packaged beside this script
# (commit {commit}).
# usage: ./run_and_time.sh SEED DATA_DIR [OUTPUT_DIR] [--set key=value ...]
#   SEED        the run's seed (this package's results used {seeds})
#   DATA_DIR    the dataset folder (see README.md for where the data comes from)
#   OUTPUT_DIR  where the run writes <workload>/<run_id>/ (default: logs)
#   --set       further config overrides; the packaged config left these local paths blank: {blanked}
# Needs Python with the packaged requirements: pip install -r requirements.txt
set -uo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
SEED="${{1:?usage: run_and_time.sh SEED DATA_DIR [OUTPUT_DIR] [--set key=value ...]}}"
DATA_DIR="${{2:?usage: run_and_time.sh SEED DATA_DIR [OUTPUT_DIR] [--set key=value ...]}}"
OUTPUT_DIR="${{3:-logs}}"
shift $(( $# < 3 ? $# : 3 ))
PYTHON="${{PYTHON:-python3}}"
export PYTHONPATH="$HERE/{source}${{PYTHONPATH:+:$PYTHONPATH}}"
start=$(date +%s)
echo "STARTING TIMING RUN AT $(date)"
"$PYTHON" -m harness run "$HERE/config.yaml" --set seed="$SEED" {data_flag}\\
    --set run_id="seed${{SEED}}-$(date +%Y%m%d-%H%M%S)" --output_dir "$OUTPUT_DIR" "$@"
rc=$?
end=$(date +%s)
echo "ENDING TIMING RUN AT $(date)"
echo "RESULT,{benchmark},$SEED,$((end - start)),${{USER:-unknown}},$(date)"
exit $rc
"""


def safe_name(value: str, what: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", value or ""):
        raise HarnessError(f"{what} {value!r} cannot be a directory name in the submission tree; "
                           f"use letters, digits, '.', '_', '+' or '-'")
    return value


def _one(runs: list[Run], what: str, get: Any) -> Any:
    values: dict[Any, list[Run]] = {}
    for r in runs:
        values.setdefault(get(r), []).append(r)
    if len(values) > 1:
        listing = "; ".join(f"{str(v)[:60]!r}: {names(rs, 1)}" for v, rs in values.items())
        raise HarnessError(f"refusing to package: the runs ran different {what} ({listing}); a result set is "
                           f"one implementation")
    return next(iter(values))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def implementation(runs: list[Run]) -> dict[str, Any]:
    """What the runs ran, which they must share: harness commit, uncommitted changes, pinned requirements."""
    commit = _one(runs, "harness commits", lambda r: (r.run_json or {}).get("harness_commit"))
    if not commit:
        raise HarnessError(f"refusing to package: {names(runs, 1)} recorded no harness commit (run outside a git "
                           f"checkout): the package must carry the source the runs ran")
    changes = _one(runs, "uncommitted changes",
                   lambda r: _read(os.path.join(os.path.dirname(r.log), "harness_changes.diff")) or "")
    dirty = _one(runs, "tree states", lambda r: bool((r.run_json or {}).get("harness_dirty")))
    if dirty and not changes:
        raise HarnessError(f"refusing to package: {names(runs, 1)} ran on a dirty harness tree but its "
                           f"harness_changes.diff is missing: the source that ran cannot be packaged")
    requirements = _one(runs, "Python environments",
                        lambda r: _read(os.path.join(os.path.dirname(r.log), "requirements.txt")))
    if requirements is None:
        raise HarnessError(f"refusing to package: {names(runs, 1)} has no requirements.txt beside its log (written "
                           f"by runs of this harness version): the package must pin the environment")
    return {"commit": commit, "changes": changes, "requirements": requirements}


def write_source(impl_dir: str, commit: str, changes: str) -> str:
    """The harness's source at `commit` (plus `changes`) into <impl_dir>/mlperf-harness; returns that path."""
    dest = os.path.join(impl_dir, SOURCE_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "source.tar")
        try:
            proc = subprocess.run(["git", "-C", sysinfo.REPO_ROOT, "archive", "--format=tar", "-o", archive, commit],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            raise HarnessError(f"refusing to package: cannot archive the harness source at {commit}: {e}") from None
        if proc.returncode != 0:
            raise HarnessError(f"refusing to package: the runs' harness commit {commit[:12]} is not in "
                               f"{sysinfo.REPO_ROOT} ({proc.stderr.strip().splitlines()[-1] if proc.stderr else 'git'}"
                               f"); package from the checkout that ran them")
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    if not changes:  # a rerun from the packaged source (no git checkout) records the commit it is
        with open(os.path.join(dest, sysinfo.COMMIT_FILE), "w") as f:
            f.write(commit + "\n")
    if changes:
        with open(os.path.join(impl_dir, "harness_changes.diff"), "w") as f:
            f.write(changes)
        proc = subprocess.run(["git", "apply", "--whitespace=nowarn", os.path.join(impl_dir, "harness_changes.diff")],
                              cwd=dest, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise HarnessError(f"refusing to package: the runs' recorded uncommitted changes do not apply to commit "
                               f"{commit[:12]}: {proc.stderr.strip()[:200]}")
    return dest


def packaged_config(config: dict) -> tuple[dict, list[str]]:
    """The runs' config with run-specific values reset and every local path blanked; the blanked keys."""
    config = json.loads(json.dumps(config))
    config.update(run_id="", output_dir="logs")
    blanked: list[str] = []

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, str) and LOCAL_PATH.search(value):
                node[key] = ""
                blanked.append(f"{prefix}{key}")
    walk(config, "")
    return config, blanked


def _readme(benchmark: str, impl: str, runs: list[Run], ruleset: str, info: dict, blanked: list[str],
            selection_why: str) -> str:
    s = runs[0].summary
    seeds = ", ".join(str(r.summary.seed) for r in runs)
    dirty = (" The runs ran a tree with uncommitted changes: `harness_changes.diff` holds them, and they are "
             "applied to the packaged source.") if info["changes"] else ""
    lines = [
        f"# {benchmark}: {impl}",
        "",
        f"Trained with mlperf-harness (TensorFlow 2) at commit {info['commit']}; its source is in `{SOURCE_DIR}/`."
        + dirty,
        f"Ruleset {ruleset}, {s.division} division, global batch size {s.global_batch_size}, {len(runs)} runs "
        f"with seeds {seeds} (launch order).",
        f"Runs submitted: {selection_why}.",
        "",
        "## Files",
        "- `config.yaml`: the resolved run config (every run used it; only `seed`, `run_id` and paths differ).",
        "- `requirements.txt`: the Python packages installed where the runs trained (pinned).",
        "- `run_and_time.sh SEED DATA_DIR [OUTPUT_DIR] [--set key=value ...]`: reproduces one run with the",
        "  packaged source and prints a `RESULT,...` line.",
        f"- `{SOURCE_DIR}/`: the harness's source; `docs/workloads/{benchmark}.md` there says where the data and "
        "checkpoint come from.",
    ]
    if blanked:
        lines += ["", f"Local paths blanked in config.yaml (give them with `--set KEY=PATH`): {', '.join(blanked)}."]
    data_sources = {r.data_source for r in runs if r.data_source}
    if data_sources:
        lines += ["", f"Data source logged by the runs: {', '.join(sorted(data_sources))}."]
    return "\n".join(lines) + "\n"


def write_tree(runs: list[Run], out_dir: str, org: str, system: str, benchmark: str, impl: str, ruleset: str,
               system_desc: dict[str, str], info: dict, selection_why: str) -> dict[str, str]:
    """Writes the submission tree for `runs` (launch order); returns {packaged result file: source log}."""
    org_dir = os.path.join(out_dir, org)
    systems = os.path.join(org_dir, "systems")
    impl_dir = os.path.join(org_dir, "benchmarks", benchmark, "implementations", impl)
    results = os.path.join(org_dir, "results", system, benchmark)
    for d in (systems, impl_dir, results):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(systems, f"{system}.json"), "w") as f:
        json.dump(system_desc, f, indent=4)
        f.write("\n")

    mapping = {}
    for i, r in enumerate(runs):
        target = os.path.join(results, f"result_{i}.txt")
        shutil.copyfile(r.log, target)
        mapping[target] = os.path.abspath(r.log)

    write_source(impl_dir, info["commit"], info["changes"])
    with open(os.path.join(impl_dir, "requirements.txt"), "w") as f:
        f.write(info["requirements"])
    config, blanked = packaged_config(next((r.config for r in runs if r.config), None) or {})
    if config:
        with open(os.path.join(impl_dir, "config.yaml"), "w") as f:
            f.write(f"# Resolved config of this result set (mlperf-harness {info['commit']}); run_and_time.sh "
                    f"sets seed, run_id and data.data_dir per run.\n")
            yaml.safe_dump(config, f, sort_keys=False)
    has_data_dir = "data_dir" in (config.get("data") or {})
    script = RUN_AND_TIME.format(
        benchmark=benchmark, commit=info["commit"], seeds=", ".join(str(r.summary.seed) for r in runs),
        source=SOURCE_DIR, blanked=", ".join(k for k in blanked if k != "data.data_dir") or "none",
        data_flag='--set data.data_dir="$DATA_DIR" ' if has_data_dir else "")
    script_path = os.path.join(impl_dir, "run_and_time.sh")
    with open(script_path, "w") as f:
        f.write(script)
    os.chmod(script_path, 0o755)
    with open(os.path.join(impl_dir, "README.md"), "w") as f:
        f.write(_readme(benchmark, impl, runs, ruleset, info, blanked, selection_why))
    return mapping
