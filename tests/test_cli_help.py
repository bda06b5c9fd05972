"""The CLI's own words: `--help` lists the commands, `COMMAND --help` a command's flags, both exit 0; a flag
the command does not read is one `error:` line."""
from __future__ import annotations

import contextlib
import io

import pytest

from harness import cli

from conftest import cli_in_process, run_cli, stderr_error_lines

pytestmark = pytest.mark.quick


def help_in_process(*args: str) -> tuple[int, str]:
    """`parse_flags` as the entry point calls it (before absl): the code it exits with and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        cli.parse_flags(["mlperf-harness", *args])
    return stop.value.code, out.getvalue()


def test_help_lists_every_command_with_one_line():
    code, text = help_in_process("--help")
    assert code == 0
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("  ")]
    assert sorted(listed) == sorted(cli.COMMANDS)
    assert help_in_process("-h") == (0, text) and help_in_process("help") == (0, text)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_command_help_lists_its_flags_and_exits_0(command):
    code, text = help_in_process(command, "--help")
    assert code == 0 and text.startswith(f"usage: mlperf-harness {command}")
    flags_shown = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("  --")]
    assert flags_shown == [f"--{n}" for n in cli.COMMAND_HELP[command].flags + cli.COMMON_FLAGS]
    assert help_in_process("help", command) == (0, text)
    assert help_in_process(command, "ARG", "-h") == (0, text)


def test_every_harness_flag_belongs_to_a_command():
    """A flag no command lists would be neither shown by --help nor refused when stray."""
    from absl import flags

    ours = {f.name for f in flags.FLAGS.get_flags_for_module("harness.cli")}
    listed = {n for c in cli.COMMAND_HELP.values() for n in c.flags} | set(cli.COMMON_FLAGS)
    assert ours == listed


def test_help_through_the_entry_point():
    proc = run_cli("run", "--help", timeout=120)
    assert proc.returncode == 0 and "--dry_run:" in proc.stdout and "USAGE: mlperf-harness [flags]" not in proc.stdout
    assert proc.stderr == "", proc.stderr


def test_a_flag_the_command_does_not_read_is_one_error_line(tmp_path):
    """Fault case: `check LOG --max_shard_size 1GB` was accepted."""
    log = tmp_path / "x.txt"
    log.write_text("")
    for args, words in [(["check", str(log), "--max_shard_size", "1GB"], "--max_shard_size goes with export"),
                        (["list", "--out", "x"], "--out goes with package / report / plan / export"),
                        (["report", str(log), "--set", "a=1"], "`report` does not read it")]:
        proc = cli_in_process(*args)
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], (args, proc.stderr)


def test_closed_stdout_is_one_line_and_exit_2(tmp_path):
    """Fault case: `check LOG >&-` ended in an AttributeError traceback from flushing a stdout of None."""
    import shlex
    import subprocess

    from conftest import REPO, harness_cmd

    cmd = " ".join(shlex.quote(a) for a in harness_cmd("list")) + " >&-"
    proc = subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: standard output is closed; send it somewhere (>/dev/null to drop it)"], proc.stderr
