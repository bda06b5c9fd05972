"""`check --rcp --preflight`: simulated result sets from pilot runs, judged by mlperf-logging's RCP code.

Public sets (tests/data/rcp_pilots/, see its README) used as pilots must get the verdict the real checker
gave the whole set; generated sets faster than the RCP must be flagged."""
from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest
from mlperf_logging.rcp_checker import rcp_checker as official

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.review import rcp
from harness.review.rcp_preflight import (MAX_LAUNCH, Pilot, median_windows, preflight, rcp_checker, simulate,
                                          tolerated_failures, verdict, window_scores)

from conftest import REPO, cli_in_process, run_cli, stderr_error_lines

pytestmark = pytest.mark.quick

PILOTS = os.path.join(REPO, "tests", "data", "rcp_pilots")
LORA = os.path.join(PILOTS, "nvidia_eos_n128_llama2_70b_lora")
BERT = os.path.join(PILOTS, "nvidia_eos_n8_bert")
SIMS = 4000  # enough for the bounds below; the CLI's 20,000 is for the user's second decimal


def checker_on(folder: str, ruleset: str) -> tuple[bool, str, float]:
    """The installed RCP checker on a whole folder, as the package checker calls it."""
    with rcp._quiet_logging():
        return official.check_directory(folder, "training", ruleset, False, False, rcp_pass="pruned_rcps")


def write_log(path, benchmark: str, batch: int, converged_at: float | None) -> str:
    """A log with what the RCP reader reads: benchmark, batch, evals (samples and epochs), run_stop."""
    def line(key, value=None, **metadata):
        return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                         "key": key, "value": value, "metadata": metadata})

    at = converged_at if converged_at is not None else 1_000_000
    out = [line("submission_benchmark", benchmark), line("global_batch_size", batch),
           line("seed", zlib.crc32(str(path).encode())),  # runs differ: copies of one log are refused
           line("eval_accuracy", 3.0, samples_count=at, epoch_num=at),
           line("run_stop", status="success" if converged_at is not None else "aborted")]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return str(path)


def write_set(folder, benchmark: str, batch: int, values: list[float | None]) -> str:
    folder.mkdir(exist_ok=True)
    for i, v in enumerate(values):
        write_log(folder / f"result_{i}.txt", benchmark, batch, v)
    return str(folder)


def rcp_mean(benchmark: str, ruleset: str, batch: int) -> float:
    with rcp._quiet_logging():
        checker = official.RCP_Checker("training", ruleset, benchmark, False)
        return float(rcp.checker_record(checker, batch)[1]["RCP Mean"])


# ------------------------------------------------------------------------------ public result sets

def test_public_lora_set_as_pilots_gets_the_checkers_verdict_and_normalization():
    passed, message, factor = checker_on(LORA, "4.0.0")
    assert passed and message == "RCP found"
    assert factor == pytest.approx(1.0202898550724637)  # the scaling.json published with the set
    p = preflight([LORA], "4.0.0", simulations=SIMS)
    assert (p.benchmark, p.batch, p.runs, p.record) == ("llama2_70b_lora", 128, 10, "llama2_70b_lora_ref_128")
    assert len(p.converged) == 10 and p.tolerated == 1
    # The checker passed the set: the verdict, from the RCP test alone, says so at the default confidence.
    assert p.pass_converged >= p.confidence == 0.9 and verdict(p) == "LIKELY PASS"
    # Faster than the RCP mean within the allowed speedup: normalized, by about the checker's factor.
    assert 1.0 < p.norm_expected < 1.05 and p.normalized_share > 0.3
    assert p.pass_all < p.pass_converged  # clean pilots still leave a failure rate
    # Its first two runs alone leave the mean uncertain near the limit: at risk, not a failure.
    two = preflight([os.path.join(LORA, f"result_{i}.txt") for i in range(2)], "4.0.0", simulations=SIMS)
    assert 0.5 <= two.pass_converged < 0.9 and verdict(two) == "AT RISK"


def test_public_bert_set_with_a_failed_run_counts_it_as_a_failure():
    passed, message, factor = checker_on(BERT, "4.0.0")
    assert passed and message == "RCP found" and factor == 1.0  # slower than the RCP mean: not normalized
    p = preflight([BERT], "4.0.0", simulations=SIMS)
    assert [pl.value is None for pl in p.pilots].count(True) == 1
    assert p.pass_converged >= 0.9 and p.norm_expected < 1.02 and verdict(p) == "LIKELY PASS"
    assert p.failure_rate == pytest.approx(1.5 / 11, rel=0.05)  # Beta(1 + 1/2, 9 + 1/2) mean
    # The failed pilot shows on the failure-risk line: a set of 10 with at most one failure, by the binomial
    # over the rate's posterior and by the simulated campaigns of 10 runs alike.
    assert p.set_valid == pytest.approx(p.valid[10], abs=0.03) and 0.5 < p.set_valid < 0.75
    assert p.pass_all < p.pass_converged - 0.2
    # Under the MLPerf rules (the median window of 10 consecutive runs) launching more runs hardly moves
    # the odds of a valid result at this failure rate: no count up to 3n reaches 0.9.
    assert p.launch is None and max(p.valid.values()) - p.valid[10] < 0.1


# ------------------------------------------------------------------------------ generated sets

def test_a_set_faster_than_the_rcp_is_flagged(tmp_path):
    """llama31_8b at batch 32 converging 12% below the RCP mean (the speedup limit is a few percent)."""
    mean = rcp_mean("llama31_8b", "6.0.0", 32)
    fast = [0.88 * mean * f for f in (0.98, 1.0, 1.02, 0.99, 1.01, 1.0, 0.97, 1.03, 1.0, 1.0)]
    folder = write_set(tmp_path / "fast", "llama31_8b", 32, fast)
    passed, message, _ = checker_on(folder, "6.0.0")
    assert not passed and message == "RCP found"
    p = preflight([folder], "6.0.0", simulations=SIMS)
    assert p.pass_converged < 0.05 and verdict(p) == "LIKELY FAIL"
    # Three of those pilots say the same.
    three = [os.path.join(folder, f"result_{i}.txt") for i in range(3)]
    p3 = preflight(three, "6.0.0", simulations=SIMS)
    assert p3.pass_converged < 0.1 and verdict(p3) == "LIKELY FAIL"
    proc = cli_in_process("check", "--rcp", "--preflight", *three, "--ruleset", "6.0.0")
    assert proc.returncode == 1 and "verdict: LIKELY FAIL" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("benchmark,ruleset,batch,record", [
    ("gpt_oss_20b", "6.0.0", 16, "gpt_oss_20b_ref_16"),
    ("llama31_8b", "5.1.0", 48, "interpolated between batch 32 and 64"),
    ("llama2_70b_lora", "5.0.0", 4, "smallest-batch RCP"),
    ("gpt3", "4.1.0", 8192, "gpt3_ref_8192"),  # converges past 1e9, the reader's "not converged" value
])
def test_slow_pilots_pass_on_exact_interpolated_and_smallest_batch_records(tmp_path, benchmark, ruleset, batch,
                                                                            record):
    mean = rcp_mean(benchmark, ruleset, batch)
    p = preflight([write_set(tmp_path / "p", benchmark, batch, [1.10 * mean, 1.14 * mean])], ruleset,
                  simulations=SIMS)
    assert p.record.startswith(record)
    assert p.pass_converged > 0.9 and p.norm_expected < 1.01 and verdict(p) == "LIKELY PASS"


def test_same_pilots_same_numbers_and_the_spread_is_floored(tmp_path):
    mean = rcp_mean("llama31_8b", "6.0.0", 32)
    folder = write_set(tmp_path / "p", "llama31_8b", 32, [0.97 * mean, 0.97 * mean, 0.97 * mean])
    a = preflight([folder], "6.0.0", simulations=2000)
    b = preflight([folder], "6.0.0", simulations=2000)
    assert (a.pass_converged, a.pass_all, a.norm_expected, a.launch) == \
           (b.pass_converged, b.pass_all, b.norm_expected, b.launch)
    # Identical pilots have no spread of their own; the RCP's keeps the outcome uncertain.
    assert a.pilot_sigma == 0 and a.rcp_sigma > 0.02
    assert 0.05 < a.pass_converged < 0.999


def test_the_non_converged_runs_a_set_may_hold_come_from_the_checker():
    assert tolerated_failures("bert", "4.0.0", 10) == 1
    assert tolerated_failures("unet3d", "4.0.0", 40) == 4
    assert tolerated_failures("stable_diffusion", "4.0.0", 10) == 1


def test_windows_are_scored_and_picked_as_the_mlperf_scoring_rules_say():
    """Sets of 3 consecutive runs, 1 failure tolerated (dropped as the slowest), the median set submitted."""
    values = np.array([[10.0, 20, 30, 40, 50]] * 3)
    failed = np.array([[0, 0, 1, 0, 0],    # windows [10 20 F] [20 F 40] [F 40 50]
                       [0, 1, 1, 0, 0],    # [10 F F] [F F 40] invalid, [F 40 50]
                       [0, 0, 0, 0, 0]], bool)
    scores = window_scores(values, failed, 3, 1)
    inf = np.inf
    assert scores.tolist() == [[20, 40, 50], [inf, inf, 50], [20, 30, 40]]
    # 5 runs: 3 windows, the middle score; 4 runs: 2 windows, the slower; 3 runs: the one window.
    assert median_windows(scores, 5, 3).tolist() == [1, 0, 1]
    assert median_windows(scores, 4, 3).tolist() == [1, 1, 1]
    assert median_windows(scores, 3, 3).tolist() == [0, 0, 0]
    # The second campaign's median window is invalid, so its whole result is.
    starts = median_windows(scores, 5, 3)
    assert np.isfinite(scores[np.arange(3), starts]).tolist() == [True, False, True]


def test_runs_to_launch_follow_the_failure_rate(tmp_path):
    mean = rcp_mean("llama31_8b", "6.0.0", 32)
    few = preflight([write_set(tmp_path / "a", "llama31_8b", 32, [1.05 * mean] * 4)], "6.0.0", simulations=2000)
    failing = preflight([write_set(tmp_path / "b", "llama31_8b", 32, [1.05 * mean] * 4 + [None, None])], "6.0.0",
                        simulations=2000)
    many = preflight([write_set(tmp_path / "c", "llama31_8b", 32, [1.05 * mean] * 40)], "6.0.0", simulations=2000)
    n = few.runs
    assert sorted(few.valid) == list(range(n, MAX_LAUNCH * n + 1))
    assert all(failing.valid[m] < few.valid[m] - 0.2 for m in few.valid)
    # Failed pilots: no count of runs launched makes a valid result likely (the median window holds failures
    # as often as the windows do).
    assert failing.launch is None and max(failing.valid.values()) < 0.6
    # Forty clean pilots bound the rate well below what a window tolerates.
    assert many.launch is not None and many.valid[many.launch] >= 0.9
    assert failing.pass_all < few.pass_all < many.pass_all


# ------------------------------------------------------------------------------ bad input and CLI

def test_bad_pilots_are_one_error_line_each(tmp_path):
    mean = rcp_mean("llama31_8b", "6.0.0", 32)
    a = write_log(tmp_path / "a.txt", "llama31_8b", 32, mean)
    b = write_log(tmp_path / "b.txt", "llama31_8b", 64, mean)
    c = write_log(tmp_path / "c.txt", "gpt_oss_20b", 32, mean)
    d = write_log(tmp_path / "d.txt", "llama31_8b", 32, None)
    e = write_log(tmp_path / "e.txt", "llama31_8b", 256, mean)
    f = write_log(tmp_path / "f.txt", "llama31_8b", 256, mean)
    cases = {
        (a,): "at least 2 pilot runs",
        (a, b): "different global batch sizes: 32",
        (a, c): "pilots must be runs of one benchmark",
        (a, d): "only 1 of 2 pilot runs converged",
        (e, f): "above the largest llama31_8b RCP batch",
    }
    for logs, words in cases.items():
        proc = cli_in_process("check", "--rcp", "--preflight", *logs, "--ruleset", "6.0.0")
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], (logs, proc.stderr)
    a2 = write_log(tmp_path / "a2.txt", "llama31_8b", 32, 1.1 * mean)
    for args, words in [(["--ruleset", "4.0.0"], "no reference convergence points for llama31_8b"),
                        (["--confidence", "1.5"], "strictly between 0 and 1")]:
        proc = cli_in_process("check", "--rcp", "--preflight", a, a2, *args)
        assert proc.returncode == 2 and words in "".join(stderr_error_lines(proc)), proc.stderr
    proc = cli_in_process("check", "--preflight", a, a2)
    assert proc.returncode == 2 and "--preflight goes with --rcp" in proc.stderr
    with pytest.raises(HarnessError, match="at least 2"):
        preflight([a], "6.0.0")


def test_cli_on_public_pilots_prints_probability_normalization_and_runs_to_launch():
    proc = run_cli("check", "--rcp", "--preflight", LORA, "--ruleset", "4.0.0", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "RCP preflight: llama2_70b_lora, ruleset 4.0.0, global batch 128, 10 pilot run(s)" in out
    assert "    pass probability: 0.9" in out
    assert "expected normalization factor (the checker's, over passing sets): 1.0" in out
    assert "failure risk (not in the verdict): 0 of 10 pilots did not converge" in out
    assert "P(a set of 10 holds at most 1 failed run(s)" in out and "P(valid result)" in out
    assert "    runs to launch: " in out and "verdict: LIKELY PASS (RCP pass probability 0.9" in out
    assert "Traceback" not in proc.stderr and "WARNING" not in out + proc.stderr


def test_every_benchmark_and_ruleset_with_rcps_is_simulated():
    """Every benchmark with RCPs, at its oldest and newest RCP ruleset, one record each: slow pilots pass,
    with the checker's count of runs. (Every pruned record of every ruleset, 317 in mlperf-logging 4.1.68,
    was run the same way once, slow and fast pilots; too slow to repeat in the quick suite.)"""
    checked = 0
    for bench in rules.BENCHMARKS.values():
        for ruleset in sorted(set(bench.rcp[:1] + bench.rcp[-1:])):
            record = next(iter(rcp_checker(bench.key, ruleset).pruned_rcp_data.values()))
            mean = float(record["RCP Mean"])
            p = simulate(bench.key, ruleset, record["BS"], [Pilot("a", 1.10 * mean), Pilot("b", 1.14 * mean)],
                         simulations=200)
            # n is the installed checker's; the harness's own table (campaign, package) must agree with it.
            assert p.runs == rules.runs_required(bench.key) and p.tolerated >= 1
            assert p.pass_converged > 0.8 and p.norm_expected == pytest.approx(1.0, abs=0.01), (bench.key, ruleset)
            checked += 1
    assert checked >= 25


def test_check_rcp_reads_gpt3_runs_past_1e9_as_converged(tmp_path):
    """The reader marks a non-converged run with 1e9; gpt3 converges past that, and its status decides."""
    mean = rcp_mean("gpt3", "4.1.0", 8192)
    r = rcp.rcp_report([write_set(tmp_path / "g", "gpt3", 8192, [1.05 * mean] * 3)], "4.1.0")
    assert all(run.converged for run in r.runs) and r.verdict == "PASS"


def test_two_far_apart_pilots_give_finite_draws():
    """Two pilots leave the spread's posterior with one degree of freedom; its tail must not overflow."""
    import warnings

    mean = rcp_mean("llama31_8b", "6.0.0", 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        p = simulate("llama31_8b", "6.0.0", 32, [Pilot("a", 0.5 * mean), Pilot("b", 2.0 * mean)], simulations=20_000)
    assert 0.2 < p.pass_converged < 0.9 and all(0 < v < 1 for v in p.valid.values())


def odd_log(path, eval_metadata: str, eval_line_cut: int | None = None) -> str:
    """A resnet log whose eval line has `eval_metadata` (JSON text), cut after `eval_line_cut` characters."""
    head = '{"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
    eval_line = f':::MLLOG {head}"key": "eval_accuracy", "value": 0.76, "metadata": {eval_metadata}}}'
    lines = [f':::MLLOG {head}"key": "submission_benchmark", "value": "resnet", "metadata": {{}}}}',
             f':::MLLOG {head}"key": "global_batch_size", "value": 3264, "metadata": {{}}}}',
             eval_line[:eval_line_cut],
             f':::MLLOG {head}"key": "run_stop", "value": null, "metadata": {{"status": "success"}}}}']
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("mode", ["--preflight", None])
def test_logs_the_rcp_reader_cannot_read_are_one_error_line_naming_the_file(tmp_path, mode):
    """The same refusals from `check --rcp` and its preflight: the reader's KeyError, JSONDecodeError, a
    count <= 0, and one log reached twice (as the same path, and as a file and its directory)."""
    good = odd_log(tmp_path / "good.txt", '{"epoch_num": 40}')
    other = odd_log(tmp_path / "other.txt", '{"epoch_num": 41}')
    folder = tmp_path / "set"
    folder.mkdir()
    inside = odd_log(folder / "result_0.txt", '{"epoch_num": 39}')
    cases = {
        odd_log(tmp_path / "noepoch.txt", '{"samples_count": 40}'): "cannot read this log (missing key 'epoch_num')",
        odd_log(tmp_path / "cut.txt", '{"epoch_num": 40}', eval_line_cut=-4): "cannot read this log (JSONDecodeError",
        odd_log(tmp_path / "noeval.txt", '{"epoch_num": 40}', eval_line_cut=0):
            "cannot read this log (a successful run_stop with no eval line before it)",
        odd_log(tmp_path / "zero.txt", '{"epoch_num": 0}'): "converged at 0 epochs; a run needs a positive count",
        odd_log(tmp_path / "minus.txt", '{"epoch_num": -3}'): "converged at -3 epochs",
    }
    flags = ["--rcp"] + ([mode] if mode else [])
    for bad, words in cases.items():
        proc = cli_in_process("check", *flags, good, other, bad, "--ruleset", "4.0.0")
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"error: {bad}: ") and words in lines[0], lines[0]
    for logs, named in [((good, other, good), f"{good}: the same log as {good}"),
                        ((inside, other, str(folder)), f"{inside}: the same log as {inside}")]:
        proc = cli_in_process("check", *flags, *logs, "--ruleset", "4.0.0")
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_confidence_is_refused_where_nothing_reads_it(tmp_path):
    log = odd_log(tmp_path / "good.txt", '{"epoch_num": 40}')
    for args in (["check", log], ["check", "--rcp", log], ["list"]):
        proc = cli_in_process(*args, "--confidence", "0.5")
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1 and "--confidence goes with check --rcp --preflight" in \
            lines[0], (args, proc.stderr)
