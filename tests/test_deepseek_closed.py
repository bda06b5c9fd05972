"""deepseekv3_671b's closed division, which cannot run here: the log of the reference config's own keys with a
run's timeline (tests/helpers/closed_log.py) against the official closed checker of 6.0.0 and 6.1.0 (the
first eval where 6.1.0 puts it passes both; 6.0.0-style evals from step 1 fail 6.1.0; a last eval above 3.6
fails both), the open checker at GBS 15360 with a free learning rate, the RCP test on three such logs, the
closed refusals (one line each), the eval cadence and learning-rate schedule, and the data manifest it
shares with llama31_8b. Nothing trains; the checker runs as a subprocess per log (about half a second)."""
from __future__ import annotations

import math
import os

import pytest

from conftest import REPO, cli_in_process, stderr_error_lines

pytestmark = pytest.mark.quick

REFERENCE = os.path.join(REPO, "configs", "deepseekv3_671b", "reference.yaml")
SMOKE = os.path.join(REPO, "configs", "deepseekv3_671b", "smoke.yaml")
# Eval losses of a run that reaches 3.6 at its fourth eval (the RCP runs cross it at steps 45-48).
CONVERGING = [3.85, 3.72, 3.64, 3.58]


def at_batch(gbs: int, lr: float | None = None) -> list[str]:
    """Overrides for the reference at another global batch: 1-row micro-batches on its 256 devices and the
    rules' learning rate (or `lr`)."""
    from benchmarks.deepseekv3_671b.rules import closed_learning_rate

    return [f"schedule.global_batch_size={gbs}", f"schedule.gradient_accumulation_steps={gbs // 256}",
            f"optimizer.base_learning_rate={lr if lr is not None else closed_learning_rate(gbs)!r}"]


def reference_log(tmp_path, overrides=(), scores=CONVERGING, name="result_0.txt"):
    from tests.helpers.closed_log import checked_workload, write_run_log

    cfg, workload = checked_workload(REFERENCE, overrides)
    path = str(tmp_path / name)
    return path, write_run_log(path, cfg, workload, scores), workload


def verdicts(path: str) -> dict[str, object]:
    from harness import mlperf

    return {r: mlperf.run_compliance_checker(path, r) for r in ("6.0.0", "6.1.0")}


# ------------------------------------------------------------------------------------------ cadence

def test_the_first_eval_step_and_cadence_per_ruleset():
    from harness import benchmark_rules as rules

    assert [rules.dsv3_first_eval_step(g) for g in (15360, 16384, 18432, 24576, 24577, 30720)] == \
        [43, 43, 43, 43, 42, 42]
    later = rules.cadence("deepseekv3_671b", "6.1.0", 16384)
    assert (later.first, later.every, later.first_choices) == (43 * 16384, 16384, ())
    earlier = rules.cadence("deepseekv3_671b", "6.0.0", 16384)
    assert earlier.first == earlier.every == 16384
    assert earlier.first_choices == tuple(k * 16384 for k in range(1, 44))


@pytest.mark.parametrize("overrides, first", [
    ([], 43),                                               # 6.1.0 (and 6.0.0): floor(42 + 24576 / 16384)
    (["check_rulesets=[]"], 43),                            # 6.1.0 alone
    (["ruleset=6.0.0", "check_rulesets=[]"], 1),            # 6.0.0 alone: every step, as the RCP runs
    (["ruleset=6.0.0", "check_rulesets=[]", "data.first_eval_step=20"], 20),  # a first 6.0.0 allows
    (at_batch(30720), 42),
])
def test_a_closed_run_evaluates_after_every_step_from_the_rules_first(overrides, first):
    from tests.helpers.closed_log import checked_workload

    cfg, workload = checked_workload(REFERENCE, overrides)
    gbs = cfg.schedule.global_batch_size
    points = workload.eval_schedule().points
    assert [p.step for p in points[:3]] == [first, first + 1, first + 2]
    assert all(p.samples == p.step * gbs == p.epoch_num for p in points[:3])


def test_step_1_trains_at_learning_rate_0_then_warms_up_over_4_steps():
    """The schedule the workload builds its AdamW with (build: cosine_warmup_schedule over decay_steps), read
    at step indices 0, 1, ... (step k trains at index k - 1)."""
    from harness.nn.optim import cosine_warmup_schedule
    from tests.helpers.closed_log import checked_workload

    cfg, workload = checked_workload(REFERENCE)
    o = cfg.optimizer
    assert workload.decay_steps == 11996
    lr = cosine_warmup_schedule(o.base_learning_rate, o.end_learning_rate, o.warmup_steps, workload.decay_steps)
    got = [float(lr(k)) for k in range(6)]
    peak = 2.4e-5
    cosine = 1e-8 + (peak - 1e-8) * 0.5 * (1 + math.cos(math.pi / 11996))
    assert got[0] == 0.0
    assert got[1:] == pytest.approx([peak / 4, peak / 2, 3 * peak / 4, peak, cosine], rel=1e-6)  # float32


def test_the_applied_weight_decay_is_the_schedulers_while_the_log_says_0_1():
    from tests.helpers.step_case import build

    _, _, workload = build(SMOKE, ["optimizer.weight_decay=0.1", "optimizer.applied_weight_decay=0.033"])
    assert workload.optimizer.weight_decay == 0.033
    assert float(workload.optimizer.learning_rate()) == 0.0  # what the first step's update reads
    keys = workload.mllog_hparams()
    assert keys["opt_adamw_weight_decay"] == 0.1 and keys["harness_applied_weight_decay"] == 0.033
    _, _, workload = build(SMOKE, ["optimizer.weight_decay=0.1"])
    assert workload.optimizer.weight_decay == 0.1 and "harness_applied_weight_decay" not in workload.mllog_hparams()


# ------------------------------------------------------------------------------------- the checker

def test_reference_log_passes_closed_6_0_0_and_6_1_0_and_fails_above_the_target(tmp_path):
    from harness.review import integrity, logparse

    path, points, workload = reference_log(tmp_path)
    assert points[0].step == 43 and points[0].samples == 704_512  # FIRST_CHECK at GBS 16384
    keys = workload.mllog_hparams()
    for key, want in [("opt_base_learning_rate", 2.4e-5), ("opt_learning_rate_warmup_steps", 4),
                      ("opt_learning_rate_decay_steps", 11996), ("opt_adamw_epsilon", 1e-8),
                      ("opt_adamw_weight_decay", 0.1), ("moe_aux_loss_coeff", 0.01), ("init_checkpoint_step", 0),
                      ("micro_batch_size", 1), ("max_sequence_length", 4096)]:
        assert keys[key] == want, key
    for ruleset, verdict in verdicts(path).items():
        assert verdict.passed, (ruleset, verdict.errors)
        events = logparse.parse_log(path)
        assert integrity.check_eval_schedule(events, ruleset) == []
    checked = cli_in_process("check", path)  # the harness's own review: the checker and its integrity checks
    assert checked.returncode == 0 and "integrity checks: PASS" in checked.stdout, checked.stdout + checked.stderr
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('"value": 3.58', '"value": 3.61'))
    assert not any(v.passed for v in verdicts(path).values())


@pytest.mark.parametrize("gbs, lr", [(15360, 2.3238e-05), (30720, None)])
def test_closed_log_at_other_batches_passes_both_rulesets(tmp_path, gbs, lr):
    """15360 at the RCP's rounded 2.3238e-5 (within 1e-9 of the rule); 30720 evaluates from step 42."""
    path, points, _ = reference_log(tmp_path, at_batch(gbs, lr))
    assert points[0].samples == gbs * (42 + 24576 // gbs)
    for ruleset, verdict in verdicts(path).items():
        assert verdict.passed, (ruleset, verdict.errors)


def test_evals_from_step_1_pass_6_0_0_and_fail_6_1_0(tmp_path):
    from harness.review import integrity, logparse

    scores = [5.12 - 0.035 * k for k in range(45)] + [3.58]
    path, points, _ = reference_log(tmp_path, ["ruleset=6.0.0", "check_rulesets=[]"], scores)
    assert points[0].step == 1 and len(points) == 46
    got = verdicts(path)
    assert got["6.0.0"].passed, got["6.0.0"].errors
    assert not got["6.1.0"].passed and "math.floor(42 + 24576 / s['global_batch_size'])" in got["6.1.0"].output
    events = logparse.parse_log(path)
    assert integrity.check_eval_schedule(events, "6.0.0") == []
    flagged = integrity.check_eval_schedule(events, "6.1.0")
    assert flagged and "the rules put it at 704,512 samples" in flagged[0].message


def test_open_log_at_15360_with_its_own_learning_rate_passes_the_open_checker(tmp_path):
    overrides = at_batch(15360, 1e-4) + ["submission.division=open", "optimizer.warmup_steps=10",
                                         "optimizer.max_steps=2000", "model.seq_aux_loss_coef=0.001"]
    path, points, _ = reference_log(tmp_path, overrides)
    assert points[0].step == 1  # open: the first eval_every_samples mark
    for ruleset, verdict in verdicts(path).items():
        assert verdict.passed, (ruleset, verdict.errors)


@pytest.mark.parametrize("steps, verdict", [((46, 47, 46), "PASS"), ((44, 44, 46), "FAIL")])
def test_check_rcp_judges_three_reference_logs(tmp_path, steps, verdict):
    """The median run must converge at >= 45 steps at GBS 16384 (RCP mean 46.75 steps, 4.0% speedup)."""
    from harness.review import rcp

    for seed, step in enumerate(steps):
        scores = [3.9 - 0.01 * k for k in range(step - 43)] + [3.59]
        reference_log(tmp_path, [f"seed={seed + 1}"], scores, name=f"result_{seed}.txt")
    report = rcp.rcp_report([str(tmp_path)], "6.1.0")
    assert [r.value for r in report.runs] == [s * 16384 for s in steps]
    assert report.record == "deepseekv3_671b_ref_16384" and report.verdict == verdict, report.detail
    # The RCP runs' layout (DP 64: 256 micro-batches) is not the 256-device mesh's (64): disclosed, not judged.
    assert report.mismatches == ["gradient_accumulation_steps: RCP 256, logged gradient_accumulation_steps=64"]


# ------------------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("overrides, message", [
    (at_batch(8192), "needs schedule.global_batch_size >= 15360 (the checker's bound; got 8192)"),
    (["data.seq_length=2048"], "trains on rows of 4096 tokens (got data.seq_length=2048)"),
    (["data.eval_samples=512"], "scores 1024 eval rows (got data.eval_samples=512)"),
    (["optimizer.base_learning_rate=2.5e-5"], "= 0.000024000 at global batch 16384, within 1e-09 (got 2.5e-05)"),
    (at_batch(15360, 2.4e-5), "= 0.000023238 at global batch 15360"),
    (at_batch(15360, 2.324e-5), "= 0.000023238 at global batch 15360"),
    (["data.first_eval_step=1"], "evaluates first after step 43 under rulesets 6.1.0, 6.0.0"),
    (["data.eval_every_samples=32768"], "evaluates after every step: set data.eval_every_samples=0"),
    (["optimizer.warmup_steps=8"], "the reference fixes optimizer.warmup_steps=4"),
    (["optimizer.weight_decay=0.033"], "the reference fixes optimizer.weight_decay=0.1"),
    (["model.mtp_layers=0"], "the reference fixes model.mtp_layers=1"),
    (["model.init_checkpoint="], "set model.init_checkpoint to its Hugging Face directory"),
    (["data.source=synthetic"], "set data.source=indexed"),
    (["optimizer.applied_weight_decay=0.5"], "set optimizer.applied_weight_decay=0.033 (it applies 0.5)"),
    (["optimizer.applied_weight_decay=-1"], "set optimizer.applied_weight_decay=0.033 (it applies 0.1)"),
])
def test_closed_departures_are_refused_in_one_line(overrides, message):
    from harness.errors import HarnessError
    from tests.helpers.closed_log import checked_workload

    with pytest.raises(HarnessError) as e:
        checked_workload(REFERENCE, overrides)
    text = str(e.value)
    assert message in text and "\n" not in text and text.endswith("; or set submission.division=open"), text


def test_the_cli_refuses_a_small_closed_batch_in_one_error_line():
    sets = [a for o in at_batch(8192) for a in ("--set", o)]
    proc = cli_in_process("run", REFERENCE, "--dry_run", *sets)
    errors = stderr_error_lines(proc)
    assert proc.returncode != 0 and len(errors) == 1 and "global_batch_size >= 15360" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------ data

def test_closed_data_is_llama31_8bs_c4_files_and_others_are_refused(tmp_path):
    from harness.errors import HarnessError
    from harness.data import verify as data_verify
    from tests.helpers.closed_log import checked_workload

    shared, own = data_verify.load_manifest("llama31_8b"), data_verify.load_manifest("deepseekv3_671b")
    assert own.workload == "deepseekv3_671b" and own.sets == shared.sets and own.sets
    _, workload = checked_workload(REFERENCE, [f"data.data_dir={tmp_path}"])
    with pytest.raises(HarnessError) as e:
        data_verify.check_closed_data(workload)
    text = str(e.value)
    assert text.startswith("closed division needs the reference's data: ") and "\n" not in text
    assert "c4-train.en_6_text_document" in text


def test_a_manifest_naming_another_names_its_own_workload(tmp_path):
    from harness.errors import HarnessError
    from harness.data import verify as data_verify

    path = tmp_path / "m.yaml"
    path.write_text("workload: llama31_8b\nsame_files_as: llama31_8b\n")
    with pytest.raises(HarnessError, match="names its own workload"):
        data_verify.load_manifest("deepseekv3_671b", str(path))


def test_evals_that_dropped_expert_assignments_are_named_a_deviation():
    """A capacity factor that drops (the reference's MoE is dropless): the run names it beside the verdicts."""
    from tests.helpers.closed_log import checked_workload

    _, workload = checked_workload(REFERENCE, ["model.capacity_factor=2.0"])
    clean = [{"metrics": {"dropped assignments": 0.0}} for _ in range(3)]
    assert workload.deviations(clean, {"dropped": 0.0, "assigned": 1000.0}) == []
    (line,) = workload.deviations(clean + [{"metrics": {"dropped assignments": 0.0004}}], {})
    assert "model.capacity_factor=2.0 dropped expert assignments in 1 of 4 evals (at most 0.040%)" in line
    assert "closed result is not its computation" in line
    # training's drops (the step statistics the run totals) are named beside the evals'
    (line,) = workload.deviations(clean, {"dropped": 3.0, "assigned": 1000.0})
    assert "dropped expert assignments in training (0.300% of 1,000)" in line



def test_the_reference_evaluates_its_1024_rows_in_one_batch_of_4_per_device():
    from tests.helpers.closed_log import checked_workload

    cfg, _ = checked_workload(REFERENCE)
    assert cfg.schedule.eval_batch_size == cfg.data.eval_samples == 1024
