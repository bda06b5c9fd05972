"""MLPerf log writing (mlperf_logging.mllog) and the compliance gate run on every log.

mllog's `config(filename=...)` appends to a global logger, so each run gets its own `MLLogger` over a
private Python logger and a file that must not exist yet. Only the chief writes; other hosts get a
logger that drops everything, so the loop never has to ask who it is.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
from typing import Any

from mlperf_logging.mllog import mllog
from mlperf_logging.mllog import constants as K

from harness.errors import HarnessError


@dataclasses.dataclass(frozen=True)
class Logged:
    """A hyperparameter a workload logs with metadata (e.g. max_sequence_length's `method`)."""
    value: Any
    metadata: dict


INTERRUPTED_KEY = "harness_interrupted"


class MLPerfLog:
    """One run's MLPerf log file; a no-op on non-chief hosts."""

    _count = 0

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._handler: logging.Handler | None = None
        self._keys: set[str] = set()  # start/end keys written (has the timed run started, stopped?)
        self._closing = threading.Lock()  # the signal backstop thread may end the log too
        if path is None:
            self._mllog = None
            return
        if os.path.exists(path):
            raise HarnessError(f"MLPerf log {path} already exists; mllog appends, so every run needs a "
                               f"fresh file (choose another --output_dir or run_id)")
        MLPerfLog._count += 1
        logger = logging.getLogger(f"mlperf_harness.mllog.{MLPerfLog._count}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(path, mode="x")
        logger.addHandler(self._handler)
        self._mllog = mllog.MLLogger(logger=logger, default_stack_offset=2,
                                     root_dir=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._mllog:
            self._mllog.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._mllog:
            self._mllog.start(key=key, value=value, metadata=metadata)
            self._keys.add(key)

    def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._mllog:
            self._mllog.end(key=key, value=value, metadata=metadata)
            self._keys.add(key)

    def interrupted(self, signal_name: str) -> None:
        """Ends the log of a run stopped by a signal so that it says so: `harness_interrupted` (not an MLPerf
        key; checkers ignore it) naming the signal, then, once the timed run has started, its `run_stop`
        with status aborted. Then closes it; a no-op once closed (and on non-chief hosts)."""
        with self._closing:
            if self._handler is None:
                return
            self.event(INTERRUPTED_KEY, signal_name)
            if K.RUN_START in self._keys and K.RUN_STOP not in self._keys:
                self.end(K.RUN_STOP, metadata={"status": "aborted", "interrupted_by": signal_name})
            self._close()

    def close(self) -> None:
        with self._closing:
            self._close()

    def _close(self) -> None:
        if self._handler:
            self._handler.flush()
            self._handler.close()
            self._handler = None


@dataclasses.dataclass
class Verdict:
    """The official checker's verdict on a log, classified for the harness's exit code."""
    ruleset: str
    passed: bool           # the official checker printed SUCCESS and exited 0
    only_target_missed: bool  # failed only because no eval reached the quality target
    errors: list[str]
    output: str

    @property
    def label(self) -> str:
        if self.passed:
            return "PASS"
        if self.only_target_missed:
            return "FAIL (quality target not reached; log otherwise compliant)"
        return "FAIL"


_TARGET_FAILURE = re.compile(r"Failed checks for eval_accuracy")
_CHECKER_LINE = re.compile(r"^(INFO|WARNING|ERROR) - (.*)$")


def run_compliance_checker(path: str, ruleset: str, werror: bool = False) -> Verdict:
    """Runs `python -m mlperf_logging.compliance_checker` on `path` and reads its verdict."""
    cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
           "--ruleset", ruleset, path]
    if werror:
        cmd.insert(-1, "--werror")
    path = os.path.abspath(path)
    cmd[-1] = path
    try:
        # The checker writes compliance_checker.log into its working directory: keep that out of the user's.
        with tempfile.TemporaryDirectory() as cwd:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)
    except subprocess.TimeoutExpired:
        return Verdict(ruleset, False, False, ["compliance checker timed out"], "")
    output = proc.stdout + proc.stderr
    passed = proc.returncode == 0 and "SUCCESS" in output
    errors = []
    for line in output.splitlines():
        m = _CHECKER_LINE.match(line)
        if m and m.group(1) in ("WARNING", "ERROR") and m.group(2).strip() not in ("FAILED", ""):
            errors.append(m.group(2).strip())
    if not passed and not errors:
        errors = [line for line in output.strip().splitlines()[-5:]]
    only_target = (not passed and bool(errors)
                   and all(_TARGET_FAILURE.search(e) for e in errors)
                   and any(_TARGET_FAILURE.search(e) for e in errors))
    return Verdict(ruleset, passed, only_target, errors, output)


# Re-exported so workloads and the loop spell keys through one module.
KEYS = K
