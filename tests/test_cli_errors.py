"""Bad paths, bad flags and a closed pipe at every entry point: one `error:` line and exit code 2 (or a quiet
end for a reader that went away), never a traceback."""
from __future__ import annotations

import os
import subprocess

import pytest
from absl import flags

from conftest import REPO, cli_in_process, harness_cmd

pytestmark = pytest.mark.quick

PUBLIC_LOG = os.path.join(REPO, "tests", "data", "public_v0.7", "Google", "results", "tpu-v3-8192-TF", "ssd",
                          "result_1.txt")


def _one_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "taken"
    path.write_text("not a directory\n")
    return str(path)


@pytest.mark.parametrize("command", [
    ["run", "configs/resnet/smoke.yaml", "--output_dir"],
    ["report", PUBLIC_LOG, "--out"],
    ["plan", "configs/resnet/smoke.yaml", "--system", "dgx-h100", "--chips", "8", "--sweep", "--out"],
    ["campaign", "configs/resnet/smoke.yaml", "--runs", "1", "--campaign_dir"],
    ["package", PUBLIC_LOG, "--out"],
], ids=lambda c: c[0])
@pytest.mark.parametrize("below", [False, True], ids=["is_a_file", "under_a_file"])
def test_an_output_directory_that_is_a_file_is_one_line(command, below, a_file):
    target = os.path.join(a_file, "sub") if below else a_file
    line = _one_error(cli_in_process(*command, target))
    assert f"{command[-1]} {target}: " in line and "not a directory" in line, line
    if below:
        assert f"{a_file} is a file" in line, line


def test_any_filesystem_error_from_a_command_is_one_line(monkeypatch, tmp_path):
    """The CLI's backstop for a path no command checked first: an OSError becomes its reason and path."""
    from harness import cli

    def fails(args: list[str]) -> int:
        open(tmp_path / "missing" / "file.txt")  # noqa: SIM115 - raises before anything is open
        return 0

    monkeypatch.setitem(cli.COMMANDS, "list", fails)
    line = _one_error(cli_in_process("list"))
    assert line == f"error: No such file or directory: {tmp_path / 'missing' / 'file.txt'}", line


def test_a_config_that_is_not_utf8_names_the_file_and_byte(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_bytes(b"workload: resnet\n\xff\xfe: 1\n")
    line = _one_error(cli_in_process("run", str(config)))
    assert line == f"error: config {config}: not UTF-8 text (byte b'\\xff' at offset 17)", line


@pytest.mark.parametrize("argv, says", [
    (["check", "--bogus"], "Unknown command line flag 'bogus'"),
    (["plan", "--chips=many"], "flag --chips=many: invalid literal for int()"),
    (["check", "--eval_every=x"], "flag --eval_every=x: could not convert string to float"),
])
def test_a_bad_flag_is_one_error_line_and_exit_2(argv, says, capsys):
    from harness import cli

    try:
        with pytest.raises(SystemExit) as stopped:
            cli.parse_flags(["mlperf-harness", *argv])
    finally:
        flags.FLAGS.unparse_flags()
    assert stopped.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


def test_a_bad_flag_in_a_real_process_exits_2_without_absl_fatal():
    proc = subprocess.run(harness_cmd("check", "--bogus"), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "FATAL" not in proc.stderr
    assert _one_error(proc).startswith("error: Unknown command line flag 'bogus'")


def test_a_reader_that_went_away_ends_the_command_quietly():
    """`check LOG | head -1`: the pipe's read end is closed before the command writes (no race with a
    reader), so its first line meets EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(harness_cmd("check", PUBLIC_LOG, "--ruleset", "0.7.0"), cwd=REPO, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
