"""Parsing and integrity checks on hand-made logs with known times and on real public v0.7 logs."""

import json
import math
import os

import pytest

from harness.errors import HarnessError
from harness.benchmark_rules import bert_eval_every
from harness.review.integrity import (check_eval_schedule, check_integrity, check_seeds, check_status,
                                     status_target)
from harness.review.logparse import parse_lines, parse_log, summarize

pytestmark = pytest.mark.quick

DATA = os.path.join(os.path.dirname(__file__), "data")
PUBLIC_SSD = os.path.join(DATA, "public_v0.7", "Google", "results", "tpu-v3-8192-TF", "ssd")


def line(key, time_ms, value=None, **metadata):
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": time_ms, "event_type": "POINT_IN_TIME",
                                     "key": key, "value": value, "metadata": metadata})


T0 = 1_600_000_000_000  # a realistic epoch-ms start; time_ms 0 means "untimed" to the checks


def good_log(evals=(4, 8, 12, 16), t_init=T0, stop_status="success", seed=1, benchmark="resnet",
             division="closed", batch=1024):
    """A resnet-like run: init 0->60 s, run_start 60 s, 4-epoch blocks of 50 s, eval 10 s each; the last
    eval (0.76) reaches the closed targets of resnet, bert and ssd."""
    out = [line("submission_benchmark", t_init, benchmark), line("submission_org", t_init, "Org"),
           line("submission_platform", t_init, "sys"), line("submission_division", t_init, division),
           line("init_start", t_init), line("global_batch_size", t_init + 1, batch),
           line("train_samples", t_init + 2, 1000)]
    if seed is not None:
        out.append(line("seed", t_init + 3, seed))
    out += [line("init_stop", t_init + 60_000), line("run_start", t_init + 60_000)]
    t, prev = t_init + 60_000, 0
    for e in evals:
        out.append(line("block_start", t, first_epoch_num=prev, epoch_count=e - prev))
        t += 50_000
        out.append(line("block_stop", t, first_epoch_num=prev))
        out.append(line("eval_start", t, epoch_num=e))
        t += 10_000
        out.append(line("eval_accuracy", t, 0.7 + 0.06 * e / max(evals), epoch_num=e))
        out.append(line("eval_stop", t, epoch_num=e))
        prev = e
    if stop_status is not None:
        out.append(line("run_stop", t + 1, status=stop_status))
    else:
        out.append(line("run_stop", t + 1))
    return out


def codes(findings, severity=None):
    return [f.code for f in findings if severity is None or f.severity == severity]


# ---------------------------------------------------------------- parsing

def test_parse_tolerates_prefixes_garbage_and_broken_lines():
    events = parse_log(os.path.join(DATA, "handmade", "prefixed_v07_style.log"))
    assert [e.key for e in events] == ["submission_benchmark", "init_start", "seed", "init_stop",
                                       "run_start", "run_stop"]
    assert events[1].event_type == "INTERVAL_START" and events[4].event_type == "POINT_IN_TIME"
    assert events[2].value == 42 and events[0].line_no == 3
    s = summarize(events, "x")
    assert s.benchmark == "resnet" and s.seed == 42 and s.status == "success"
    assert s.time_to_train_min == pytest.approx(2.0)
    assert s.init_time_s == pytest.approx(60.0)


def test_the_broken_line_of_the_handmade_log_is_named():
    bad = []
    parse_log(os.path.join(DATA, "handmade", "prefixed_v07_style.log"), bad)
    assert [(b.line_no, b.reason, b.kept) for b in bad] == [(5, "text after the JSON object", True),
                                                            (6, "not JSON: Expecting value at column 70", False)]
    assert bad[1].text.startswith(':::MLLOG {"namespace": "", "time_ms": 1003, "key": "broken"')
    found = check_integrity(parse_log(os.path.join(DATA, "handmade", "prefixed_v07_style.log")), bad_lines=bad)
    assert [(f.severity, f.code) for f in found if f.code in ("unparsable_line", "text_after_event")] == [
        ("error", "unparsable_line"), ("warning", "text_after_event")]
    assert next(f.message for f in found if f.code == "text_after_event").startswith(
        "line 5 has text after the JSON object (read; the official checker cannot parse it): :::MLLOG {")


@pytest.mark.parametrize("payload, reason", [
    ('{"namespace": "", "time_ms": 5, "key": "eval_acc', "not JSON: Unterminated string starting at column"),
    ("[1, 2]", "not a JSON object"),
    ('{"time_ms": 5, "value": 1, "metadata": {}}', "no string 'key'"),
    ('{"key": "eval_accuracy", "value": 1, "metadata": {}}', "no numeric 'time_ms'"),
    ('{"key": "eval_accuracy", "time_ms": "soon", "value": 1, "metadata": {}}', "no numeric 'time_ms'"),
    ('{"key": "eval_accuracy", "time_ms": 5, "metadata": {}}', "no 'value'"),
    ('{"key": "eval_accuracy", "time_ms": 5, "value": 1, "metadata": 3}', "no 'metadata' object"),
])
def test_mllog_lines_that_are_not_events_are_integrity_errors(payload, reason):
    lines = good_log()
    lines.insert(9, "[rank 0] :::MLLOG " + payload)
    bad = []
    events = parse_lines(lines, bad)
    assert len(events) == len(good_log())
    assert len(bad) == 1 and bad[0].line_no == 10 and bad[0].reason.startswith(reason)
    assert bad[0].text == ("[rank 0] :::MLLOG " + payload)[:60] + ("..." if len(payload) > 42 else "")
    errors = [f for f in check_integrity(events, bad_lines=bad) if f.severity == "error"]
    assert [f.code for f in errors] == ["unparsable_line"]
    assert errors[0].message.startswith(f"line 10 is not an MLLOG event ({reason}")
    assert check_integrity(events) == []  # the lines are only known to whoever collected them


def test_many_unparsable_lines_are_capped():
    bad = []
    events = parse_lines(good_log() + [":::MLLOG {"] * 5, bad)
    found = check_integrity(events, bad_lines=bad)
    assert len(found) == 4 and found[-1].message == "... and 2 more MLLOG lines that are not events"


def test_a_log_of_only_unparsable_lines_names_the_first(tmp_path):
    path = tmp_path / "result_0.txt"
    path.write_text(':::MLLOG {"key": "init_start"}\n')
    with pytest.raises(HarnessError, match="line 1 is not an MLLOG event \\(no numeric 'time_ms'\\)"):
        parse_log(str(path))


def test_parse_log_errors_are_harness_errors(tmp_path):
    with pytest.raises(HarnessError, match="no ':::MLLOG'"):
        parse_log(os.path.join(DATA, "handmade", "not_a_log.txt"))
    with pytest.raises(HarnessError, match="cannot read"):
        parse_log(str(tmp_path / "missing.txt"))


def test_summary_fields_from_known_times():
    s = summarize(parse_lines(good_log()), "run.txt")
    assert (s.benchmark, s.org, s.platform, s.division) == ("resnet", "Org", "sys", "closed")
    assert s.global_batch_size == 1024 and s.seed == 1 and s.target == 0.759
    assert s.time_to_train_min == pytest.approx((4 * 60_000 + 1) / 60_000)
    assert s.train_time_s == pytest.approx(200.0) and s.eval_time_s == pytest.approx(40.0)
    assert s.epochs_or_samples_to_converge == 16 and len(s.evals) == 4
    assert s.evals[-1][0] == 16 and s.evals[-1][1] == pytest.approx(0.76)
    # 16 epochs * 1000 samples inside 200 s of blocks
    assert s.throughput == pytest.approx(80.0)


def test_summary_samples_axis_and_missing_pieces():
    lines = [line("submission_benchmark", 1, "bert"), line("run_start", 10),
             line("eval_accuracy", 20, 0.70, samples_count=1000),
             line("eval_accuracy", 30, 0.721, samples_count=2000)]
    s = summarize(parse_lines(lines), "b.txt", targets={"bert": 0.712})
    assert s.eval_axis == "samples_count" and s.epochs_or_samples_to_converge == 2000
    assert s.target == 0.712
    assert s.status is None and s.time_to_train_min is None and s.throughput is None
    assert s.train_time_s is None and s.seed is None


# ---------------------------------------------------------------- integrity

def test_clean_log_has_no_findings():
    assert check_integrity(parse_lines(good_log())) == []
    assert check_integrity(parse_lines(good_log()), eval_every=4) == []


def test_timestamps_backwards_reported_with_line_numbers():
    lines = good_log()
    # move the 2nd block_stop 100 s into the past
    idx = [i for i, l in enumerate(lines) if '"block_stop"' in l][1]
    ev = json.loads(lines[idx].split(":::MLLOG ", 1)[1])
    ev["time_ms"] -= 100_000
    lines[idx] = ":::MLLOG " + json.dumps(ev)
    found = [f for f in check_integrity(parse_lines(lines)) if f.code == "time_backwards"]
    assert found and all(f.severity == "error" for f in found)
    assert f"line {idx + 1} (block_stop)" in found[0].message


def test_many_backwards_timestamps_are_capped():
    lines = [line("run_start", T0)] + [line("x", T0 - 5000 * i) for i in range(1, 11)] + [
        line("run_stop", T0 + 1000, status="success")]
    found = [f for f in check_integrity(parse_lines(lines)) if f.code == "time_backwards"]
    assert len(found) == 4 and "7 more" in found[-1].message


def test_millisecond_jitter_is_one_warning_not_errors():
    # several ranks logging init_start a few ms apart, as in many public v0.7 logs
    lines = good_log()
    i = next(i for i, l in enumerate(lines) if '"init_start"' in l)
    lines[i + 1:i + 1] = [line("init_start", T0 - 3), line("init_start", T0 - 1), line("init_start", T0 - 2)]
    found = check_integrity(parse_lines(lines))
    assert codes(found) == ["time_jitter"] and found[0].severity == "warning"
    assert "2 small step(s)" in found[0].message and "max 0.003 s" in found[0].message


def test_run_start_before_init_stop_says_by_how_much():
    lines = good_log()
    idx = next(i for i, l in enumerate(lines) if '"run_start"' in l)
    lines[idx] = line("run_start", T0 + 60_000 - 2 * 3_600_000)  # 2 h before init_stop
    f = next(f for f in check_integrity(parse_lines(lines)) if f.code == "run_start_before_init_stop")
    assert f.severity == "error" and "2.00 h before init_stop" in f.message


def test_missing_run_markers_and_status():
    no_stop = [l for l in good_log() if '"run_stop"' not in l]
    assert "missing_run_stop" in codes(check_integrity(parse_lines(no_stop)), "error")
    no_start = [l for l in good_log() if '"run_start"' not in l]
    assert "missing_run_start" in codes(check_integrity(parse_lines(no_start)), "error")
    assert "run_stop_no_status" in codes(check_integrity(parse_lines(good_log(stop_status=None))), "error")
    assert "run_not_successful" in codes(check_integrity(parse_lines(good_log(stop_status="aborted"))))


def test_more_than_one_run_stop_is_an_error():
    lines = good_log()
    stop = next(i for i, l in enumerate(lines) if '"run_stop"' in l)
    twice = lines + [line("run_stop", T0 + 400_000, status="aborted")]
    found = [f for f in check_integrity(parse_lines(twice)) if f.code == "run_stop_repeated"]
    assert len(found) == 1 and found[0].severity == "error"
    assert found[0].message.startswith(f"2 run_stop lines (lines {stop + 1}, {len(twice)})")
    assert "run_stop_repeated" not in codes(check_integrity(parse_lines(lines)))


def test_run_stop_status_must_agree_with_the_target():
    def status_errors(lines, ruleset="4.0.0"):
        events = parse_lines(lines)
        return [f.message for f in check_status(events, status_target(events, ruleset))]

    assert status_errors(good_log()) == []  # success, last eval 0.76 >= 0.759
    aborted = status_errors(good_log(stop_status="aborted"))
    assert len(aborted) == 1 and "says 'aborted' but eval_accuracy 0.76" in aborted[0]
    assert "reached the target >= 0.759" in aborted[0]
    missed = [l.replace('"value": 0.76', '"value": 0.75') for l in good_log()]
    [msg] = status_errors(missed)
    assert "says success but the last eval_accuracy 0.75" in msg and "does not reach the target >= 0.759" in msg
    assert status_errors([l.replace('"success"', '"aborted"') for l in missed]) == []  # aborted, short of it
    no_evals = [l for l in good_log() if '"eval_accuracy"' not in l]
    assert "no eval_accuracy is logged" in status_errors(no_evals)[0]
    # An open-division run sets its own target: nothing to judge it by.
    assert status_errors(good_log(stop_status="aborted", division="open")) == []
    # A target that reads lower-is-better (llama31_8b: log perplexity <= 3.3).
    lm = [l.replace('"value": 0.76', '"value": 3.2') for l in good_log(benchmark="llama31_8b", stop_status="aborted")]
    assert "reached the target <= 3.3" in status_errors(lm, "6.1.0")[0]
    # check_integrity judges the status under the ruleset it is given.
    assert "status_contradicts_evals" in codes(check_integrity(parse_lines(good_log(stop_status="aborted")),
                                                               ruleset="4.0.0"), "error")


def test_off_cadence_eval_inferred_and_explicit():
    lines = good_log(evals=(4, 8, 13, 17, 21))
    inferred = [f for f in check_integrity(parse_lines(lines)) if f.code == "eval_off_cadence"]
    assert len(inferred) == 1 and inferred[0].severity == "warning"
    assert "eval at 13" in inferred[0].message and "cadence 4" in inferred[0].message
    explicit = [f for f in check_integrity(parse_lines(lines), eval_every=4) if f.code == "eval_off_cadence"]
    assert len(explicit) == 1 and explicit[0].severity == "error"


def test_zero_cadence_means_infer_not_error():
    lines = good_log(evals=(4, 8, 12, 16))
    assert check_integrity(parse_lines(lines), eval_every=0) == []


def test_first_eval_offset_and_early_last_eval_before_run_stop_are_fine():
    assert check_integrity(parse_lines(good_log(evals=(3, 7, 11, 15, 17))), eval_every=4) == []
    # ... but an early eval followed by more training is not
    lines = good_log(evals=(4, 8, 10, 14, 18))
    assert "eval_off_cadence" in codes(check_integrity(parse_lines(lines), eval_every=4))


def test_eval_accuracy_without_eval_start_or_stop():
    lines = [l for l in good_log() if not ('"eval_start"' in l and '"epoch_num": 8' in l)]
    f = [f for f in check_integrity(parse_lines(lines)) if f.code == "eval_unmatched"]
    assert len(f) == 1 and "at 8" in f[0].message and "eval_start" in f[0].message
    lines = [l for l in good_log() if not ('"eval_stop"' in l and '"epoch_num": 12' in l)]
    f = [f for f in check_integrity(parse_lines(lines)) if f.code == "eval_unmatched"]
    assert len(f) == 1 and "eval_stop" in f[0].message


def test_untimed_submission_lines_are_not_backwards_errors():
    lines = good_log() + [line("submission_org", 0, "Org")]
    found = check_integrity(parse_lines(lines))
    assert codes(found) == ["untimed_lines"] and found[0].severity == "warning"


def test_check_seeds_duplicate_and_missing():
    a = summarize(parse_lines(good_log(seed=7)), "a.txt")
    b = summarize(parse_lines(good_log(seed=7)), "b.txt")
    c = summarize(parse_lines(good_log(seed=None)), "c.txt")
    d = summarize(parse_lines(good_log(seed=8)), "d.txt")
    found = check_seeds([a, b, c, d])
    dup = [f for f in found if f.code == "duplicate_seed"]
    assert len(dup) == 1 and dup[0].severity == "error" and "a.txt" in dup[0].message and "b.txt" in dup[0].message
    assert [f.message for f in found if f.code == "missing_seed"] == ["c.txt: no integer seed logged"]
    assert check_seeds([a, d]) == []


# ---------------------------------------------------------------- the rules' eval schedule (closed runs)

def schedule_findings(lines, ruleset):
    return [(f.severity, f.message) for f in check_integrity(parse_lines(lines), ruleset=ruleset)
            if f.code == "eval_schedule"]


def test_closed_resnet_on_the_rules_schedule_passes_every_ruleset():
    for evals in ((4, 8, 12, 16), (3, 7, 11, 15), (1, 5, 9)):
        for ruleset in ("0.7.0", "4.0.0"):
            assert schedule_findings(good_log(evals=evals), ruleset) == [], (evals, ruleset)


def test_closed_resnet_off_the_rules_schedule():
    every_epoch = good_log(evals=(1, 2, 3, 4, 5))
    found = schedule_findings(every_epoch, "4.0.0")
    assert found and all(sev == "error" for sev, _ in found) and "every 4" in found[0][1]
    assert schedule_findings(every_epoch, "0.7.0") == []  # v0.7: "at least as frequently"
    late_first = schedule_findings(good_log(evals=(5, 9, 13)), "4.0.0")
    assert late_first and "epoch 1-4" in late_first[0][1]
    assert "every 4" in schedule_findings(good_log(evals=(4, 8, 12, 14)), "4.0.0")[0][1]
    # An off-cadence final eval is an error when the run claims success there, a warning otherwise.
    assert schedule_findings(good_log(evals=(3, 7, 11, 13)), "4.0.0")[0][0] == "error"
    assert schedule_findings(good_log(evals=(3, 7, 11, 13), stop_status="aborted"), "4.0.0")[0][0] == "warning"
    # Open division and other benchmarks are not held to it; without a ruleset the check is off.
    assert schedule_findings(good_log(evals=(1, 2, 3), division="open"), "4.0.0") == []
    assert schedule_findings(good_log(evals=(1, 2, 3), benchmark="ssd"), "4.0.0") == []
    assert schedule_findings(every_epoch, None) == []
    # A synthetic-data smoke log is not a result: the same findings, as warnings.
    smoke = every_epoch[:1] + [line("harness_data_source", T0, "synthetic")] + every_epoch[1:]
    assert {sev for sev, _ in schedule_findings(smoke, "4.0.0")} == {"warning"}


def with_block_samples(lines, samples_per_epoch, short_by):
    """Adds samples_count to each block_stop: the samples trained when the block (and its eval) ended."""
    out = []
    for l in lines:
        ev = json.loads(l.split(":::MLLOG ", 1)[1])
        if ev["key"] == "block_stop":
            end = ev["metadata"]["first_epoch_num"] + 4
            ev["metadata"]["samples_count"] = end * samples_per_epoch - short_by
            l = ":::MLLOG " + json.dumps(ev)
        out.append(l)
    return out


def test_resnet_eval_before_the_end_of_its_epoch():
    """Evals may be rounded up to a batch, never down (the harness once ran them 188 samples early)."""
    on_time = with_block_samples(good_log(evals=(4, 8, 12)), 1000, short_by=0)
    assert schedule_findings(on_time, "4.0.0") == []
    early = schedule_findings(with_block_samples(good_log(evals=(4, 8, 12)), 1000, short_by=188), "4.0.0")
    assert len(early) == 3 and all(sev == "error" for sev, _ in early)
    assert "after 3812 samples, before epoch 4 ends (4000 samples)" in early[0][1]


def bert_log(positions, stop_status="success"):
    return good_log(evals=positions, benchmark="bert", batch=448, stop_status=stop_status)


def test_bert_schedule_per_ruleset():
    every = bert_eval_every(448)
    assert every == 150_000
    v1 = [math.ceil(k * every / 448) * 448 for k in range(1, 6)]  # rounded up to a whole batch
    assert schedule_findings(bert_log(v1), "4.0.0") == []
    assert schedule_findings(bert_log(v1), "0.7.0") == []  # more often than v0.7 asked is allowed
    v07 = [math.ceil(p / 448) * 448 for p in (3_000_000, 3_500_000, 4_000_000)]
    assert schedule_findings(bert_log(v07), "0.7.0") == []
    late = schedule_findings(bert_log(v07), "4.0.0")
    assert late and late[0][0] == "error" and "150,000 samples" in late[0][1]
    sparse = [math.ceil(p / 448) * 448 for p in (3_000_000, 4_000_000)]
    assert "at least every 500,000" in schedule_findings(bert_log(sparse), "0.7.0")[0][1]
    rounded_down = [k * every - 448 for k in range(1, 3)]
    assert len(schedule_findings(bert_log(rounded_down), "4.0.0")) == 2


def test_ssd_schedule_per_ruleset():
    def ssd(evals, stop="success"):
        return good_log(evals=evals, benchmark="ssd", batch=32, stop_status=stop)
    for ruleset in ("0.7.0", "1.0.0"):
        assert schedule_findings(ssd((40, 50, 55, 60)), ruleset) == []
    assert schedule_findings(ssd((5, 10, 15)), "1.1.0") == []
    assert schedule_findings(ssd((5, 10, 15, 20, 25, 30, 35, 40, 45, 50)), "0.7.0") == []  # more often is allowed
    extra = schedule_findings(ssd((40, 45, 50)), "1.0.0")   # 1.0.0: the same frequency, so no eval at 45
    assert extra and extra[0][0] == "error" and "the rules put it at epoch 50" in extra[0][1]
    assert "every 5 epochs" in schedule_findings(ssd((40, 50)), "1.1.0")[0][1]
    assert "v0.7 evaluates at least at" in schedule_findings(ssd((45, 50)), "0.7.0")[0][1]


def test_check_eval_schedule_is_what_check_integrity_adds():
    events = parse_lines(good_log(evals=(1, 2, 3, 4, 5)))
    extra = [f for f in check_integrity(events, ruleset="4.0.0") if f not in check_integrity(events)]
    assert extra == check_eval_schedule(events, "4.0.0") != []
    aborted = parse_lines(good_log(evals=(1, 2, 3, 4, 5), stop_status="aborted"))
    extra = [f for f in check_integrity(aborted, ruleset="4.0.0") if f not in check_integrity(aborted)]
    assert extra == check_eval_schedule(aborted, "4.0.0") + check_status(aborted, 0.759) != []


# ---------------------------------------------------------------- real public v0.7 logs

def test_public_google_ssd_result0_run_start_15h_before_init_stop():
    events = parse_log(os.path.join(PUBLIC_SSD, "result_0.txt"))
    errors = [f for f in check_integrity(events) if f.severity == "error"]
    assert {f.code for f in errors} == {"run_start_before_init_stop", "time_backwards"}
    msg = next(f.message for f in errors if f.code == "run_start_before_init_stop")
    assert "15.37 h before init_stop" in msg


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_public_google_ssd_other_runs_have_no_errors(n):
    events = parse_log(os.path.join(PUBLIC_SSD, f"result_{n}.txt"))
    assert [f for f in check_integrity(events) if f.severity == "error"] == []
    s = summarize(events, "r")
    assert s.benchmark == "ssd" and s.status == "success" and s.epochs_or_samples_to_converge == 93
    assert s.target == 0.23 and s.ruleset == "1.1.0"  # an SSD-ResNet34 log (it logs max_samples)
    assert s.last_accuracy >= s.target
