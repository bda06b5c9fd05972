"""SIGINT, SIGTERM and SIGHUP stop `run` and `campaign` alike (harness/train/interrupt.py): one `error:` line
naming the signal, exit 128 + signum, a log that ends visibly aborted, and the backstop for a main thread that
does not get back to Python. In-process or with a small subprocess without TensorFlow; the SIGTERM'd smoke run
is tests/test_host_memory.py::test_run_stopped_by_sigterm_ends_its_log_aborted, a SIGTERM'd worker of two
tests/test_multi_worker.py::test_lost_worker_fails_the_survivor_with_one_line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness import cli
from harness.submission import campaign
from harness.train import interrupt
from harness.mlperf import KEYS as K
from harness.mlperf import MLPerfLog
from harness.review import integrity, logparse

from conftest import REPO, SMOKE, cli_in_process, default_signals

pytestmark = pytest.mark.quick


def wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def stopped_by(signum: int):
    def command(args: list[str]) -> int:
        os.kill(os.getpid(), signum)
        time.sleep(60)  # the handler raises out of this as soon as the signal is delivered
        return 0
    return command


@pytest.mark.parametrize("name", ["SIGHUP", "SIGTERM", "SIGINT"])
def test_run_stopped_by_a_signal_is_one_line_and_128_plus_signum(monkeypatch, name):
    """Started from a terminal: the signal at its default disposition. Under `nohup` or in a shell's background
    job the suite inherits SIGHUP or SIGINT ignored, and an ignored signal stays ignored (the next test), so
    this test sets the disposition it relies on."""
    signum = getattr(signal, name)
    inherited = signal.signal(signum, signal.SIG_DFL)
    try:
        before = ({s: signal.getsignal(s) for s in interrupt.HANDLED}, wakeup_fd())
        monkeypatch.setitem(cli.COMMANDS, "run", stopped_by(signum))
        proc = cli_in_process("run", "any.yaml")
        assert proc.returncode == 128 + signum and proc.stderr == f"error: interrupted by {name}\n", proc
        # the handlers and the wakeup descriptor are the process's own again
        assert ({s: signal.getsignal(s) for s in interrupt.HANDLED}, wakeup_fd()) == before
    finally:
        signal.signal(signum, inherited)


def test_an_error_that_the_signal_turned_into_is_still_the_signal(monkeypatch):
    """Raised while TensorFlow's C++ layer builds a failed op's Python error (a lost peer's), the handler's
    exception comes out of pybind11 as a RuntimeError ("MISMATCH of original and normalized active exception
    types"): after a signal, whatever ends the command is reported as that signal."""
    def command(args: list[str]) -> int:
        try:
            stopped_by(signal.SIGTERM)(args)
        except KeyboardInterrupt:
            raise RuntimeError("pybind11::error_already_set: MISMATCH ... REPLACED BY Interrupted") from None
        return 0

    monkeypatch.setitem(cli.COMMANDS, "run", command)
    proc = cli_in_process("run", "any.yaml")
    assert proc.returncode == 143 and proc.stderr == "error: interrupted by SIGTERM\n", proc


def test_an_ignored_signal_stays_ignored():
    """`nohup` ignores SIGHUP: the run goes on."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupt.handled():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def events(path: str) -> list:
    return logparse.parse_log(path)


def test_an_interrupted_log_ends_with_the_signal_and_an_aborted_run_stop(tmp_path):
    started = MLPerfLog(str(tmp_path / "started.log"))
    started.start(K.INIT_START)
    started.end(K.INIT_STOP)
    started.start(K.RUN_START)
    started.start(K.BLOCK_START, metadata={"first_epoch_num": 1, "epoch_count": 1})
    started.interrupted("SIGTERM")
    started.interrupted("SIGTERM")  # the backstop and the main thread may both get there: once
    started.close()
    tail = events(str(tmp_path / "started.log"))[-2:]
    assert [(e.key, e.value) for e in tail] == [("harness_interrupted", "SIGTERM"), ("run_stop", None)]
    assert tail[1].metadata["status"] == "aborted" and tail[1].metadata["interrupted_by"] == "SIGTERM"
    # the integrity checks (`check`, `run`'s gate) fail it, whatever the official checker makes of an aborted log
    stopped = [f for f in integrity.check_integrity(events(str(tmp_path / "started.log"))) if f.code == "interrupted"]
    assert [(f.severity, f.message) for f in stopped] == [
        ("error", f"the run was stopped by SIGTERM (line {tail[0].line_no}); not a result")]

    # before run_start: the signal only (a run_stop without run_start would claim a timed run)
    early = MLPerfLog(str(tmp_path / "early.log"))
    early.start(K.INIT_START)
    early.interrupted("SIGHUP")
    assert [e.key for e in events(str(tmp_path / "early.log"))] == ["init_start", "harness_interrupted"]

    # after its own run_stop (the loop ended, the log not yet renamed): nothing claims otherwise
    ended = MLPerfLog(str(tmp_path / "ended.log"))
    ended.start(K.RUN_START)
    ended.end(K.RUN_STOP, metadata={"status": "success"})
    ended.interrupted("SIGINT")
    assert [e.key for e in events(str(tmp_path / "ended.log"))] == ["run_start", "run_stop", "harness_interrupted"]


# The main thread stuck where Python cannot run its handler: inside a C call that the signal does not end (as a
# TensorFlow op waiting on a lost peer, or an XLA compile), or in cleanup that hangs after the signal was taken.
STUCK = {
    "in_a_c_call": """
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER (glibc)
        libc.pthread_mutex_lock(mutex)
        print("ready", flush=True)
        libc.pthread_mutex_lock(mutex)  # locked again by its owner: blocks for good, the GIL released
    """,
    "in_cleanup": """
        print("ready", flush=True)
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            time.sleep(60)
    """,
}


def wait_until_asleep(pid: int) -> None:
    """Until the process's main thread sleeps in the kernel: after its "ready" line, only the call that
    blocks puts it there."""
    while True:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "S":
                return
        time.sleep(0.01)


@pytest.mark.parametrize("where", list(STUCK))
def test_backstop_ends_a_run_stuck_after_the_signal(tmp_path, where):
    """The main thread does not finish after the signal: after the grace the backstop runs the last words
    (a log's abort lines), prints the one line and exits 128 + signum."""
    script = ("import ctypes, sys, time\nfrom harness.train import interrupt\n"
              "with interrupt.last_words(lambda name: open(sys.argv[1], 'w').write(name)):\n"
              "    with interrupt.handled(grace_s=0.5):\n"
              + textwrap.indent(textwrap.dedent(STUCK[where]).strip(), " " * 8)
              + "\nprint('not reached')\n")
    marker = tmp_path / "last_words"
    proc = subprocess.Popen([sys.executable, "-c", script, str(marker)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        wait_until_asleep(proc.pid)  # in the call that blocks, not a bytecode before it
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted by SIGTERM (the run had not stopped"), stderr
    assert "not reached" not in stdout and marker.read_text() == "SIGTERM"


class InterruptedWait:
    """A child process whose first wait() is cut by an interrupt, as SIGTERM to the campaign would."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.first = proc, True

    def wait(self, timeout: float | None = None) -> int:
        if self.first:
            self.first = False
            raise interrupt.Interrupted(signal.SIGTERM)
        return self.proc.wait(timeout)

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)


def test_campaign_passes_the_signal_to_its_run():
    """The campaign waits on its run: the signal goes on to the run (which ends its own log), then it stops."""
    child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
                              "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        with pytest.raises(interrupt.Interrupted) as e:
            campaign.wait_passing_interrupts(InterruptedWait(child))
        assert e.value.signum == signal.SIGTERM and child.returncode == 7  # it got SIGTERM and ended itself
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_an_interrupted_campaign_records_it_and_stops(monkeypatch, tmp_path):
    def interrupted_run(*args) -> int:
        raise interrupt.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(campaign, "_run_one", interrupted_run)
    proc = cli_in_process("campaign", SMOKE, "--runs", "2", "--campaign_dir", str(tmp_path))
    assert proc.returncode == 143 and proc.stderr == "error: interrupted by SIGTERM\n", proc
    state = json.loads((tmp_path / "campaign.json").read_text())
    assert [r["status"] for r in state["runs"]] == ["interrupted", "pending"]


def test_backstop_exits_even_when_the_last_words_block(tmp_path):
    """A log write that never returns (a lock the stuck thread holds, a hung file system) must not keep the
    process alive: the last words get LAST_WORDS_S, the exit does not wait on them."""
    script = ("import sys, threading, time\nfrom harness.train import interrupt\n"
              "interrupt.LAST_WORDS_S = 0.2\n"
              "with interrupt.last_words(lambda name: threading.Event().wait()):\n"
              "    with interrupt.handled(grace_s=0.5):\n"
              "        print('ready', flush=True)\n"
              "        try:\n"
              "            time.sleep(60)\n"
              "        except KeyboardInterrupt:\n"
              "            time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        wait_until_asleep(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, stderr
    assert stderr.splitlines()[-1].startswith("error: interrupted by SIGTERM (the run had not stopped"), stderr
