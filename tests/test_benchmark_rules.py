"""harness/benchmark_rules.py against the installed mlperf-logging's own files, the workloads against the
records, and the user-visible answers that read them (`check`, `report`, `campaign`, `check --rcp`).

Everything here but the workload-class test runs without TensorFlow; the `check` tests run the official
compliance checker (a subprocess of mlperf_logging, not of the harness) on small hand-written logs."""
from __future__ import annotations

import math
import os
import re

import pytest
import yaml

from mlperf_logging import benchmark_meta
from mlperf_logging import compliance_checker as checker_pkg
from mlperf_logging.rcp_checker import rcp_checker

from harness import benchmark_rules as rules
from harness.errors import HarnessError

from conftest import REPO

pytestmark = pytest.mark.quick

CHECKER = os.path.dirname(checker_pkg.__file__)
RCPS = os.path.dirname(rcp_checker.__file__)


def _load(path: str) -> list[dict]:
    with open(path) as f:
        return yaml.load(f, Loader=yaml.BaseLoader)


def _key_rule(entries: list[dict], name: str) -> dict | None:
    return next((e["KEY"] for e in entries if "KEY" in e and e["KEY"]["NAME"] == name), None)


def checker_accepts(ruleset: str, division: str) -> set[str]:
    """Keys the division's common rules list whose per-benchmark file exists (a listed key without one
    fails with FileNotFoundError, e.g. resnet in 4.1.0)."""
    rule = _key_rule(_load(os.path.join(CHECKER, f"training_{ruleset}", f"{division}_common.yaml")),
                     "submission_benchmark")
    listed = re.findall(r"'(\w+)'", rule["CHECK"].split(" in ", 1)[1])
    template = re.search(r"'(training_[\d.]+/\w+_)\{\}\.yaml'", rule["POST"]).group(1)
    return {b for b in listed if os.path.exists(os.path.join(CHECKER, f"{template}{b}.yaml"))}


def test_installed_checker_has_exactly_the_recorded_rulesets():
    installed = sorted(d.removeprefix("training_") for d in os.listdir(CHECKER)
                       if re.fullmatch(r"training_\d+\.\d+\.\d+", d))
    assert installed[0] == "0.6.0"  # legacy line format only: not read by the harness
    assert tuple(installed[1:]) == rules.RULESETS


@pytest.mark.parametrize("division", ["closed", "open"])
def test_each_ruleset_accepts_the_recorded_benchmarks(division):
    for ruleset in rules.RULESETS:
        recorded = {k for k, b in rules.BENCHMARKS.items()
                    if ruleset in (b.closed if division == "closed" else b.open)}
        assert recorded == checker_accepts(ruleset, division), ruleset


def test_closed_rulesets_are_the_package_checkers_allowed_benchmarks():
    for ruleset in rules.RULESETS:
        allowed = set(benchmark_meta.get_allowed_benchmarks("training", ruleset))
        assert {k for k, b in rules.BENCHMARKS.items() if ruleset in b.closed} == allowed, ruleset


def test_required_runs_are_the_checkers():
    counts = benchmark_meta.get_result_file_counts("training")
    for key, b in rules.BENCHMARKS.items():
        assert b.runs == counts[key], key
        if key in rcp_checker.submission_runs["training"]:
            assert b.runs == rcp_checker.submission_runs["training"][key], key
    assert rules.runs_required("llama31_8b") == 10 and rules.runs_required("nope") is None


def test_rcp_availability_is_what_the_rcp_checker_can_check():
    """RCPs where the checker ships the key's file and knows its run count (without one it stops on the key:
    dlrm's files ship, its count does not)."""
    counted = rcp_checker.submission_runs["training"]
    for key, b in rules.BENCHMARKS.items():
        shipped = tuple(r for r in b.closed
                        if os.path.exists(os.path.join(RCPS, f"training_{r}", f"rcps_{key}.json")) and key in counted)
        assert b.rcp == shipped, key
    assert not rules.has_rcp("dlrm", "2.1.0") and rules.has_rcp("dlrm_dcnv2", "3.0.0")


def _closed_check(key: str, ruleset: str) -> tuple[str, dict]:
    """The closed eval_accuracy ATLEAST_ONE_CHECK and the checker state its BEGIN blocks set up."""
    entries = _load(os.path.join(CHECKER, f"training_{ruleset}", f"closed_{key}.yaml"))
    state: dict = {}
    for e in entries:
        if "BEGIN" in e and "s.update" in e["BEGIN"]["CODE"]:
            exec(e["BEGIN"]["CODE"], {"math": math}, {"s": state})
    rule = _key_rule(entries, "eval_accuracy") or _key_rule(entries, "aggregated_eval_accuracy")
    return rule["ATLEAST_ONE_CHECK"], state


def _passes(check: str, state: dict, value, gbs: int = 1024) -> bool:
    s = dict(state, global_batch_size=gbs)
    return bool(eval(check, {"math": math}, {"v": {"value": value, "metadata": {}}, "s": s}))


def test_closed_targets_are_the_checkers_bounds():
    """At the target (a hair past it for a strict bound) the checker's own expression passes; a step
    short of it, it fails: a record that drifted from the checker fails here."""
    checked = 0
    for key, b in rules.BENCHMARKS.items():
        for ruleset in b.closed:
            check, state = _closed_check(key, ruleset)
            target = b.targets[ruleset]
            if target.value is None:  # more than one number: each of the text's bounds is the checker's
                for number in re.findall(r"\d+\.\d+|\d+", target.text):
                    assert re.search(rf"\b{re.escape(number)}\b", check), (key, ruleset, number)
                continue
            gbs_cases = [(4096, target.small_batch[1]), (target.small_batch[0], target.value)] \
                if target.small_batch else [(1024, target.value)]
            for gbs, want in gbs_cases:
                assert rules.closed_target(key, ruleset, gbs) == want
                toward = 1 if b.higher_is_better else -1
                hair, step = want * (1 + toward * 1e-9), want * (1 - toward * 1e-3)
                assert _passes(check, state, hair, gbs), (key, ruleset, gbs, want)
                assert not _passes(check, state, step, gbs), (key, ruleset, gbs, want)
                checked += 1
    assert checked > 80


def test_eval_units_follow_the_checkers_eval_accuracy_metadata():
    for key, b in rules.BENCHMARKS.items():
        rule = _key_rule(_load(os.path.join(CHECKER, f"training_{b.newest}", f"closed_{key}.yaml")), "eval_accuracy")
        if rule and "'samples_count' in v['metadata']" in str(rule.get("CHECK")):
            assert b.unit == rules.SAMPLE, key


def test_lookups_and_refusals():
    assert rules.newest_ruleset("llama31_8b") == "6.1.0" and rules.newest_ruleset("resnet") == "4.0.0"
    assert rules.newest_ruleset("ssd") == "4.1.0" and rules.default_ruleset("ssd") == "4.1.0"
    assert rules.default_ruleset("ssd", ["max_samples"]) == "1.1.0"  # an SSD-ResNet34 log
    assert rules.closed_target("ssd", "1.1.0") == 0.23 and rules.closed_target("ssd", "2.0.0") == 0.34
    assert rules.reaches("gpt_oss_20b", 3.3, 3.34) and not rules.reaches("bert", 0.71, 0.72)
    with pytest.raises(HarnessError, match="'nope' is not an MLPerf training benchmark"):
        rules.record("nope")
    with pytest.raises(HarnessError, match="ruleset 4.0.0 has no closed llama31_8b benchmark"):
        rules.closed_target("llama31_8b", "4.0.0")
    with pytest.raises(HarnessError, match="no single target"):
        rules.closed_target("maskrcnn", "3.1.0")


def test_cadences():
    assert rules.cadence("ssd", "0.7.0", 32).positions(70) == [40, 50, 55, 60, 65, 70]
    assert rules.cadence("ssd", "1.0.0", 32).positions(45) == [40]
    assert rules.cadence("ssd", "1.1.0", 32).positions(20) == [5, 10, 15, 20]
    assert rules.cadence("ssd", "2.0.0", 32) is None  # RetinaNet
    assert rules.bert_eval_every(448) == 150_000 and rules.bert_eval_every(8192) == 225_000
    v07 = rules.cadence("bert", "0.7.0", 448)
    assert (v07.first, v07.every, v07.exact) == (3_000_000, 500_000, False)
    resnet = rules.cadence("resnet", "4.0.0", 1024)
    assert resnet.first_choices == (1, 2, 3, 4) and resnet.positions(13, first=1) == [1, 5, 9, 13]
    assert rules.lm_eval_every(1024) == 12288 and rules.lm_eval_every(5000) == 15000
    assert rules.cadence("llama31_8b", "6.1.0", 1024).every == 12288


# --------------------------------------------------------------------------------- the workloads

def test_every_workload_has_a_record_and_its_closed_target():
    from benchmarks import registry

    for name in registry.names():
        cls = registry.get(name)
        rec = rules.record(cls.MLPERF_KEY)
        assert set(cls.RULESETS) <= set(rec.closed), name
        assert cls.HIGHER_IS_BETTER == rec.higher_is_better, name
        for ruleset in cls.RULESETS:
            for gbs in (256, 8192):
                assert _instance(cls, gbs).closed_target(ruleset) == rules.closed_target(rec.key, ruleset, gbs), \
                    (name, ruleset, gbs)
    lm = {n: registry.get(n) for n in ("llama31_8b", "gpt_oss_20b")}
    assert [_target(lm["llama31_8b"], r) for r in ("5.1.0", "6.0.0", "6.1.0")] == [3.3] * 3
    assert [_target(lm["gpt_oss_20b"], r) for r in ("6.0.0", "6.1.0")] == [3.34] * 2
    # The base class alone gives the decoder LMs the same: their own target and direction members can go.
    from harness.train.workload import Workload

    for cls in lm.values():
        for ruleset in cls.RULESETS:
            assert Workload.closed_target(_instance(cls), ruleset) == _target(cls, ruleset)
        assert cls.__dict__["HIGHER_IS_BETTER"] is False  # set on the class itself from its record


class _Cfg:
    def __init__(self, gbs: int) -> None:
        self.schedule = type("S", (), {"global_batch_size": gbs})()


def _instance(cls, gbs: int = 1024):
    """A workload object with only the config's batch: all closed_target reads (no model, no runtime)."""
    wl = object.__new__(cls)
    wl.cfg = _Cfg(gbs)
    return wl


def _target(cls, ruleset: str) -> float:
    return _instance(cls).closed_target(ruleset)


# ------------------------------------------------------------------ logs of benchmarks and what reads them

LM_CLOSED = {  # what the closed llama31_8b / gpt_oss_20b checker files fix (5.1.0-6.1.0)
    "global_batch_size": 1024, "max_sequence_length": 8192, "opt_name": "adamw",
    "opt_base_learning_rate": 8e-4, "opt_end_learning_rate": 8e-5, "opt_learning_rate_warmup_steps": 16,
    "opt_learning_rate_decay_steps": 1_200_000 - 16, "opt_learning_rate_decay_schedule": "cosine with linear warmup",
    "opt_adamw_beta_1": 0.9, "opt_adamw_beta_2": 0.95, "opt_adamw_epsilon": 1e-05, "opt_adamw_weight_decay": 0.1,
    "opt_gradient_clip_norm": 1.0, "gradient_accumulation_steps": 1, "max_steps": 1_200_000,
    # 6.1.0's mandatory disclosure (earlier rulesets take them as optional)
    "lowest_numerical_precision_in_linear": "bfloat16", "lowest_numerical_precision_in_attn": "bfloat16",
    "lowest_numerical_precision_in_comm": "bfloat16", "tensor_parallelism": 1, "pipeline_parallelism": 1,
    "context_parallelism": 1, "expert_parallelism": 1, "micro_batch_size": 1, "config_filename": "hand.yaml",
}
SSD_CLOSED = {  # SSD-ResNet34, closed 0.7.0-1.1.0 but the weights_initialization events of 1.1.0
    "global_batch_size": 1024, "model_bn_span": 32, "opt_learning_rate_warmup_factor": 0,
    "opt_learning_rate_warmup_steps": 1, "opt_weight_decay": 0.0005, "opt_base_learning_rate": 0.1,
    "max_samples": 1, "opt_learning_rate_decay_boundary_epochs": [40, 50], "gradient_accumulation_steps": 1,
}


def write_log(path: str, benchmark: str, hparams: dict, evals: list[tuple[int, float]], unit: str,
              train_samples: int, eval_samples: int, seed: int = 1) -> str:
    """A small log as a harness run writes it (mllog through harness.mlperf), evaluating at `evals`:
    (position in `unit`s, score)."""
    from harness.mlperf import MLPerfLog

    log = MLPerfLog(path)
    for key, value in (("submission_org", "hand"), ("submission_platform", "cpu"),
                       ("submission_division", "closed"), ("submission_benchmark", benchmark)):
        log.event(key, value)
    log.event("cache_clear", True)
    log.start("init_start")
    for key, value in hparams.items():
        log.event(key, value)
    log.event("seed", seed)
    log.event("train_samples", train_samples)
    log.event("eval_samples", eval_samples)
    log.end("init_stop")
    log.start("run_start")
    done = 0
    for position, score in evals:
        if unit == rules.SAMPLE:
            log.start("block_start", metadata={"samples_count": done})
            log.end("block_stop", metadata={"samples_count": position})
            where = {"samples_count": position}
        else:
            log.start("block_start", metadata={"first_epoch_num": done + 1, "epoch_count": position - done})
            log.end("block_stop", metadata={"first_epoch_num": done + 1})
            where = {"epoch_num": position}
        log.start("eval_start", metadata=where)
        log.event("eval_accuracy", score, metadata=where)
        log.end("eval_stop", metadata=where)
        done = position
    log.end("run_stop", metadata={"status": "success"})
    log.close()
    return path


def lm_log(folder, key: str, last: float) -> str:
    os.makedirs(folder, exist_ok=True)
    return write_log(os.path.join(folder, "result_1.txt"), key, LM_CLOSED, [(12288, 4.1), (24576, last)],
                     rules.SAMPLE, train_samples=10_000_000, eval_samples=1024)


@pytest.mark.parametrize("key, last", [("llama31_8b", 3.29), ("gpt_oss_20b", 3.33)])
def test_check_without_ruleset_passes_a_decoder_lm_log_under_its_newest_ruleset(tmp_path, key, last):
    from conftest import cli_in_process

    path = lm_log(tmp_path, key, last)
    proc = cli_in_process("check", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "official compliance checker, ruleset 6.1.0: PASS" in proc.stdout
    assert "integrity checks: PASS" in proc.stdout and "Traceback" not in proc.stderr


def test_check_without_ruleset_takes_the_runs_own_ruleset(tmp_path):
    from conftest import cli_in_process

    path = lm_log(tmp_path, "llama31_8b", 3.29)
    with open(tmp_path / "config.yaml", "w") as f:
        yaml.safe_dump({"workload": "llama31_8b", "ruleset": "5.1.0"}, f)
    proc = cli_in_process("check", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "official compliance checker, ruleset 5.1.0: PASS" in proc.stdout and "6.1.0" not in proc.stdout
    with open(tmp_path / "summary.json", "w") as f:  # summary.json wins: the ruleset the run was checked under
        f.write('{"ruleset": "6.0.0"}')
    assert "ruleset 6.0.0: PASS" in cli_in_process("check", path).stdout


def test_check_without_ruleset_checks_every_ruleset_the_run_gated_on(tmp_path):
    """A run with `check_rulesets` gated its log on several rulesets; `check` re-checks them all, and refuses
    run files of another benchmark than the log's."""
    from conftest import cli_in_process

    path = lm_log(tmp_path, "llama31_8b", 3.29)
    with open(tmp_path / "config.yaml", "w") as f:
        yaml.safe_dump({"workload": "llama31_8b", "ruleset": "5.1.0", "check_rulesets": ["6.0.0", "6.1.0"]}, f)
    out = cli_in_process("check", path).stdout
    assert all(f"official compliance checker, ruleset {r}: PASS" in out for r in ("5.1.0", "6.0.0", "6.1.0")), out
    with open(tmp_path / "summary.json", "w") as f:  # the verdicts the run recorded name its rulesets
        f.write('{"benchmark": "llama31_8b", "ruleset": "6.0.0", "compliance": {"6.0.0": {}, "6.1.0": {}}}')
    out = cli_in_process("check", path).stdout
    assert "ruleset 6.0.0: PASS" in out and "ruleset 6.1.0: PASS" in out and "5.1.0" not in out, out
    with open(tmp_path / "summary.json", "w") as f:
        f.write('{"benchmark": "gpt_oss_20b", "ruleset": "6.0.0"}')
    proc = cli_in_process("check", path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "gpt_oss_20b run" in errors[0], proc.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--ruleset", "4.0.0"], "ruleset 4.0.0 has no closed llama31_8b benchmark"),
    (["--ruleset", "9.9.9"], "ruleset '9.9.9' is not one the installed mlperf-logging"),
    (["--ruleset", "0.6.0"], "ruleset '0.6.0' is not one the harness reads"),  # installed, pre-0.7 format
])
def test_check_refuses_a_ruleset_without_the_benchmark_in_one_line(tmp_path, args, fragment):
    from conftest import cli_in_process

    proc = cli_in_process("check", lm_log(tmp_path, "llama31_8b", 3.29), *args)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and fragment in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "official compliance checker" not in proc.stdout


def test_check_refuses_an_unknown_benchmark_in_one_line(tmp_path):
    from conftest import cli_in_process

    path = write_log(str(tmp_path / "result_1.txt"), "ncf", {"global_batch_size": 8}, [(1, 0.5)], rules.EPOCH,
                     train_samples=10, eval_samples=10)
    proc = cli_in_process("check", path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "'ncf': not an MLPerf training benchmark" in errors[0]
    assert "Traceback" not in proc.stderr


def test_report_shows_a_decoder_lm_logs_quality_target(tmp_path):
    from harness.review import report

    lm_log(tmp_path / "logs", "llama31_8b", 3.29)
    path = report.write_report([str(tmp_path / "logs")], str(tmp_path / "out"), quiet=True)
    with open(path) as f:
        text = f.read()
    assert "Quality target: log perplexity <= 3.3 (closed, ruleset 6.1.0)" in text
    assert "status_contradicts_evals" not in text


def test_report_flags_a_success_short_of_a_lower_is_better_target(tmp_path):
    from harness.review import report

    lm_log(tmp_path / "logs", "gpt_oss_20b", 3.5)
    with open(report.write_report([str(tmp_path / "logs")], str(tmp_path / "out"), quiet=True)) as f:
        text = f.read()
    assert "Quality target: log perplexity <= 3.34" in text and "does not reach the target <= 3.34" in text


def test_campaign_without_runs_takes_the_records_run_count(tmp_path, monkeypatch, capsys):
    from harness.submission import campaign

    config = tmp_path / "llama.yaml"
    config.write_text("workload: llama31_8b\n")
    calls = []

    def refused(config_path, overrides, rec, campaign_dir, console_path):
        calls.append(rec.seed)
        with open(console_path, "w") as f:
            f.write("error: stand-in refusal\n")
        return campaign.EXIT_BAD_INPUT

    monkeypatch.setattr(campaign, "_run_one", refused)
    with pytest.raises(HarnessError, match="stand-in refusal"):
        campaign.main(str(config), [], runs=0, campaign_dir=str(tmp_path / "c"))
    assert "10 run(s)" in capsys.readouterr().out and calls == [1]
    assert campaign.default_runs("gpt_oss_20b") == 10 and campaign.default_runs("ssd") == 5


def ssd_log(folder, seed: int = 1) -> str:
    os.makedirs(folder, exist_ok=True)
    return write_log(os.path.join(folder, f"result_{seed}.txt"), "ssd", SSD_CLOSED, [(40, 0.2), (50, 0.231)],
                     rules.EPOCH, train_samples=117266, eval_samples=5000, seed=seed)


def test_check_rcp_accepts_ssd_under_its_default_ruleset(tmp_path):
    from conftest import cli_in_process

    path = ssd_log(tmp_path)
    proc = cli_in_process("check", "--rcp", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RCP check: ssd, ruleset 1.1.0, global batch 1024" in proc.stdout
    assert f"{path}: 50.00 epochs" in proc.stdout
    # The RCP entry at this batch names the hyperparameters that differ, lists compared item by item.
    assert "opt_base_learning_rate: RCP 0.8" in proc.stdout and "decay_boundary_epochs" not in proc.stdout


def test_package_and_check_agree_on_a_logs_ruleset(tmp_path):
    from harness.review import checklog, logparse
    from harness.submission import runs

    path = ssd_log(tmp_path)
    events = logparse.parse_log(path)
    assert runs.load_run(path).ruleset == checklog.rulesets_for(path, events, [])[1][0] == "1.1.0"
    with open(tmp_path / "config.yaml", "w") as f:
        yaml.safe_dump({"workload": "ssd", "ruleset": "1.0.0"}, f)
    assert runs.load_run(path).ruleset == checklog.rulesets_for(path, events, [])[1][0] == "1.0.0"
    lm = lm_log(tmp_path / "lm", "llama31_8b", 3.29)
    assert runs.load_run(lm).ruleset == checklog.rulesets_for(lm, logparse.parse_log(lm), [])[1][0] == "6.1.0"


def test_a_run_refuses_a_ruleset_the_installed_checker_lacks_before_its_log(monkeypatch):
    """Found only at the compliance gate otherwise: after the whole run, with the log already a result."""
    from harness import config as config_lib, mlperf
    from harness.train import preflight

    cfg = config_lib.load_config(os.path.join(REPO, "configs", "resnet", "smoke.yaml"), [])
    preflight.check_checker_rulesets(cfg)  # the installed checker has both of the smoke's rulesets
    monkeypatch.setattr(mlperf, "checker_rulesets", lambda: ("4.0.0",))
    with pytest.raises(HarnessError, match=r"ruleset '0.7.0' is not one the installed mlperf-logging"):
        preflight.check_checker_rulesets(cfg)
