"""Which N runs of a campaign of M >= N are submitted: the window of N consecutive runs the scoring rules name.

MLPerf training rules, Scoring (github.com/mlcommons/training_policies@d73e20f:training_rules.adoc): a
submitter may launch M > N runs, sort them by an objective, deterministic order (launch time), take every
window of N consecutive runs, score each olympically with a failed run counting as infinitely slow (a window
that would be an invalid result scores infinite), and must submit the window with the median score; if that
median window is invalid, the whole result is invalid. Choosing another ordering or another window is the
prohibited cherry-picking. With an even number of windows the rules name no single median: the slower of the
two middle windows is taken (harness/review/rcp_preflight.py draws its launch advice with the same choice).
"""
from __future__ import annotations

import dataclasses
import math

from harness.errors import HarnessError
from harness.review import scoring
from harness.review.logparse import RunSummary
from harness.submission.runs import Launched

RULE = ("MLPerf training rules, Scoring: of M runs in launch order, every window of N consecutive runs is "
        "scored olympically (a failed run is infinitely slow) and the median window is submitted")


@dataclasses.dataclass
class Selection:
    """The submitted window: `chosen` (N runs, launch order) out of `launched` (M runs), and why."""
    launched: list[Launched]
    chosen: list[Launched]
    start: int  # index of the window's first run in `launched`
    scores: list[float]  # olympic score (minutes) of every window, by start; inf for an invalid window
    why: str

    def record(self) -> dict:
        """What package_report.json keeps of the choice."""
        return {
            "rule": RULE, "launched": len(self.launched), "window_size": len(self.chosen),
            "window_start": self.start + 1, "why": self.why,
            "runs_in_launch_order": [{"label": e.label, "status": e.status, "failed": e.failed,
                                      "log": e.run.log if e.run else None,
                                      "chosen": self.start <= i < self.start + len(self.chosen)}
                                     for i, e in enumerate(self.launched)],
            "window_scores_min": [None if math.isinf(s) else round(s, 6) for s in self.scores],
        }


def _summary(entry: Launched) -> RunSummary:
    if entry.run is not None:
        return entry.run.summary
    failed = RunSummary(path=entry.label)
    failed.status = entry.status
    return failed


def window_scores(launched: list[Launched], n: int, benchmark: str) -> list[float]:
    """The olympic score of each window of `n` consecutive runs; inf where the harness's scoring gives none."""
    scores = []
    for start in range(len(launched) - n + 1):
        score = scoring.olympic_score([_summary(e) for e in launched[start:start + n]], benchmark=benchmark)
        scores.append(score.score_min if score.score_min is not None else math.inf)
    return scores


def median_window(scores: list[float]) -> int:
    """Start of the median window: windows sorted by score (ties: the earlier one first); for an even count
    the slower of the two middle ones."""
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return order[len(scores) // 2]


def select(launched: list[Launched], n: int, benchmark: str) -> Selection:
    """The window the rules submit from `launched` (launch order); HarnessError when there is none."""
    m = len(launched)
    if m < n:
        raise HarnessError(f"refusing to package: {m} {benchmark} run(s) given; MLPerf training requires "
                           f"exactly {n} (run `mlperf-harness campaign CONFIG --runs {n}`)")
    _refuse_hand_picked(launched)
    scores = window_scores(launched, n, benchmark)
    start = median_window(scores)
    chosen = launched[start:start + n]
    if math.isinf(scores[start]):
        raise HarnessError(f"refusing to package: the median window of {n} consecutive runs (runs {start + 1}-"
                           f"{start + n} of {m} in launch order) holds more than one failed run, so the rules "
                           f"make the whole result invalid")
    no_log = [e for e in chosen if e.run is None]
    if no_log:
        raise HarnessError(f"refusing to package: the window the rules submit (runs {start + 1}-{start + n} of "
                           f"{m}) holds {no_log[0].label}, which {no_log[0].status} and left no result log")
    if m == n:
        why = f"all {n} launched runs (exactly one result set)"
    else:
        finite = [s for s in scores if not math.isinf(s)]
        why = (f"{m} runs launched: {len(scores)} windows of {n} consecutive runs in launch order, scored "
               f"olympically ({len(scores) - len(finite)} invalid); runs {start + 1}-{start + n} score "
               f"{scores[start]:.4f} min, the median window")
    return Selection(launched, chosen, start, scores, why)


def _refuse_hand_picked(launched: list[Launched]) -> None:
    """Runs of one campaign given one by one must be all its runs: a subset, consecutive or not, is a hand-picked
    window (package the campaign directory and the rules' window is chosen)."""
    from harness.submission.runs import campaign_runs

    campaigns = {e.campaign for e in launched if e.campaign is not None}
    for folder in sorted(campaigns):
        given = sorted(e.index for e in launched if e.campaign == folder and e.index is not None)
        total = campaign_runs(folder)
        if len(given) == len(total):
            continue
        consecutive = given == list(range(given[0], given[0] + len(given)))
        how = "breaks launch order" if not consecutive else "is a window picked by hand"
        shown = ", ".join(str(i + 1) for i in given[:12])
        raise HarnessError(f"refusing to package: runs {shown} of the {len(total)} runs campaign {folder} "
                           f"launched {how}; package the campaign directory itself and the window the scoring "
                           f"rules submit is chosen and recorded")
