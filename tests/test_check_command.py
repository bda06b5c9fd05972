"""`mlperf-harness check` on logs the harness did not write (public MLPerf v0.7 submissions)."""
from __future__ import annotations

import os
import re

import pytest

from conftest import REPO, cli_in_process, run_cli

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


def _variant(tmp_path, name, edit):
    """A copy of the clean public result_1.txt (which passes every check) with `edit` applied to its lines."""
    with open(os.path.join(SSD, "result_1.txt")) as f:
        lines = f.read().splitlines(keepends=True)
    path = tmp_path / name
    path.write_text("".join(edit(lines)))
    return str(path)


def test_check_fails_a_second_run_stop_the_official_checker_only_warns_about(tmp_path):
    def twice(lines):
        stop = next(l for l in lines if '"key": "run_stop"' in l)
        return lines + [stop.replace('"time_ms": 1592634768245', '"time_ms": 1592634769245')]

    proc = cli_in_process("check", _variant(tmp_path, "two_stops.txt", twice), "--ruleset", "0.7.0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "official compliance checker, ruleset 0.7.0: PASS" in proc.stdout
    assert "error: [run_stop_repeated] 2 run_stop lines (lines 113, 120)" in proc.stdout


def test_check_fails_an_aborted_status_whose_eval_reached_the_target(tmp_path):
    def aborted(lines):
        return [l.replace('"status": "success"', '"status": "aborted"') for l in lines]

    proc = cli_in_process("check", _variant(tmp_path, "aborted.txt", aborted), "--ruleset", "0.7.0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "official compliance checker, ruleset 0.7.0: PASS" in proc.stdout
    assert ("error: [status_contradicts_evals] run_stop (line 113) says 'aborted' but eval_accuracy 0.2304 "
            "(line 111) reached the target >= 0.23") in proc.stdout


def checker_lines(stdout: str) -> list[str]:
    """What `check` printed under the official checker's FAIL verdict (one log, one ruleset)."""
    block = stdout.split(": FAIL\n", 1)[1].split("\n  integrity checks")[0]
    return [line.strip() for line in block.splitlines()]


def test_check_names_an_unparsable_line_and_folds_the_checkers_traceback(tmp_path):
    path = _variant(tmp_path, "broken.txt", lambda lines: lines[:20] + [":::MLLOG {}\n"] + lines[20:])
    proc = run_cli("check", path, "--ruleset", "0.7.0", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert checker_lines(proc.stdout) == ["the checker stopped with an exception: KeyError: 'time_ms'"]
    assert "error: [unparsable_line] line 21 is not an MLLOG event (no string 'key'): :::MLLOG {}" in proc.stdout
    # A line the checker reports itself (broken JSON): its per-line echo is one count, the line ours.
    path = _variant(tmp_path, "cut.txt", lambda lines: lines[:20] + [lines[20][:80] + "\n"] + lines[20:])
    proc = cli_in_process("check", path, "--ruleset", "0.7.0")
    assert proc.returncode == 1
    assert checker_lines(proc.stdout) == ["1 MLLOG line(s) it could not parse"]
    assert "error: [unparsable_line] line 21 is not an MLLOG event (not JSON: Unterminated string" in proc.stdout
    # Text after an event: read by the harness, a parse error to the checker; named as a warning.
    path = _variant(tmp_path, "tail.txt", lambda lines: lines[:20] + [lines[20].rstrip() + " (rank 0)\n"] + lines[21:])
    proc = cli_in_process("check", path, "--ruleset", "0.7.0")
    assert checker_lines(proc.stdout) == ["1 MLLOG line(s) it could not parse"]
    assert "warning: [text_after_event] line 21 has text after the JSON object (read; the official checker " \
        "cannot parse it)" in proc.stdout


def test_a_ruleset_the_installed_checker_lacks_is_one_error_line():
    import mlperf_logging.compliance_checker as checker

    folder = os.path.dirname(checker.__file__)
    installed = sorted(d.removeprefix("training_") for d in os.listdir(folder) if re.fullmatch(r"training_[\d.]+", d))
    proc = cli_in_process("check", os.path.join(SSD, "result_1.txt"), "--ruleset", "9.9")
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ruleset '9.9' is not one the installed mlperf-logging ")
    assert line.endswith(f"checks (its training rulesets: {', '.join(installed)})")


@pytest.mark.parametrize("value", ["0", "-3", "nan"])
def test_a_non_positive_eval_cadence_is_refused(value):
    proc = cli_in_process("check", os.path.join(SSD, "result_1.txt"), "--eval_every", value)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: --eval_every {value}: give the expected eval cadence as a positive "
                                        "number of epochs or samples (leave it out to infer it from the log)"]
