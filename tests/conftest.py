"""Shared helpers: run the CLI in a subprocess (device setup is per process) and read its outputs."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, "configs", "resnet", "smoke.yaml")


def harness_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *args]


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return subprocess.run(harness_cmd(*args), cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """The CLI's dispatch in this process, for refusals that stop before a run (no device set up, no
    TensorFlow start per call): the same one `error:` line and exit code a subprocess would give."""
    import contextlib
    import io

    from absl import flags

    from harness import cli

    out, err = io.StringIO(), io.StringIO()
    flags.FLAGS.unparse_flags()  # every flag back to its default, as in a fresh process
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.dispatch(flags.FLAGS(["mlperf-harness", *args]))
    finally:
        flags.FLAGS.unparse_flags()
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def sets(**kv) -> list[str]:
    """--set flags from keyword args, '__' standing for '.' (schedule__max_epochs=1)."""
    out = []
    for k, v in kv.items():
        out += ["--set", f"{k.replace('__', '.')}={v}"]
    return out


def run_dir(output_dir: str, workload: str = "resnet") -> str:
    dirs = sorted(glob.glob(os.path.join(output_dir, workload, "*")))
    assert len(dirs) == 1, dirs
    return dirs[0]


def read_summary(output_dir: str, workload: str = "resnet") -> dict:
    with open(os.path.join(run_dir(output_dir, workload), "summary.json")) as f:
        return json.load(f)


def stderr_error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def pytest_configure(config):
    config.addinivalue_line("markers", "step_cases(onednn, name=None): the test reads tests/step_cases.py's "
                            "results in these oneDNN modes, for its `name` parameter or the workload `name`")


def pytest_collection_finish(session):
    """Tells tests/step_cases.py which workloads the selected tests read (after -k/-m deselection), so each
    oneDNN mode's step cases run in one process."""
    import step_cases

    for item in session.items:
        mark = item.get_closest_marker("step_cases")
        if mark is None:
            continue
        callspec = getattr(item, "callspec", None)
        name = mark.kwargs.get("name") or (callspec.params["name"] if callspec else None)
        assert name, f"{item.nodeid}: a step_cases mark needs a workload (name= or a `name` parameter)"
        step_cases.plan(name, tuple(mark.kwargs["onednn"]))


@pytest.fixture
def tmp_out(tmp_path):
    return str(tmp_path / "runs")
