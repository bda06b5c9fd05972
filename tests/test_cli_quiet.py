"""The CLI starts quiet: TensorFlow's native start-up lines only with --verbose / MLPERF_HARNESS_VERBOSE=1."""
from __future__ import annotations

from conftest import run_cli

NO_GPU = ["run", "configs/resnet/smoke.yaml", "--set", "runtime.kind=mirrored", "--set", "runtime.gpus=8"]


def _lines(proc) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def test_a_refused_run_prints_exactly_one_line():
    # TF_CPP_MIN_LOG_LEVEL=2 (run_cli sets it) does not silence TensorFlow's start-up lines: the CLI must.
    proc = run_cli(*NO_GPU, env={"MLPERF_HARNESS_VERBOSE": ""}, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = _lines(proc)
    assert len(lines) == 1 and lines[0].startswith("error: runtime.gpus=8 but TensorFlow sees no GPU"), lines


def test_verbose_shows_tensorflow_start_up_lines():
    # At TensorFlow's default log level (run_cli sets 2, which hides its info lines): with oneDNN off, as on
    # AVX2-only CPUs, nothing else is printed at import.
    proc = run_cli(*NO_GPU, "--verbose", env={"TF_CPP_MIN_LOG_LEVEL": "0"}, timeout=300)
    assert proc.returncode == 2
    lines = _lines(proc)
    # TensorFlow's C++ libraries announce themselves on import (cpu_feature_guard names the instructions
    # the wheel was not built for, AVX2 and FMA among them on every x86-64 here, after absl's pre-init
    # warning; with oneDNN on, its notice too); the harness's own error line is still the last.
    assert len(lines) > 1 and any("absl::InitializeLog" in l or "oneDNN" in l or "cpu_feature_guard" in l
                                  for l in lines), lines
    assert lines[-1].startswith("error: runtime.gpus=8"), lines
