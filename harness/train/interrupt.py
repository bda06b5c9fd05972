"""SIGINT, SIGTERM and SIGHUP stop a run the same way: at once, with one `error:` line and exit 128 + signum.

SIGTERM is what SLURM, Kubernetes and preemption send, SIGHUP what a closed terminal sends; by default
either kills Python outright, so a run would end with no message and a log that does not say it stopped.
Inside `handled()` each of them raises `Interrupted` (a KeyboardInterrupt, so code that already cleans up
after Ctrl-C does so for all three) in the main thread; the run then ends its MLPerf log visibly aborted
(`MLPerfLog.interrupted`) and the CLI prints `error: interrupted by SIGTERM` and exits 143.

Python runs signal handlers only on the main thread, between bytecodes: a main thread blocked inside a long
TensorFlow call (a chunk of steps, an XLA compile, a collective waiting for a lost peer) would not see the
signal until that call returns. So a backstop thread, woken through `signal.set_wakeup_fd` (written by the
C-level handler at once, whatever the main thread is doing), waits `GRACE_S` for the main thread to finish;
if it has not, it runs the registered last words (the log's abort lines), prints the same `error:` line and
ends the process with `os._exit(128 + signum)`. A second signal during the grace does not cut it short.

A signal the process ignores when `handled()` starts (`nohup` ignores SIGHUP) stays ignored. TensorFlow's
multi-worker coordination service installs its own SIGTERM handler (a preemption notice it only records, the
process runs on), so the run calls `reclaim()` once its runtime exists.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 10.0  # how long the main thread has, after the signal, to end the run itself
LAST_WORDS_S = 5.0  # then how long the backstop gives the log's last lines and the flush of stdout

_last_words: list[Callable[[str], None]] = []
_installed: dict[int, Callable[[int, Any], None]] = {}  # what the active `handled()` set, for reclaim()
_arrived: list[int] = []  # the signal the active `handled()` raised for


class Interrupted(KeyboardInterrupt):
    """A run stopped by `signum` (SIGINT, SIGTERM or SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = int(signum)


def signal_name(e: BaseException) -> str:
    """The signal that stopped the run: SIGINT for a plain KeyboardInterrupt (Ctrl-C without `handled()`)."""
    return signal.Signals(getattr(e, "signum", signal.SIGINT)).name


def exit_code(e: BaseException) -> int:
    """128 + signum, the shell's convention for a process ended by a signal (130, 143, 129)."""
    return 128 + int(getattr(e, "signum", signal.SIGINT))


def message(e: BaseException) -> str:
    return f"interrupted by {signal_name(e)}"


def stopped_by(e: BaseException) -> str | None:
    """The signal's name when `e` is an interrupt, or ended the run after one had arrived; else None.

    An `Interrupted` raised while TensorFlow's C++ layer is building a Python exception (a failed op's error)
    comes out of pybind11 as a RuntimeError: every exception after the signal is the signal's doing."""
    if isinstance(e, KeyboardInterrupt):
        return signal_name(e)
    return signal.Signals(_arrived[0]).name if _arrived else None


@contextlib.contextmanager
def last_words(fn: Callable[[str], None]) -> Iterator[None]:
    """Within the block, the backstop calls `fn(signal name)` before it ends the process (e.g. to end a log)."""
    _last_words.append(fn)
    try:
        yield
    finally:
        _last_words.remove(fn)


def reclaim() -> None:
    """Puts the active `handled()` handlers back where a library replaced them at the OS level (Python's own
    table does not see that)."""
    for s, handler in _installed.items():
        signal.signal(s, handler)


@contextlib.contextmanager
def handled(enabled: bool = True, grace_s: float = GRACE_S) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` within the block, with the backstop above; any other
    exception leaving the block after one of them becomes that `Interrupted`. The previous handlers come back
    afterwards. A no-op off the main thread (only it can set handlers) or when disabled."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in HANDLED}
    caught = [s for s in HANDLED if previous[s] is not signal.SIG_IGN]
    late: list[int] = []  # signals that came while the block was ending
    closing = threading.Event()
    _arrived.clear()

    def raise_once(signum: int, frame: Any) -> None:
        if closing.is_set():
            late.append(signum)
        elif not _arrived:  # a repeat must not break the cleanup the first one started
            _arrived.append(signum)
            raise Interrupted(signum)

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    exiting = threading.Lock()
    state = {"done": False}
    backstop = threading.Thread(target=_backstop, args=(read_fd, set(caught), grace_s, exiting, state),
                                name="signal-backstop", daemon=True)
    backstop.start()
    old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for s in caught:
        signal.signal(s, raise_once)
    _installed.update(dict.fromkeys(caught, raise_once))
    try:
        yield
    except BaseException as e:
        if _arrived and not isinstance(e, KeyboardInterrupt):
            raise Interrupted(_arrived[0]) from e
        raise
    finally:
        try:
            closing.set()  # from here a signal is raised after the handlers are restored, not halfway
        finally:
            with exiting:  # once the backstop holds it, the process is ending: this waits for that
                state["done"] = True
            _installed.clear()
            for s in caught:
                signal.signal(s, previous[s])
            signal.set_wakeup_fd(old_wakeup)
            os.close(write_fd)  # the backstop reads end-of-file and returns
            backstop.join()
            os.close(read_fd)
            arrived = list(_arrived)
            _arrived.clear()
    if late and not arrived:
        raise Interrupted(late[0])


def _backstop(read_fd: int, caught: set[int], grace_s: float, exiting: threading.Lock, state: dict) -> None:
    """Waits for a caught signal's byte, then for `grace_s` or the end of `handled()`; ends the process if the
    main thread has not."""
    signum = None
    while signum is None:
        data = os.read(read_fd, 64)
        if not data:
            return
        signum = next((b for b in data if b in caught), None)
    deadline = time.monotonic() + grace_s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([read_fd], [], [], left)[0] and not os.read(read_fd, 64):
            return
    with exiting:
        if state["done"]:
            return
        name = signal.Signals(signum).name

        def last_words() -> None:
            for fn in list(_last_words):
                with contextlib.suppress(Exception):
                    fn(name)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()

        try:
            # The log's last lines and stdout can block (a lock the stuck main thread holds, a full pipe, a
            # hung file system): they get a bounded time, the exit does not wait on them.
            words = threading.Thread(target=last_words, name="interrupt-last-words", daemon=True)
            words.start()
            words.join(LAST_WORDS_S)
            with contextlib.suppress(Exception):
                os.write(2, f"error: interrupted by {name} (the run had not stopped {grace_s:g} s after it; "
                            f"ended without cleanup)\n".encode())
        finally:
            os._exit(128 + signum)
