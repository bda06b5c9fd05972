"""Read MLPerf training result logs (``:::MLLOG {json}`` lines) into events and per-run summaries.

Workload-agnostic on purpose: the review report has to read our own logs and public submissions
(v0.7 onwards) alike, so nothing here imports TensorFlow or knows how a benchmark is trained.

Tolerated quirks of public logs:
  * text before ``:::MLLOG`` on a line (launcher/rank prefixes) and anything after the JSON object;
  * other lines (framework chatter, ``# comments``) are ignored.
A ``:::MLLOG`` line that is not an event (broken JSON, not an object, no string ``key``, no numeric
``time_ms``, no ``value`` or ``metadata`` object: what mllog always writes and the official checker reads) does
not abort the file: it is returned as a `BadLine` for the integrity checks to count and name. So is an event
with text after its JSON (`kept`: its event is read too), which the official checker cannot parse.
The pre-0.7 ``:::MLL <time> key: value`` format is not read.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import yaml

from harness import benchmark_rules as rules
from harness.errors import HarnessError

MARKER = ":::MLLOG"
SHOWN_CHARS = 60  # of an unparsable line, in messages


@dataclass
class LogEvent:
    """One ``:::MLLOG`` line. ``line_no`` is 1-based in the file, for messages a person can follow."""

    key: str
    value: Any
    time_ms: float
    event_type: str
    metadata: dict
    line_no: int


@dataclass
class BadLine:
    """A ``:::MLLOG`` line that is not an event: where it is, why, and how it starts (for a person to find it)."""

    line_no: int
    reason: str
    text: str
    kept: bool = False  # the line's event was read; only what follows its JSON is not part of it

    def describe(self) -> str:
        if self.kept:
            return f"line {self.line_no} has {self.reason} (read; the official checker cannot parse it): {self.text}"
        return f"line {self.line_no} is not an MLLOG event ({self.reason}): {self.text}"


def _event(line: str, start: int, decoder: json.JSONDecoder) -> tuple[dict | None, str]:
    """(the fields of the event whose JSON begins at or after `start` in `line`, what follows the JSON or '')
    or (None, why it is not an event)."""
    while start < len(line) and line[start].isspace():
        start += 1
    try:
        obj, end = decoder.raw_decode(line, start)
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e.msg}{'' if e.msg.endswith(' at') else ' at'} column {e.pos + 1}"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    if not isinstance(obj.get("key"), str):
        return None, "no string 'key'"
    try:
        time_ms = float(obj["time_ms"])
    except (KeyError, TypeError, ValueError):
        return None, "no numeric 'time_ms'"
    if "value" not in obj:
        return None, "no 'value'"
    if not isinstance(obj.get("metadata"), dict):
        return None, "no 'metadata' object"
    return dict(obj, time_ms=time_ms), "text after the JSON object" if line[end:].strip() else ""


def parse_lines(lines: Iterable[str], bad: list[BadLine] | None = None) -> list[LogEvent]:
    """Parse MLLOG events from text lines, keeping file order; non-MLLOG lines are ignored, and MLLOG lines
    that are not events are appended to `bad` (when given)."""
    decoder = json.JSONDecoder()
    events: list[LogEvent] = []
    for line_no, line in enumerate(lines, start=1):
        pos = line.find(MARKER)
        if pos < 0:
            continue
        obj, why = _event(line.rstrip(), pos + len(MARKER), decoder)
        if why and bad is not None:
            text = line.strip()
            bad.append(BadLine(line_no, why, text[:SHOWN_CHARS] + ("..." if len(text) > SHOWN_CHARS else ""),
                               kept=obj is not None))
        if obj is None:
            continue
        events.append(
            LogEvent(
                key=obj["key"],
                value=obj["value"],
                time_ms=obj["time_ms"],
                event_type=str(obj.get("event_type", "POINT_IN_TIME")),
                metadata=obj["metadata"],
                line_no=line_no,
            )
        )
    return events


MAX_LINE_CHARS = 1_000_000  # far above any MLLOG line; the official checker's parser spins on a 50 MB one


def _bounded_lines(f: Any, path: str) -> Iterator[str]:
    """The lines of `f`, each read to at most MAX_LINE_CHARS: a longer one is a HarnessError naming it (read
    whole, it would hold the checker for minutes and a parser's memory)."""
    line_no = 0
    while True:
        line = f.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        line_no += 1
        if len(line) > MAX_LINE_CHARS:
            raise HarnessError(f"{path}: line {line_no} is longer than {MAX_LINE_CHARS:,} characters; no MLPerf log "
                               "line is (the official checker would spin on it)")
        yield line


def parse_log(path: str, bad: list[BadLine] | None = None) -> list[LogEvent]:
    """Parse one log file; HarnessError when it cannot be read or holds no MLLOG event. MLLOG lines that are
    not events are appended to `bad` (when given)."""
    found: list[BadLine] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            events = parse_lines(_bounded_lines(f, path), found)
    except OSError as e:
        raise HarnessError(f"cannot read MLPerf log {path}: {e.strerror or e}") from e
    if not events:
        if found:  # none of them kept
            raise HarnessError(f"{path} holds no readable MLLOG event: {found[0].describe()}")
        raise HarnessError(f"{path} contains no ':::MLLOG' lines; is it an MLPerf result log?")
    if bad is not None:
        bad.extend(found)
    return events


@dataclass
class RunSummary:
    """What a reviewer wants to know about one run, derived only from its log.

    ``evals`` holds ``(position, accuracy, time_ms)`` where position is the eval_accuracy
    ``epoch_num`` metadata, or ``samples_count`` when the log counts samples (``eval_axis`` says
    which). ``throughput`` is training samples per second inside logged blocks:
    ``sum(block samples) / sum(block_stop - block_start)`` over matched block pairs, where a block's
    samples are stop minus start ``samples_count`` when both are logged, else ``epoch_count *
    train_samples``, else the start's ``samples_count``; None when the log lacks what the formula needs. It
    ignores time outside blocks, so it is a training-loop rate, not samples / time-to-train.
    """

    path: str
    benchmark: str | None = None
    division: str | None = None
    org: str | None = None
    platform: str | None = None
    seed: int | None = None
    global_batch_size: int | None = None
    status: str | None = None
    time_to_train_min: float | None = None
    init_time_s: float | None = None
    epochs_or_samples_to_converge: float | None = None
    evals: list[tuple[float, float, float]] = field(default_factory=list)
    eval_axis: str = "epoch_num"
    train_time_s: float | None = None
    eval_time_s: float | None = None
    throughput: float | None = None
    target: float | None = None
    ruleset: str | None = None  # the ruleset `target` is taken from
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    init_stop_ms: float | None = None

    @property
    def last_accuracy(self) -> float | None:
        return self.evals[-1][1] if self.evals else None

    @property
    def succeeded(self) -> bool:
        """A run counts only with run_stop status 'success' (MLPerf's definition)."""
        return self.status == "success" and self.time_to_train_min is not None


def _first(events: list[LogEvent], key: str) -> LogEvent | None:
    return next((e for e in events if e.key == key), None)


def _last(events: list[LogEvent], key: str) -> LogEvent | None:
    return next((e for e in reversed(events) if e.key == key), None)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _str_or_none(event: LogEvent | None) -> str | None:
    return None if event is None or event.value is None else str(event.value)


def eval_position(event: LogEvent) -> float | None:
    """Where an eval happened: epoch_num, else samples_count (logs that count samples)."""
    for name in ("epoch_num", "samples_count"):
        v = event.metadata.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def match_intervals(events: list[LogEvent], start_key: str, stop_key: str,
                    meta_keys: tuple[str, ...]) -> list[tuple[LogEvent, LogEvent]]:
    """Pair start/stop events that carry the same metadata value (first unmatched start wins).

    Pairing by metadata, not by order, because evals may run asynchronously and overlap training
    blocks (e.g. Google's v0.7 SSD logs); events without the metadata pair in FIFO order.
    """

    def ident(e: LogEvent) -> Any:
        # The first key a log carries identifies the interval; later keys may legitimately differ
        # between start and stop (block_stop's samples_count is where the block ended).
        for k in meta_keys:
            if e.metadata.get(k) is not None:
                return (k, e.metadata.get(k))
        return None

    open_starts: dict[Any, deque[LogEvent]] = defaultdict(deque)
    pairs: list[tuple[LogEvent, LogEvent]] = []
    for e in events:
        if e.key == start_key:
            open_starts[ident(e)].append(e)
        elif e.key == stop_key and open_starts[ident(e)]:
            pairs.append((open_starts[ident(e)].popleft(), e))
    return pairs


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _block_samples(start: LogEvent, stop: LogEvent, train_samples: float | None) -> float | None:
    """Samples trained in one block: stop minus start position when both are logged (the harness's
    own logs), else epoch_count x train_samples, else the start's samples_count as a block size."""
    begin, end = _number(start.metadata.get("samples_count")), _number(stop.metadata.get("samples_count"))
    if begin is not None and end is not None and end > begin:
        return end - begin
    epochs = _number(start.metadata.get("epoch_count"))
    if epochs is not None and train_samples:
        return epochs * train_samples
    if begin is not None and begin > 0:
        return begin
    return None


def _load(path: str, reader: Any) -> dict | None:
    try:
        with open(path) as f:
            data = reader(f)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def read_run_files(log_path: str) -> tuple[dict | None, dict | None]:
    """The summary.json and config.yaml a harness run writes beside its log (None where absent)."""
    folder = os.path.dirname(os.path.abspath(log_path))
    return (_load(os.path.join(folder, "summary.json"), json.load),
            _load(os.path.join(folder, "config.yaml"), yaml.safe_load))


def log_ruleset(path: str, events: list[LogEvent],
                run_files: tuple[dict | None, dict | None] | None = None) -> str | None:
    """The ruleset to judge a log by: the one its run named (summary.json, else config.yaml beside it), else
    the benchmark's default for the model the log shows; None for a benchmark no ruleset knows.
    `run_files`: those two files when the caller has read them already."""
    for source in run_files if run_files is not None else read_run_files(path):
        if source and source.get("ruleset"):
            return str(source["ruleset"])
    benchmark = _str_or_none(_first(events, "submission_benchmark"))
    if rules.get(benchmark) is None:
        return None
    return rules.default_ruleset(benchmark, {e.key for e in events})


def run_rulesets(run_files: tuple[dict | None, dict | None]) -> list[str]:
    """Every ruleset the run gated its log on, its own first (summary.json's `compliance` verdicts, else
    config.yaml's `ruleset` and `check_rulesets`); empty when neither file names one."""
    summary, cfg = run_files
    own = next((str(src["ruleset"]) for src in run_files if src and src.get("ruleset")), None)
    if own is None:
        return []
    if summary and isinstance(summary.get("compliance"), dict) and summary["compliance"]:
        more = [str(r) for r in summary["compliance"]]
    elif cfg and isinstance(cfg.get("check_rulesets"), list):
        more = [str(r) for r in cfg["check_rulesets"]]
    else:
        more = []
    return [own] + [r for r in dict.fromkeys(more) if r != own]


def run_benchmark(run_files: tuple[dict | None, dict | None]) -> str | None:
    """The MLPerf benchmark the run files beside a log say they ran (summary.json's `benchmark`)."""
    summary, _ = run_files
    return str(summary["benchmark"]) if summary and summary.get("benchmark") else None


def closed_target(benchmark: str | None, ruleset: str | None, global_batch: int | None) -> float | None:
    """The closed target of `benchmark` under `ruleset`, or None where there is none to show."""
    try:
        return rules.closed_target(str(benchmark), str(ruleset), global_batch)
    except HarnessError:
        return None


def summarize(events: list[LogEvent], path: str, targets: dict[str, float] | None = None,
              ruleset: str | None = None) -> RunSummary:
    """Reduce one run's events to a RunSummary; missing keys leave fields None, never raise.

    The target is `targets[benchmark]` when given, else the closed target under `ruleset` (default: the
    log's own, `log_ruleset`)."""
    benchmark = _str_or_none(_first(events, "submission_benchmark"))
    summary = RunSummary(
        path=path,
        benchmark=benchmark,
        division=_str_or_none(_first(events, "submission_division")),
        org=_str_or_none(_first(events, "submission_org")),
        platform=_str_or_none(_first(events, "submission_platform")),
    )
    seed = _first(events, "seed")
    summary.seed = _as_int(seed.value) if seed else None
    gbs = _first(events, "global_batch_size")
    summary.global_batch_size = _as_int(gbs.value) if gbs else None
    if targets and benchmark in targets:
        summary.target = targets[benchmark]
    elif rules.get(benchmark) is not None:
        summary.ruleset = ruleset or log_ruleset(path, events)
        summary.target = closed_target(benchmark, summary.ruleset, summary.global_batch_size)

    run_start, run_stop = _first(events, "run_start"), _last(events, "run_stop")
    summary.run_start_ms = run_start.time_ms if run_start else None
    summary.run_stop_ms = run_stop.time_ms if run_stop else None
    if run_stop is not None:
        status = run_stop.metadata.get("status")
        summary.status = str(status) if status is not None else None
    if run_start and run_stop:
        summary.time_to_train_min = (run_stop.time_ms - run_start.time_ms) / 60000.0

    init_start = _first(events, "init_start")
    init_stop = _first(events, "init_stop")
    summary.init_stop_ms = init_stop.time_ms if init_stop else None
    if init_start and init_stop:
        summary.init_time_s = (init_stop.time_ms - init_start.time_ms) / 1000.0

    accs = [e for e in events if e.key == "eval_accuracy"]
    if accs and "epoch_num" not in accs[-1].metadata and "samples_count" in accs[-1].metadata:
        summary.eval_axis = "samples_count"
    for e in accs:
        pos = eval_position(e)
        if pos is None or not isinstance(e.value, (int, float)) or isinstance(e.value, bool):
            continue
        summary.evals.append((pos, float(e.value), e.time_ms))
    if accs:
        summary.epochs_or_samples_to_converge = eval_position(accs[-1])

    blocks = match_intervals(events, "block_start", "block_stop", ("first_epoch_num", "samples_count"))
    if blocks:
        summary.train_time_s = sum(b.time_ms - a.time_ms for a, b in blocks) / 1000.0
    evals = match_intervals(events, "eval_start", "eval_stop", ("epoch_num", "samples_count"))
    if evals:
        summary.eval_time_s = sum(b.time_ms - a.time_ms for a, b in evals) / 1000.0

    ts = _first(events, "train_samples")
    train_samples = float(ts.value) if ts and isinstance(ts.value, (int, float)) else None
    per_block = [(_block_samples(a, b, train_samples), b.time_ms - a.time_ms) for a, b in blocks]
    if per_block and all(n is not None for n, _ in per_block):
        total_ms = sum(ms for _, ms in per_block)
        if total_ms > 0:
            summary.throughput = sum(n for n, _ in per_block) / (total_ms / 1000.0)
    return summary
