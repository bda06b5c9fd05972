"""Every registered workload, every ruleset it accepts: one real tiny run whose log the official checker
passes for all of them (an aborted run may miss only the quality target).

One run per workload, all in one process (conftest.runs_in_one_process: one TensorFlow start): the harness
checks its log against `ruleset` and every `check_rulesets` entry and writes each verdict to summary.json.
The runs use the smoke configs shrunk to a few steps and one eval, in the closed division, but keep the
reference architecture's structure (ResNet-50's 3-4-6-3 bottlenecks, BERT-large's 24 layers, at tiny
widths): rulesets 1.1.0-2.1.0 require a weights_initialization event for each of the reference model's
tensors, and the harness refuses a model that cannot name them all.
"""
from __future__ import annotations

import importlib.metadata
import os

import pytest

from benchmarks import registry
from harness.review import logparse
from harness.train import weights_init

from conftest import REPO, read_summary, runs_in_one_process, sets

# Closed division: its rules are the strict superset (hyperparameters, weights_initialization).
MATRIX = {
    "resnet": ("configs/resnet/smoke.yaml",
               sets(submission__division="closed", model__blocks="[3,4,6,3]", model__width=4,
                    data__image_size=16, data__train_samples=128, data__eval_samples=101,
                    schedule__max_epochs=4, schedule__eval_every_epochs=4)),
    # Closed BERT evaluates at the rules' cadence, 150,000 samples at this batch: 74 steps of a model
    # small enough (width 8, 8 tokens) that they cost less than compiling its 24 layers.
    "bert": ("configs/bert/smoke.yaml",
             sets(submission__division="closed", model__num_layers=24, model__hidden_size=8,
                  model__num_heads=2, model__ff_size=8, model__max_position=8, model__vocab_size=16,
                  data__seq_length=8, data__max_predictions=1, data__train_samples=150000,
                  data__eval_samples=100, data__eval_every_samples=0, schedule__global_batch_size=2048,
                  schedule__max_epochs=1, schedule__steps_per_loop=100)),
    # Transformer-big's 6+6 layers at width 16; a few hundred pairs make a 2-step epoch, one eval.
    "transformer": ("configs/transformer/smoke.yaml",
                    sets(submission__division="closed", model__num_layers=6, model__hidden_size=16,
                         model__num_heads=2, model__filter_size=16, data__synthetic_train_pairs=300,
                         data__eval_samples=24, schedule__eval_batch_size=24, schedule__max_epochs=1)),
    # SSD300's layout (ResNet-34's 3-4-6 blocks, 5 extras, 6 maps, 8732 anchors) at width 4; ruleset 1.1.0
    # evaluates every 5 epochs, so 5 epochs of 32 images make 10 steps and one eval.
    "ssd": ("configs/ssd/smoke.yaml",
            sets(submission__division="closed", model__image_size=300, model__blocks="[3,4,6]", model__width=4,
                 model__extra_channels="[[4,8],[4,8],[4,8],[4,8],[4,8]]", model__feature_sizes="[38,19,10,5,3,1]",
                 model__steps="[8,16,32,64,100,300]", model__scales="[21,45,99,153,207,261,315]",
                 model__aspect_ratios="[[2],[2,3],[2,3],[2,3],[2],[2]]", data__train_samples=32,
                 data__eval_samples=16, schedule__global_batch_size=16, schedule__eval_batch_size=16,
                 schedule__max_epochs=5)),
    # gpt_oss_20b in the open division: closed needs 1024 eval rows of 8192 tokens and an eval every
    # 12,288 samples. The open checker still checks every other key, max_sequence_length 8192 included,
    # so the run keeps 8192-token rows: one step at width 8 and one eval row (the target is missed).
    "gpt_oss_20b": ("configs/gpt_oss_20b/smoke.yaml",
                    sets(model__hidden_size=8, model__head_dim=2, model__expert_hidden=8,
                         data__synthetic_train_rows=2, data__eval_samples=1, schedule__eval_batch_size=2,
                         schedule__max_epochs=1, data__eval_every_samples=2)),
    # llama31_8b in the open division (its open checker's one rule, eval_accuracy < 1.0, is the quality
    # target): one step of 8 rows at width 8 and one eval (the target is missed).
    "llama31_8b": ("configs/llama31_8b/smoke.yaml",
                   sets(model__hidden_size=8, model__head_dim=2, model__ffn_hidden=8, data__synthetic_train_rows=8,
                        data__eval_samples=2, schedule__eval_batch_size=2, schedule__max_epochs=1,
                        data__eval_every_samples=8)),
    # llama2_70b_lora in the open division, one step of 8 rows and one eval (the target is missed), checked
    # under 5.0.0-6.1.0 only: the open rules of 4.0.0 and 4.1.0 do not list the benchmark (a run refuses
    # them, mlperf.require_benchmark); closed 4.0.0-6.1.0 are proven on the reference config's keys by
    # tests/test_llama2_lora.py.
    "llama2_70b_lora": ("configs/llama2_70b_lora/smoke.yaml",
                        sets(data__synthetic_train_rows=8, data__eval_samples=8, schedule__max_epochs=1,
                             data__eval_every_samples=8, data__eval_skip=0, model__num_layers=1),
                        ("5.0.0", "5.1.0", "6.0.0", "6.1.0")),
}

# Workloads whose checker no tiny run can pass, in either division: workload -> where their logs are proven.
# deepseekv3_671b's open checker binds global_batch_size >= 15360, rows of 4096 tokens and 1024 eval rows
# (hours of CPU even for its 0.36M-parameter tiny model); its smoke logs are held to every other rule there.
# dlrmv4's open checker pins Yambda-5B's train and eval sample counts and a base LR of 0.5-1.5 x 1e-6 x GBS / 8192
# (too small to train a CPU-size batch); its smoke logs are held to every other rule there.
SIZE_BOUND = {"deepseekv3_671b": "tests/test_deepseek_v3.py", "dlrmv4": "tests/test_dlrmv4_runs.py",
              "qwen35_397b_grpo": "tests/test_qwen35_grpo_runs.py"}
# Workloads whose shipped smoke already is the tiny run: its test holds every accepted ruleset's verdict and
# the weights_initialization names. flux1's open checker binds the quality target itself (averaged_validation_loss
# <= 0.586), which only a run that trains a few epochs reaches: its smoke, run once in the suite, there.
SMOKE_PROVES = {"flux1": "tests/test_flux1_runs.py"}
ELSEWHERE = {**SIZE_BOUND, **SMOKE_PROVES}


MATRIXED = [n for n in registry.names() if n not in ELSEWHERE]


def rulesets_of(workload: str) -> list[str]:
    config, overrides, *checked = MATRIX[workload]
    return list(checked[0] if checked else registry.get(workload).RULESETS)


@pytest.fixture(scope="module")
def matrix_runs(tmp_path_factory) -> dict:
    """workload -> (its CompletedProcess, its output dir): every MATRIX run, one after another in one process."""
    runs, names = [], [n for n in MATRIXED if n in MATRIX]
    for workload in names:
        config, overrides, *_ = MATRIX[workload]
        rulesets = rulesets_of(workload)
        runs.append([os.path.join(REPO, config), *overrides,
                     *sets(ruleset=rulesets[-1], check_rulesets="[" + ",".join(rulesets[:-1]) + "]")])
    out = str(tmp_path_factory.mktemp("matrix"))
    procs = runs_in_one_process(1, runs, out)
    return {w: (p, os.path.join(out, str(n))) for n, (w, p) in enumerate(zip(names, procs))}


@pytest.mark.parametrize("workload", MATRIXED)
def test_every_accepted_ruleset_passes_the_official_checker(workload, matrix_runs):
    assert workload in MATRIX, (f"add a tiny run for {workload} to MATRIX: every workload's accepted "
                                f"rulesets must be proven by a real log")
    rulesets = rulesets_of(workload)
    proc, tmp_out = matrix_runs[workload]
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    summary = read_summary(tmp_out, workload)
    verdicts = {r: v["verdict"] for r, v in summary["compliance"].items()}
    assert sorted(verdicts) == sorted(rulesets)
    for ruleset, verdict in verdicts.items():
        ok = ("PASS",) if summary["status"] == "success" else ("PASS", "FAIL (quality target")
        assert verdict.startswith(ok), (ruleset, summary["compliance"][ruleset])
    assert summary["compliant"] and summary["checker"]["version"] == importlib.metadata.version("mlperf-logging")
    # The rulesets that name tensors got exactly one event per name.
    logged = [e.metadata.get("tensor") for e in logparse.parse_log(summary["log"])
              if e.key == weights_init.KEY]
    required, _ = weights_init.required_for_run(summary["benchmark"], rulesets, "closed")
    assert sorted(logged) == sorted(required)


def test_workloads_proven_elsewhere_are_registered_and_proven_where_named():
    for workload, test_file in ELSEWHERE.items():
        assert workload in registry.names() and workload not in MATRIX
        with open(os.path.join(REPO, test_file)) as f:
            source = f.read()
        proof = "run_compliance_checker" if workload in SIZE_BOUND else "required_for_run"
        assert proof in source and f'"{workload}"' in source, test_file
