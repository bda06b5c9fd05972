"""How the official RCP checker reads a set of public logs: the ruleset, and the checker's own options.

mlperf-logging's `rcp_checker` reads what a log says it converged at with options its caller picks: the
ruleset (`--rcp_version`) and, for BERT, `--bert_train_samples` (the samples to converge from the
`train_samples` line instead of the last eval's `epoch_num`; mlperf-logging 4.1.68,
`rcp_checker/rcp_checker.py`, `read_submission_file`). The package checker exposes the latter as
`--rcp-bert-train-samples` for submitters whose evals do not carry the sample count: NVIDIA's v1.0/v1.1 BERT
logs log `epoch_num: 1` in every eval and the samples in `train_samples` (mlcommons/training_results_v1.1,
`NVIDIA/results/dgxa100_ngc21.09_pytorch/bert/`). This module decides both from the logs, as a reviewer
would, and says why, so that `check --rcp` and its preflight read a public log as its round read it.
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from harness.errors import HarnessError

# The day each MLPerf Training round's results were published (the round's mlcommons/training_results_v<X.Y>
# release; https://mlcommons.org/benchmarks/training/). Submissions run before their round's deadline, weeks
# before this day, and after the previous round's publication: a log dated between two of these days belongs
# to the later round. Rounds not published yet are left out: a newer log's round is not told by its date.
ROUND_PUBLISHED = (
    ("0.7.0", "2020-07-29"), ("1.0.0", "2021-06-30"), ("1.1.0", "2021-12-01"), ("2.0.0", "2022-06-29"),
    ("2.1.0", "2022-11-09"), ("3.0.0", "2023-06-27"), ("3.1.0", "2023-11-08"), ("4.0.0", "2024-06-12"),
    ("4.1.0", "2024-11-13"), ("5.0.0", "2025-06-04"), ("5.1.0", "2025-11-12"),
)
# time_ms before 2019 cannot be a real MLPerf run (made-up logs stamp 0 or 1): the date tells nothing then
EARLIEST_MS = 1_546_300_800_000  # 2019-01-01


@dataclasses.dataclass(frozen=True)
class Reading:
    """How a set of logs is read: the ruleset and whether BERT's samples come from `train_samples`."""
    ruleset: str
    ruleset_why: str
    train_samples: bool
    samples_why: str  # '' when the option does not apply (not BERT)

    def lines(self) -> list[str]:
        out = [f"  ruleset {self.ruleset}: {self.ruleset_why}"]
        if self.samples_why:
            flag = "with --bert_train_samples" if self.train_samples else "without --bert_train_samples"
            out.append(f"  read {flag}: {self.samples_why}")
        return out


def round_of_date(time_ms: float) -> tuple[str, str] | None:
    """(ruleset, day) of the round a log run at `time_ms` was for, or None when the date cannot tell."""
    if not time_ms or time_ms < EARLIEST_MS:
        return None
    day = datetime.datetime.fromtimestamp(time_ms / 1000, datetime.timezone.utc).date().isoformat()
    for ruleset, published in ROUND_PUBLISHED:
        if day < published:
            return ruleset, day
    return None


def _first_time(events: list[Any]) -> float:
    return next((float(e.time_ms) for e in events if isinstance(e.time_ms, (int, float)) and e.time_ms > 0), 0.0)


def _rulesets_of(benchmark: Any) -> tuple[str, ...]:
    from harness import benchmark_rules as rules

    rec = rules.get(benchmark)
    return rec.rulesets if rec is not None else ()


def choose_ruleset(path: str, events: list[Any], given: str | None) -> tuple[str, str]:
    """(ruleset, why) for the logs whose first is `path` (parsed: `events`)."""
    from harness.review import logparse

    if given:
        return given, "given with --ruleset"
    summary, cfg = logparse.read_run_files(path)
    for name, source in (("summary.json", summary), ("config.yaml", cfg)):
        if source and source.get("ruleset"):
            return str(source["ruleset"]), f"the one the run named ({name} beside {path})"
    benchmark = next((e.value for e in events if e.key == "submission_benchmark"), None)
    dated = round_of_date(_first_time(events))
    if dated and dated[0] not in _rulesets_of(benchmark):
        dated = None  # a round without this benchmark: the date is not its round's (a resubmission, a clock)
    if dated:
        ruleset, day = dated
        published = dict(ROUND_PUBLISHED)[ruleset]
        return ruleset, (f"the log's round, told by its date: run on {day}, before round {ruleset[:-2]}'s results "
                         f"({published}) and after the previous round's; --ruleset overrides")
    ruleset = logparse.log_ruleset(path, events, (summary, cfg))
    if ruleset is None:
        raise HarnessError(f"{path}: benchmark {benchmark!r} is not one an MLPerf ruleset knows")
    last = ROUND_PUBLISHED[-1]
    return ruleset, (f"the log does not tell its round (no run files beside it; its date is not within a "
                     f"published round, the last {last[0][:-2]} on {last[1]}): {benchmark}'s newest ruleset; "
                     "give --ruleset to judge it by another")


def _bert_counts_in_train_samples(events: list[Any]) -> bool | None:
    """True when a BERT log's evals cannot carry the samples (every eval's epoch_num below one step's
    samples, e.g. NVIDIA v1.1's constant 1) and a train_samples line does; False when the evals carry them;
    None when the log has no eval to tell."""
    batch = next((e.value for e in events if e.key == "global_batch_size"), None)
    positions = [e.metadata.get("epoch_num") for e in events if e.key in ("eval_accuracy", "eval_error")]
    positions = [p for p in positions if isinstance(p, (int, float))]
    if not positions or not isinstance(batch, (int, float)):
        return None
    has_train_samples = any(e.key == "train_samples" for e in events)
    return has_train_samples and max(positions) < batch


def choose_reading(logs: list[str], parsed: list[list[Any]], benchmark: str, given: str | None) -> Reading:
    """The Reading of `logs` (parsed: `parsed`, one event list per log) for `benchmark`. One HarnessError line
    when BERT logs disagree on where their samples are (the checker reads a set with one option)."""
    ruleset, why = choose_ruleset(logs[0], parsed[0], given)
    if benchmark != "bert":
        return Reading(ruleset, why, False, "")
    kinds = {path: _bert_counts_in_train_samples(events) for path, events in zip(logs, parsed)}
    told = {k for k in kinds.values() if k is not None}
    if len(told) > 1:
        one = next(p for p, k in kinds.items() if k)
        other = next(p for p, k in kinds.items() if k is False)
        raise HarnessError(f"{one} logs its samples in train_samples (evals at epoch_num below the batch), "
                           f"{other} in its evals' epoch_num; the checker reads a set one way: give the logs "
                           "of one implementation")
    if told == {True}:
        return Reading(ruleset, why, True, "every eval's epoch_num is below one step's samples (the batch), so "
                       "the samples to converge are in train_samples, as the package checker's "
                       "--rcp-bert-train-samples reads them")
    return Reading(ruleset, why, False, "the evals' epoch_num counts samples (the checker's default reading)")
