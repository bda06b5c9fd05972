"""A host-side deadline on compiled calls that wait on other hosts (multi_worker collectives).

TensorFlow's own per-collective timeout (CommunicationOptions.timeout_seconds) starts a thread for every
collective and keeps it for the whole timeout: thousands of live threads per process within minutes of
training. One watchdog thread per process does the same job for the price of one: each guarded call
(a chunk of train steps, an eval batch, a broadcast) gets a deadline, and a call that outlives it makes
the watchdog abort this process's pending collectives, which then raise DeadlineExceededError.

Compilation is not under the deadline: a call that traces its function (the first call of each traced
function, so the warm-up's, which also builds every per-replica XLA program on its first execution) runs
without one; `compiling()`, called from the traced Python function, disarms it. A peer that hangs later
is found within the timeout of the call it hangs in. The watchdog cannot tell which peer stopped
answering (or whether the call was merely slow): its message says how long the call waited.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Any, Callable, Iterator

import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context as tf_context


class CollectiveWatchdog:
    """Aborts this process's collectives when a guarded call runs past `timeout_s`."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self.fired = False
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._depth = 0
        self._thread = threading.Thread(target=self._watch, daemon=True, name="collective-watchdog")
        self._thread.start()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline = None
                self.fired = True
                message = (f"collective watchdog: a compiled call waited more than {self.timeout_s:g}s "
                           f"(runtime.collective_timeout_s) for its peers")
                logging.error(message)
                tf_context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, message)

    @property
    def armed(self) -> bool:
        """Whether a deadline is running now (inside a guarded call that is not compiling)."""
        with self._cond:
            return self._deadline is not None

    @tf.autograph.experimental.do_not_convert
    def compiling(self) -> None:
        """Called while a guarded call traces its function: the rest of that call (tracing, XLA
        compilation on first execution, and that first execution) runs without a deadline."""
        with self._cond:
            if self._depth:
                self._deadline = None
                self._cond.notify()

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Arms the deadline for the outermost guarded call; nested guards share it."""
        with self._cond:
            self._depth += 1
            if self._depth == 1:
                self._deadline = time.monotonic() + self.timeout_s
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._deadline = None
                    self._cond.notify()

    def wrap(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with self.guard():
                return fn(*args, **kwargs)
        guarded.compiled = fn  # type: ignore[attr-defined]
        return guarded
