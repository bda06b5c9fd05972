"""`check --rcp --preflight`: simulated result sets from pilot runs, judged by mlperf-logging's RCP code.

Public sets (tests/data/rcp_pilots/, see its README) used as pilots must get the verdict the real checker
gave the whole set; generated sets faster than the RCP must be flagged."""
from __future__ import annotations

import json
import os

import pytest
from mlperf_logging.rcp_checker import rcp_checker as official

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.review import rcp
from harness.review.rcp_preflight import (Pilot, preflight, rcp_checker, simulate, tolerated_failures,
                                          verdict)

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
    assert p.pass_converged >= 0.85 and verdict(p) != "LIKELY FAIL"
    # Faster than the RCP mean within the allowed speedup: normalized, by about the checker's factor.
    assert 1.0 < p.norm_expected < 1.05 and p.normalized_share > 0.3
    assert p.pass_all < p.pass_converged  # clean pilots still leave a failure rate


def test_public_bert_set_with_a_failed_run_counts_it_as_a_failure():
    passed, message, factor = checker_on(BERT, "4.0.0")
    assert passed and message == "RCP found" and factor == 1.0  # slower than the RCP mean: not normalized
    p = preflight([BERT], "4.0.0", simulations=SIMS)
    assert [pl.value is None for pl in p.pilots].count(True) == 1
    assert p.pass_converged >= 0.85 and p.norm_expected < 1.02
    assert p.failure_rate == pytest.approx(1.5 / 11, rel=0.05)  # Beta(1 + 1/2, 9 + 1/2) mean
    assert p.pass_all < p.pass_converged - 0.2
    assert p.launch is not None and p.launch > p.runs


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
    three = preflight([os.path.join(folder, f"result_{i}.txt") for i in range(3)], "6.0.0", simulations=SIMS)
    assert three.pass_converged < 0.1 and verdict(three) == "LIKELY FAIL"


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
    assert p.pass_converged > 0.9 and p.norm_expected < 1.01


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


def test_runs_to_launch_grow_with_failed_pilots(tmp_path):
    mean = rcp_mean("llama31_8b", "6.0.0", 32)
    clean = preflight([write_set(tmp_path / "a", "llama31_8b", 32, [1.05 * mean] * 4)], "6.0.0", simulations=2000)
    failing = preflight([write_set(tmp_path / "b", "llama31_8b", 32, [1.05 * mean] * 4 + [None, None])], "6.0.0",
                        simulations=2000)
    assert clean.runs < clean.launch < failing.launch
    assert failing.pass_all < clean.pass_all


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
    for args, words in [(["--ruleset", "4.0.0"], "no reference convergence points for llama31_8b"),
                        (["--confidence", "1.5"], "strictly between 0 and 1")]:
        proc = cli_in_process("check", "--rcp", "--preflight", a, a, *args)
        assert proc.returncode == 2 and words in "".join(stderr_error_lines(proc)), proc.stderr
    proc = cli_in_process("check", "--preflight", a, a)
    assert proc.returncode == 2 and "--preflight goes with --rcp" in proc.stderr
    with pytest.raises(HarnessError, match="at least 2"):
        preflight([a], "6.0.0")


def test_cli_on_public_pilots_prints_probability_normalization_and_runs_to_launch():
    proc = run_cli("check", "--rcp", "--preflight", LORA, "--ruleset", "4.0.0", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "RCP preflight: llama2_70b_lora, ruleset 4.0.0, global batch 128, 10 pilot run(s)" in out
    assert "pass probability, sets of 10 converged runs: 0.9" in out
    assert "expected normalization factor (the checker's, over passing sets): 1.0" in out
    assert "runs to launch: " in out and "verdict: " in out
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
            assert p.runs == official.submission_runs["training"][bench.key] and p.tolerated >= 1
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
    assert 0.2 < p.pass_converged < 0.9 and p.launch is not None
