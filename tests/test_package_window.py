"""The window of N consecutive runs `package` submits from M launched runs (MLPerf training rules, Scoring),
worked by hand on synthetic run summaries: no logs, no processes."""
from __future__ import annotations

import math
import os

import pytest

from harness.errors import HarnessError
from harness.review.logparse import RunSummary
from harness.submission.runs import Launched, Run
from harness.submission.window import median_window, select

pytestmark = pytest.mark.quick


def launched(minutes: list[float | None]) -> list[Launched]:
    """Runs in launch order; None: a run that failed (did not converge) but left a log."""
    out = []
    for i, m in enumerate(minutes):
        summary = RunSummary(path=f"r{i}", benchmark="resnet", seed=i + 1,
                             status="success" if m is not None else "aborted", time_to_train_min=m)
        run = Run(log=f"r{i}", events=[], summary=summary, run_json=None, config=None, data_source=None)
        out.append(Launched(f"run {i + 1}", summary.status, run))
    return out


def test_the_median_window_of_consecutive_runs_is_submitted_failed_runs_counted():
    # windows of 5: [10..50] -> mean(20, 30, 40) = 30; [20..60] -> 40; [30, 40, 50, 60, failed] -> 50
    sel = select(launched([10, 20, 30, 40, 50, 60, None]), 5, "resnet")
    assert sel.scores == [30, 40, 50] and sel.start == 1
    assert [e.label for e in sel.chosen] == ["run 2", "run 3", "run 4", "run 5", "run 6"]
    record = sel.record()
    assert record["window_start"] == 2 and [r["chosen"] for r in record["runs_in_launch_order"]] == [
        False, True, True, True, True, True, False]
    assert "runs 2-6 score 40.0000 min, the median window" in sel.why


def test_the_fast_window_is_not_picked_and_an_even_count_takes_the_slower_middle():
    # launch order, not speed: the fastest runs come last, yet the median window is submitted
    sel = select(launched([50, 40, 30, 20, 10, 5]), 5, "resnet")
    assert sel.scores == [30, 20] and sel.start == 0  # two windows: the slower of the middle two
    assert median_window([3.0, 1.0, 2.0, 4.0]) == 0  # sorted 1, 2, 3, 4: the upper middle, 3.0, starts at 0
    assert median_window([2.0, 2.0, 2.0]) == 1  # ties keep launch order


def test_an_invalid_median_window_invalidates_the_result():
    # two failed runs in a window of 5 make it invalid (infinite); the median of [inf, inf, 40] is inf
    with pytest.raises(HarnessError, match="holds more than one failed run, so the rules make the whole result"):
        select(launched([10, None, None, 20, 30, 40, 50]), 5, "resnet")


def test_a_crashed_run_counts_but_cannot_be_packaged():
    runs = launched([10, 20, 30, 40, 50, 60, 70])
    runs[3] = Launched("run 4", "crashed")  # no log: counted as failed
    sel_scores = select(launched([10, 20, 30, 40, 50, 60, 70]), 5, "resnet").scores
    assert sel_scores == [30, 40, 50]
    with pytest.raises(HarnessError, match="holds run 4, which crashed and left no result log"):
        select(runs, 5, "resnet")
    assert math.isinf(max(select(launched([10, 20, 30, 40, 50, None]), 5, "resnet").scores + [math.inf]))


def test_too_few_runs_are_refused():
    with pytest.raises(HarnessError, match=r"4 resnet run\(s\) given; MLPerf training requires exactly 5"):
        select(launched([1, 2, 3, 4]), 5, "resnet")


# ------------------------------------------------------------------ the package checker's RCP bypass

def test_an_rcp_bypass_passes_only_when_asked(tmp_path, monkeypatch):
    """A closed tree the package checker fails on RCP alone: the bypass run is a failure unless asked for."""
    from harness.submission import official

    def tool(args, log_path, timeout=600):
        if "--rcp-bypass" in args:
            return 0, official.PACKAGE_SUCCESS
        return 0, "ERROR - RCP Test Failed: RCP found\nERROR - PACKAGE CHECKER FOUND ERRORS, LOOK INTO ERROR LOG"

    monkeypatch.setattr(official, "_tool", tool)
    plain, bypass = official.run_package_checker("org", "6.1.0", str(tmp_path), bypass_asked=False)
    assert plain.verdict == "FAIL" and plain.detail == "only the RCP check failed"
    assert bypass.verdict == "FAIL" and "was not asked for (--rcp_bypass)" in bypass.detail and not bypass.ok
    plain, bypass = official.run_package_checker("org", "6.1.0", str(tmp_path), bypass_asked=True)
    assert bypass.verdict == "BYPASSED" and "as asked by --rcp_bypass" in bypass.detail
    # the RCP rules judge the closed division only
    assert official.run_rcp_checker("d", "llama31_8b", "6.1.0", "open", str(tmp_path), False).verdict == "n/a"


# ------------------------------------------------------------------ the source a package ships

def test_the_source_is_the_commit_with_a_dirty_runs_changes_applied(tmp_path):
    from harness import sysinfo
    from harness.submission import tree

    commit = sysinfo._git("rev-parse", "HEAD")
    if not commit:
        pytest.skip("not a git checkout")
    changes = ("untracked files not recorded (not source, or over 1 MB): data.bin\n"
               "diff --git a/zz_new.py b/zz_new.py\nnew file mode 100644\n--- /dev/null\n+++ b/zz_new.py\n"
               "@@ -0,0 +1 @@\n+x = 1\n")
    dest = tree.write_source(str(tmp_path), commit, changes)
    assert (tmp_path / "mlperf-harness" / "zz_new.py").read_text() == "x = 1\n"
    assert (tmp_path / "harness_changes.diff").read_text() == changes
    assert (tmp_path / "mlperf-harness" / "harness" / "submission" / "tree.py").exists()
    assert not (tmp_path / "mlperf-harness" / sysinfo.COMMIT_FILE).exists()  # a dirty source names no clean commit
    clean = tree.write_source(str(tmp_path / "clean"), commit, "")
    assert open(os.path.join(clean, sysinfo.COMMIT_FILE)).read().strip() == commit and dest != clean
