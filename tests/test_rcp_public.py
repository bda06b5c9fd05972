"""`check --rcp` and its preflight read public logs as the official RCP checker reads them: the round's
ruleset, told from the log, and the checker's own options (BERT's --bert_train_samples), with the same
verdict as mlperf-logging's `check_directory` called the way that round's submitters called it."""
from __future__ import annotations

import datetime
import json
import os
import zlib

import pytest
from mlperf_logging.rcp_checker import rcp_checker as official

from harness.errors import HarnessError
from harness.review import rcp, rcp_reading
from harness.review.rcp_preflight import preflight, verdict

from conftest import REPO, cli_in_process, stderr_error_lines

pytestmark = pytest.mark.quick

DATA = os.path.join(REPO, "tests", "data")
V11_BERT = os.path.join(DATA, "public_bert_unpad", "training_results_v1.1", "NVIDIA", "results",
                        "dgxa100_ngc21.09_pytorch", "bert")
V10_BERT = os.path.join(DATA, "public_bert_unpad", "training_results_v1.0", "NVIDIA", "results",
                        "dgxa100_ngc21.05_pytorch", "bert")
V40_LORA = os.path.join(DATA, "rcp_pilots", "nvidia_eos_n128_llama2_70b_lora")
V40_BERT = os.path.join(DATA, "rcp_pilots", "nvidia_eos_n8_bert")  # NVIDIA's v4.0 BERT set, run in May 2023


def official_verdict(folder: str, ruleset: str, train_samples: bool) -> tuple[bool, str]:
    """mlperf-logging's check_directory as the package checker calls it (pruned RCPs)."""
    with rcp._quiet_logging():
        passed, message, _ = official.check_directory(folder, "training", ruleset, False, train_samples,
                                                      rcp_pass="pruned_rcps")
    return passed, message


# (folder, the ruleset its date tells, whether the checker reads train_samples)
PUBLIC = [(V11_BERT, "1.1.0", True), (V10_BERT, "1.0.0", True), (V40_LORA, "4.0.0", False),
          (V40_BERT, "3.0.0", False)]


@pytest.mark.parametrize("folder,ruleset,train_samples", PUBLIC, ids=["v1.1_bert", "v1.0_bert", "v4.0_lora",
                                                                       "v4.0_bert"])
def test_public_sets_get_the_official_verdict_with_the_official_options(folder, ruleset, train_samples):
    passed, message = official_verdict(folder, ruleset, train_samples)
    r = rcp.rcp_report([folder])
    assert (r.ruleset, r.reading.train_samples) == (ruleset, train_samples)
    assert r.verdict == ("PASS" if passed else "FAIL") and r.detail == message
    assert passed  # every one of these sets was accepted in its round


def test_v11_bert_reads_train_samples_at_the_interpolated_rcp():
    """NVIDIA's v1.1 BERT set: `epoch_num: 1` in every eval, the samples in train_samples. Read as the
    checker reads it with --bert_train_samples: olympic mean 2,775,192 samples against the interpolated
    RCP mean 2,563,898 (bert_ref_448 is pruned); hyperparameters against both neighbours, not one."""
    r = rcp.rcp_report([V11_BERT])
    assert r.verdict == "PASS" and r.olympic_mean == pytest.approx(2_775_192)
    assert r.record == "interpolated between batch 256 and 3072" and r.rcp_mean == pytest.approx(2_563_898, abs=1)
    assert r.mismatches == [] and set(r.neighbours) == {"bert_ref_256", "bert_ref_3072"}
    assert any("opt_learning_rate_training_steps: RCP 13700" in m for m in r.neighbours["bert_ref_256"])
    proc = cli_in_process("check", "--rcp", V11_BERT)
    out = proc.stdout
    assert proc.returncode == 0 and "official rcp_checker: PASS (RCP Interpolation)" in out, out + proc.stderr
    assert "ruleset 1.1.0: the log's round, told by its date: run on 2021-10-16" in out
    assert "read with --bert_train_samples: every eval's epoch_num is below one step's samples" in out
    assert "against both neighbours" in out and "differ from the RCP entry at this batch" not in out
    # The checker's default reading (epoch_num) would see 1 sample per run; the option is what reads them.
    assert official_verdict(V11_BERT, "1.1.0", False)[0] is False


def test_v11_bert_preflight_on_three_runs_is_not_likely_fail():
    three = [os.path.join(V11_BERT, f"result_{i}.txt") for i in range(3)]
    p = preflight(three, simulations=2000)
    assert p.ruleset == "1.1.0" and p.reading.train_samples
    assert [pl.value for pl in p.pilots] == [2_550_016, 3_000_256, 2_400_384]
    assert verdict(p) != "LIKELY FAIL" and p.pass_converged > 0.5


def test_an_explicit_ruleset_wins_and_is_said():
    r = rcp.rcp_report([V40_BERT], "4.0.0")
    assert r.ruleset == "4.0.0" and r.reading.ruleset_why == "given with --ruleset" and r.verdict == "PASS"


def _log(path, benchmark: str, batch: int, at: float, when: str, train_samples: float | None = None,
         eval_epoch: float | None = None) -> str:
    """A log in the form a round's logs take: the RCP reader's keys, time_ms on the given day."""
    ms = int(datetime.datetime.fromisoformat(when).replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)

    def line(key, value=None, **metadata):
        return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": ms, "event_type": "POINT_IN_TIME",
                                         "key": key, "value": value, "metadata": metadata})

    epoch = at if eval_epoch is None else eval_epoch
    out = [line("submission_benchmark", benchmark), line("global_batch_size", batch),
           line("seed", zlib.crc32(str(path).encode())), line("eval_accuracy", 0.9, epoch_num=epoch, samples_count=at)]
    if train_samples is not None:
        out.append(line("train_samples", train_samples))
    out.append(line("run_stop", status="success"))
    path.write_text("\n".join(out) + "\n")
    return str(path)


# Generated sets for the round families without a committed public set: (benchmark, batch, day, ruleset)
GENERATED = [("bert", 4608, "2022-10-01", "2.1.0"), ("resnet", 3264, "2024-03-01", "4.0.0"),
             ("llama2_70b_lora", 8, "2025-04-01", "5.0.0"), ("llama31_8b", 32, "2025-10-01", "5.1.0")]


@pytest.mark.parametrize("benchmark,batch,day,ruleset", GENERATED)
def test_generated_round_logs_get_the_official_verdict(tmp_path, benchmark, batch, day, ruleset):
    with rcp._quiet_logging():
        checker = official.RCP_Checker("training", ruleset, benchmark, False)
        mean = float(rcp.checker_record(checker, batch)[1]["RCP Mean"])
    for speed, folder in ((1.03, tmp_path / "slow"), (0.7, tmp_path / "fast")):
        folder.mkdir()
        for i in range(10):
            value = speed * mean * (1 + 0.01 * (i - 5))
            value = round(value, 2) if benchmark == "resnet" else int(value)
            _log(folder / f"result_{i}.txt", benchmark, batch, value, day)
        passed, message = official_verdict(str(folder), ruleset, False)
        r = rcp.rcp_report([str(folder)])
        assert r.ruleset == ruleset and not r.reading.train_samples
        assert r.verdict == ("PASS" if passed else "FAIL") and passed == (speed > 1), (speed, message)


def test_a_log_of_a_round_not_yet_dated_takes_the_newest_ruleset_and_says_so(tmp_path):
    """The 6.x rounds: no published results to date them by, so the benchmark's newest ruleset, said so."""
    with rcp._quiet_logging():
        checker = official.RCP_Checker("training", "6.1.0", "gpt_oss_20b", False)
        mean = float(rcp.checker_record(checker, 16)[1]["RCP Mean"])
    for i in range(10):
        _log(tmp_path / f"result_{i}.txt", "gpt_oss_20b", 16, int(1.02 * mean) + 1000 * i, "2026-09-01")
    r = rcp.rcp_report([str(tmp_path)])
    assert r.ruleset == "6.1.0" and "does not tell its round" in r.reading.ruleset_why
    assert r.verdict == ("PASS" if official_verdict(str(tmp_path), "6.1.0", False)[0] else "FAIL") == "PASS"


def test_round_dates_and_undatable_logs():
    ms = lambda day: datetime.datetime.fromisoformat(day).replace(tzinfo=datetime.timezone.utc).timestamp() * 1000  # noqa: E731
    assert rcp_reading.round_of_date(ms("2021-10-16"))[0] == "1.1.0"
    assert rcp_reading.round_of_date(ms("2021-12-02"))[0] == "2.0.0"
    assert rcp_reading.round_of_date(1) is None  # a made-up time stamp tells nothing
    assert rcp_reading.round_of_date(ms("2026-03-01")) is None  # after the last published round


def test_bert_logs_read_two_ways_in_one_set_are_one_error_line(tmp_path):
    a = _log(tmp_path / "result_0.txt", "bert", 448, 2_600_000, "2021-10-01", train_samples=2_600_000, eval_epoch=1)
    b = _log(tmp_path / "result_1.txt", "bert", 448, 2_650_000, "2021-10-01", train_samples=2_650_000)
    proc = cli_in_process("check", "--rcp", a, b)
    lines = stderr_error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1 and "the checker reads a set one way" in lines[0], proc.stderr
    with pytest.raises(HarnessError, match="logs its samples in train_samples"):
        rcp.rcp_report([a, b])


def test_copies_of_one_pilot_are_refused(tmp_path):
    """Fault case: one log under five names was read as five pilots with no spread."""
    src = os.path.join(V11_BERT, "result_0.txt")
    for i in range(5):
        (tmp_path / f"result_{i}.txt").write_bytes(open(src, "rb").read())
    for flags in (["--rcp", "--preflight"], ["--rcp"]):
        proc = cli_in_process("check", *flags, str(tmp_path))
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1 and "a copy of" in lines[0], proc.stderr


def test_a_date_in_a_round_without_the_benchmark_tells_nothing(tmp_path):
    """llama31_8b came in 5.1: a log dated in the 5.0 round is not that round's (a clock, a resubmission)."""
    from harness.review import logparse

    path = _log(tmp_path / "result_0.txt", "llama31_8b", 32, 1_000_000, "2025-03-01")
    ruleset, why = rcp_reading.choose_ruleset(path, logparse.parse_log(path), None)
    assert ruleset == "6.1.0" and "does not tell its round" in why
