"""`mlperf-harness check` on logs the harness did not write (public MLPerf v0.7 submissions)."""
from __future__ import annotations

import os

import pytest

from conftest import REPO, cli_in_process

pytestmark = pytest.mark.quick

SSD = os.path.join(REPO, "tests", "data", "public_v0.7", "Google", "results", "tpu-v3-8192-TF", "ssd")


def test_check_passes_official_checker_but_flags_corrupt_timestamps():
    proc = cli_in_process("check", os.path.join(SSD, "result_0.txt"), "--ruleset", "0.7.0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "official compliance checker, ruleset 0.7.0: PASS" in proc.stdout
    assert "integrity checks: FAIL" in proc.stdout
    assert "[run_start_before_init_stop]" in proc.stdout and "15.37 h" in proc.stdout


def test_check_clean_public_log_passes():
    proc = cli_in_process("check", os.path.join(SSD, "result_1.txt"), "--ruleset", "0.7.0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "integrity checks: PASS" in proc.stdout


def test_check_missing_file_is_a_clean_error():
    proc = cli_in_process("check", "/nonexistent/result_0.txt")
    assert proc.returncode == 2
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert "Traceback" not in proc.stderr
