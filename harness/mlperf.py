"""MLPerf log writing (mlperf_logging.mllog) and the compliance gate run on every log.

mllog's `config(filename=...)` appends to a global logger, so each run gets its own `MLLogger` over a
private Python logger and a file that must not exist yet. Only the chief writes; other hosts get a
logger that drops everything, so the loop never has to ask who it is.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
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


class _LogFileHandler(logging.FileHandler):
    """logging.FileHandler that stops the run at the first write that fails (a full or vanished disk): the
    standard one prints a `--- Logging error ---` traceback per line and carries on, the run training into a
    log cut mid-line. Raises the OSError with the log's path, which the CLI prints as its one `error:` line
    (exit 2: a file the command cannot write); the log keeps its name, incomplete as it is."""

    failed: OSError | None = None

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.failed = error
        raise OSError(error.errno, f"{error.strerror} (writing the MLPerf log; the run stops)",
                      self.baseFilename) from None


class MLPerfLog:
    """One run's MLPerf log file; a no-op on non-chief hosts."""

    _count = 0

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._handler: _LogFileHandler | None = None
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
        self._handler = _LogFileHandler(path, mode="x")
        logger.addHandler(self._handler)
        self._mllog = mllog.MLLogger(logger=logger, default_stack_offset=2,
                                     root_dir=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def _writable(self) -> bool:
        """A log to write to: this host's, not closed, no write failed (after one, the run is stopping with
        that error; its clean-up writes nothing more)."""
        return bool(self._mllog) and not (self._handler is not None and self._handler.failed)

    def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._writable():
            self._mllog.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._writable():
            self._mllog.start(key=key, value=value, metadata=metadata)
            self._keys.add(key)

    def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._writable():
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
            handler, self._handler = self._handler, None
            try:
                handler.flush()
                handler.close()
            except OSError:
                if not getattr(handler, "failed", None):  # a write already failed and was reported: quiet
                    raise


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
_PARSE_BLOCK = "Found parsing errors:"   # then, per line it could not read, the line and "^^  <why>"
_PARSE_SUMMARY = "Log lines had parsing errors."
_TRACEBACK = "Traceback (most recent call last):"


def checker_version() -> str:
    try:
        return importlib.metadata.version("mlperf-logging")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def checker_rulesets() -> tuple[str, ...]:
    """The training rulesets the installed compliance checker has: its `training_<ruleset>/common.yaml` rule
    folders (what its --ruleset accepts), oldest first."""
    from mlperf_logging import compliance_checker

    folder = os.path.dirname(os.path.abspath(compliance_checker.__file__))
    found = [m.group(1) for name in os.listdir(folder)
             if (m := re.fullmatch(r"training_(\d+\.\d+\.\d+)", name))
             and os.path.isfile(os.path.join(folder, name, "common.yaml"))]
    return tuple(sorted(found, key=lambda r: tuple(int(x) for x in r.split("."))))


def require_ruleset(ruleset: str) -> None:
    """HarnessError (one line) unless the installed checker has `ruleset`: it would only print its usage."""
    have = checker_rulesets()
    if ruleset not in have:
        raise HarnessError(f"ruleset {ruleset!r} is not one the installed mlperf-logging {checker_version()} "
                           f"checks (its training rulesets: {', '.join(have) or 'none'})")


def checker_benchmarks(ruleset: str, division: str) -> tuple[str, ...] | None:
    """The benchmarks the installed checker accepts in `division` under `ruleset`: the list in its
    `training_<ruleset>/<division>_common.yaml` `submission_benchmark` check; None where that file or list
    cannot be read (then nothing is refused on it)."""
    import ast

    import yaml
    from mlperf_logging import compliance_checker

    path = os.path.join(os.path.dirname(os.path.abspath(compliance_checker.__file__)), f"training_{ruleset}",
                        f"{division}_common.yaml")
    try:
        with open(path) as f:
            rules = yaml.safe_load(f) or []
    except (OSError, yaml.YAMLError):
        return None
    for rule in rules:
        key = rule.get("KEY", {}) if isinstance(rule, dict) else {}
        if key.get("NAME") == "submission_benchmark":
            m = re.search(r"\bin\s*(\[[^\]]*\])", str(key.get("CHECK", "")))
            try:
                return tuple(ast.literal_eval(m.group(1))) if m else None
            except (ValueError, SyntaxError):
                return None
    return None


def require_benchmark(ruleset: str, division: str, benchmark: str) -> None:
    """HarnessError (one line) where the installed checker's `division` rules of `ruleset` do not list
    `benchmark`: its log would fail `submission_benchmark` however the run went."""
    accepted = checker_benchmarks(ruleset, division)
    if accepted is None or benchmark in accepted:
        return
    elsewhere = [r for r in checker_rulesets() if benchmark in (checker_benchmarks(r, division) or ())]
    raise HarnessError(
        f"the installed mlperf-logging {checker_version()} checker's {division} division of ruleset {ruleset} "
        f"does not list {benchmark} (training_{ruleset}/{division}_common.yaml), so no {division} log of it "
        f"can pass there; {division} rulesets that list it: {', '.join(elsewhere) or 'none'}")


def _checker_messages(output: str) -> list[str]:
    """The checker's WARNING and ERROR messages, its per-line parse errors folded into one count: the lines
    themselves are named by the integrity checks (`unparsable_line`), a wall of them here says nothing more."""
    messages: list[str] = []
    unread = 0
    in_block = False
    for line in output.splitlines():
        if line.strip() == _PARSE_SUMMARY:  # one of the messages of a multi-line WARNING (rulesets >= 1.0.0)
            messages.append(f"{unread} MLLOG line(s) it could not parse")
            continue
        m = _CHECKER_LINE.match(line)
        if not m or m.group(1) not in ("WARNING", "ERROR"):
            in_block = False
            continue
        text = m.group(2)
        if text.strip() == _PARSE_BLOCK:
            in_block = True
            continue
        if in_block and text.startswith("  "):  # the echoed line, or "^^  <why>" under it
            unread += text.strip().startswith("^^")
            continue
        in_block = False
        text = text.strip()
        if text == _PARSE_SUMMARY:
            text = f"{unread} MLLOG line(s) it could not parse"
        if text not in ("FAILED", ""):
            messages.append(text)
    return messages


def run_compliance_checker(path: str, ruleset: str, werror: bool = False) -> Verdict:
    """Runs `python -m mlperf_logging.compliance_checker` on `path` and reads its verdict; HarnessError for a
    ruleset the installed checker does not have."""
    require_ruleset(ruleset)
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
    errors = _checker_messages(output)
    if not passed and _TRACEBACK in proc.stderr:
        # It stops with a traceback on a line it cannot read (a JSON list, an event without time_ms): one line.
        last = next((line.strip() for line in reversed(proc.stderr.splitlines()) if line.strip()), "")
        errors.append(f"the checker stopped with an exception: {last}")
    elif not passed and not errors:
        errors = [line for line in output.strip().splitlines()[-5:]]
    only_target = (not passed and bool(errors)
                   and all(_TARGET_FAILURE.search(e) for e in errors)
                   and any(_TARGET_FAILURE.search(e) for e in errors))
    return Verdict(ruleset, passed, only_target, errors, output)


# Re-exported so workloads and the loop spell keys through one module.
KEYS = K
