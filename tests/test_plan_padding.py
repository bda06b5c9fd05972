"""`plan` on the logs of implementations that skip the padding of variable-length sequences: BERT's cost at
a fraction of real tokens, the refusal that names the flag to set, and calibration and projection on
NVIDIA's public DGX A100 BERT logs (tests/data/public_bert_unpad, trimmed; README there). No model is
built: the cost is the analytic count."""
from __future__ import annotations

import glob
import importlib.util
import os
import statistics
import types

import pytest

from harness.errors import HarnessError
from harness.plan import cost as costs, planner
from harness.review import logparse

from conftest import REPO, cli_in_process

pytestmark = pytest.mark.quick

DATA = os.path.join(REPO, "tests", "data", "public_bert_unpad")
V11 = os.path.join(DATA, "training_results_v1.1", "NVIDIA", "results", "dgxa100_ngc21.09_pytorch", "bert")
V10 = os.path.join(DATA, "training_results_v1.0", "NVIDIA", "results", "dgxa100_ngc21.05_pytorch", "bert")
BERT = os.path.join(REPO, "configs", "bert", "reference.yaml")
RESNET = os.path.join(REPO, "configs", "resnet", "reference.yaml")
# The fraction the refusal suggests and the docs state: the MLPerf BERT data's mean real length over 512
DATASET_FRACTION = "0.4997"
# How far the projection at the logs' own scale may sit from the logs' median run time: the step is the
# logs' own by calibration; what differs is the samples to converge (the RCP table's mean against these
# ten runs) and the evals' device time, which the model adds on top of a step that already holds them
OWN_SCALE_TOLERANCE = 0.10
# v1.0 NVIDIA DGX A100 BERT at 8 nodes (64 GPUs, global batch 3072): its mean step, 193.2 ms, from the
# public v1.0 table (mlperf-scale-v0.7-v1.0.csv in shared/data: train samples over run time of
# dgxa100_n8_ngc21.05_pytorch's ten logs), a scale the 8-GPU calibration never sees
HELD_OUT_64_GPU_STEP_MS = 193.2
HELD_OUT_TOLERANCE = 0.15


def bert_module():
    """benchmarks/bert/cost.py (its counts and dataset figures; `COST` is what plan reads)."""
    from benchmarks.bert import cost

    return cost


def bert_cfg():
    from harness.config import load_config

    return load_config(BERT, [])


def run_minutes(folder: str) -> list[float]:
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "result_*.txt"))):
        s = logparse.summarize(logparse.parse_log(path), path)
        out.append((s.run_stop_ms - s.run_start_ms) / 60000.0)
    return out


def test_the_committed_logs_are_the_public_sets_named_in_the_readme():
    assert len(glob.glob(os.path.join(V11, "result_*.txt"))) == 10
    assert len(glob.glob(os.path.join(V10, "result_*.txt"))) == 5
    with open(os.path.join(DATA, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for name in ("mlcommons/training_results_v1.1", "mlcommons/training_results_v1.0", "trim_logs.py",
                 "--unpad"):
        assert name in readme


def test_real_token_cost_scales_the_token_parts_and_attention_apart():
    module, cfg = bert_module(), bert_cfg()
    kinds = module.forward_macs_by_kind(cfg)
    padded = costs.analytic(cfg)
    assert costs.with_real_tokens(cfg, module.COST, 1.0).train_flops_per_sample == pytest.approx(
        padded.train_flops_per_sample, rel=1e-12)
    f = module.DATASET_REAL_TOKEN_FRACTION
    real = costs.with_real_tokens(cfg, module.COST, f)
    expected = 6.0 * (kinds["tokens"] * f + kinds["attention"] * module.DATASET_SQUARED_LENGTH_FRACTION
                      + kinds["sequence"])
    assert real.train_flops_per_sample == pytest.approx(expected, rel=1e-12)
    assert real.eval_flops_per_sample == pytest.approx(expected / 3, rel=1e-12)
    # attention scales by the mean squared length (0.377 of s^2): more than f^2 (0.25, every sequence of the
    # mean length), less than f (what scaling every part by the fraction would charge)
    per_token = real.train_flops_per_sample / 6.0 - kinds["sequence"]
    assert kinds["tokens"] * f + kinds["attention"] * f * f < per_token < (kinds["tokens"] + kinds["attention"]) * f
    assert real.mp_bytes_per_sample == pytest.approx(padded.mp_bytes_per_sample * f)
    assert "--real_token_fraction" in real.source and "measured" in real.source


def test_the_squared_length_stays_between_its_bounds_and_meets_them_at_full_length():
    module = bert_module()
    assert module.squared_length_fraction(module.DATASET_REAL_TOKEN_FRACTION) == pytest.approx(
        module.DATASET_SQUARED_LENGTH_FRACTION, abs=1e-12)
    assert module.squared_length_fraction(1.0) == pytest.approx(1.0)
    for f in (0.05, 0.2, 0.4997, 0.7, 0.95):
        q = module.squared_length_fraction(f)
        assert f * f <= q <= f


def test_the_dataset_figures_follow_from_a_histogram_as_the_script_reads_it():
    spec = importlib.util.spec_from_file_location("bert_sequence_lengths",
                                                  os.path.join(REPO, "scripts", "bert_sequence_lengths.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    counts = script.read_histogram("x = 1\nwikipedia_histogram = np.array([\n  0, 2,\n 0, 2], dtype=np.int64)\n")
    assert counts == [0, 2, 0, 2]
    m = script.moments(counts)  # lengths 2 and 4 of at most 4: mean 3, squares (4 + 16) / 2 = 10 of 16
    assert m["mean_length"] == 3.0 and m["real_token_fraction"] == 0.75
    assert m["squared_length_fraction"] == 10 / 16 and m["full_share"] == 0.5
    with pytest.raises(ValueError):
        script.read_histogram("nothing here")


def test_padding_skipping_logs_are_refused_at_full_padding_with_the_flag_to_set():
    proc = cli_in_process("plan", BERT, "--system", "dgx-a100", "--chips", "64", "--calibrate", V11)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: calibration: the measured step (194.73 ms) is shorter")
    assert "skips the padding of variable-length sequences" in lines[0]
    assert f"pass --real_token_fraction {DATASET_FRACTION} (" in lines[0]
    assert "which calibrates these logs to 0.50 of peak" in lines[0]


def test_padding_skipping_logs_calibrate_and_project_with_the_fraction(capsys):
    assert planner.main(BERT, [], "dgx-a100", 64, None, [V11], None, False, False, None, False, None,
                        float(DATASET_FRACTION)) == 0
    out = capsys.readouterr().out
    assert "attention x 0.377 (mean squared length over s^2: the MLPerf dataset's, measured)" in out

    plan = planner.build(BERT, [], "dgx-a100", [V11], None, None, False, float(DATASET_FRACTION))
    assert out.rstrip().splitlines()[-1] == (f"projected time to train: {plan.at(64, 448).total_seconds / 60:.2f} "
                                             "min on 64 x dgx-a100 (global batch 448)")
    assert 0.3 < plan.efficiency < 0.8 and plan.cautions == []
    own = plan.at(8, 448)
    assert own.step.total == pytest.approx(plan.measurement.step_seconds, rel=1e-6)
    assert 0.3 < own.mfu < 0.8
    logged = statistics.median(run_minutes(V11))
    assert abs(own.total_seconds / 60 / logged - 1) < OWN_SCALE_TOLERANCE
    # other scales: more chips train faster, and less than linearly so
    wide = plan.at(64, 3072)
    assert wide.total_seconds < own.total_seconds and wide.mfu < own.mfu


def test_an_8_gpu_calibration_projects_the_64_gpu_step_it_never_saw():
    plan = planner.build(BERT, ["ruleset=1.0.0"], "dgx-a100", [V10], None, None, False, float(DATASET_FRACTION))
    step_ms = plan.at(64, 3072).step.total * 1e3
    assert abs(step_ms / HELD_OUT_64_GPU_STEP_MS - 1) < HELD_OUT_TOLERANCE


def test_a_padded_calibration_above_what_any_validated_one_reaches_is_flagged(capsys):
    plan = planner.build(BERT, [], "dgx-a100", [V10], None, None, False)
    assert plan.efficiency > planner.HIGH_EFFICIENCY
    assert len(plan.cautions) == 1
    assert f"pass --real_token_fraction {DATASET_FRACTION} (" in plan.cautions[0]
    assert plan.cautions[0] in "\n".join(planner.header(plan))


@pytest.mark.parametrize("config, fraction, says", [
    (RESNET, "0.5", "--real_token_fraction: resnet's samples have no padding to skip"),
    (BERT, "0", "--real_token_fraction 0: give the mean share of real (non-padding) tokens, above 0 and at most 1"),
    (BERT, "1.5", "--real_token_fraction 1.5: give the mean share of real"),
])
def test_a_fraction_that_cannot_apply_is_one_error_line(config, fraction, says):
    proc = cli_in_process("plan", config, "--system", "dgx-a100", "--chips", "8", "--real_token_fraction", fraction)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: " + says)


def test_a_fraction_still_too_large_for_the_logs_says_which_fit():
    module, cfg = bert_module(), bert_cfg()
    m = types.SimpleNamespace(chips=8, global_batch=448, step_seconds=0.05, eval_seconds=None, eval_mode="untimed",
                              evals=0.0, steps=0.0)
    system = planner.load_system("dgx-a100")
    with pytest.raises(HarnessError) as e:
        planner.calibrate_from(costs.with_real_tokens(cfg, module.COST, 0.5), system, m)
    text = planner.faster_than_peak(e.value, cfg, module.COST, system, m, 0.5)
    fits = planner.largest_fitting_fraction(cfg, module.COST, system, m)
    assert 0 < fits < 0.5 and f"only a fraction up to {fits:.3f} fits these logs" in text
    assert planner.efficiency_at(fits * 0.99, cfg, module.COST, system, m) is not None


def test_trimming_keeps_the_mllog_lines_of_one_rank():
    spec = importlib.util.spec_from_file_location("trim_logs", os.path.join(DATA, "trim_logs.py"))
    trim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trim)
    text = ("+ srun ...\n"
            '0: :::MLLOG {"key": "init_start", "time_ms": 1}\n'
            '3: :::MLLOG {"key": "init_start", "time_ms": 2}\n'
            "0: parsed args: Namespace(unpad=True)\n"
            '0: :::MLLOG {"key": "run_start", "time_ms": 3}  \n')
    assert trim.trim(text) == (':::MLLOG {"key": "init_start", "time_ms": 1}\n'
                               ':::MLLOG {"key": "run_start", "time_ms": 3}\n')


def test_a_measured_cost_is_scaled_by_the_counts_real_to_padded_ratio():
    module, cfg = bert_module(), bert_cfg()
    padded, real = costs.analytic(cfg), costs.with_real_tokens(cfg, module.COST, 0.6)
    measured = costs.ModelCost.from_dict(dict(padded.to_dict(), source="file x.json",
                                              train_flops_per_sample=2 * padded.train_flops_per_sample))
    scaled = planner.real_tokens(cfg, module.COST, measured, 0.6, True)
    assert scaled.train_flops_per_sample == pytest.approx(2 * real.train_flops_per_sample, rel=1e-12)
    assert scaled.source.startswith("file x.json; x ") and "real/padded ratio" in scaled.source
    # at 0.6, away from the dataset's own fraction, the squared term is the stated approximation
    assert "an approximation" in real.source


def test_the_fraction_given_to_another_command_is_refused():
    """Only `plan` reads --real_token_fraction: elsewhere it would be ignored without a word."""
    from conftest import stderr_error_lines

    for args in (["list"], ["check", os.path.join(V11, "result_0.txt")]):
        proc = cli_in_process(*args, "--real_token_fraction", DATASET_FRACTION)
        lines = stderr_error_lines(proc)
        assert proc.returncode == 2 and lines == ["error: --real_token_fraction goes with `plan`; no other command "
                                                  "reads it"], (args, proc.stdout, proc.stderr)
