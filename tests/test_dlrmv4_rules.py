"""dlrmv4's rules facts against the installed mlperf-logging 4.1.68 (training_6.1.0/closed_dlrmv4.yaml): the
eval grid and first-eval point, the closed keys in the order the checker reads them (a closed log of the
reference's keys passes the official checker; one evaluating a block early or with a base LR outside the band
fails), and the exact AUC against sklearn (tests/data/dlrmv4_golden/outputs.npz, with ties)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from mlperf_logging.mllog import constants as K

from harness import benchmark_rules as rules
from harness.mlperf import MLPerfLog, run_compliance_checker

from benchmarks.dlrmv4.hparams import WARMUP_STEPS, closed_hparams
from benchmarks.dlrmv4.metrics import exact_auc

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "dlrmv4_golden", "outputs.npz")


# gbs -> (steps between evals, samples at the first eval), the checker's formulas worked by hand.
@pytest.mark.parametrize("gbs, steps, first", [(1024, 2238, 48_125_952), (4096, 560, 52_756_480),
                                               (8192, 280, 57_344_000), (16384, 140, 71_106_560),
                                               (32768, 70, 94_044_160)])
def test_eval_grid_is_the_checkers(gbs, steps, first):
    cadence = rules.cadence("dlrmv4", "6.1.0", gbs)
    assert cadence.every == steps * gbs and cadence.first == first
    assert cadence.unit == rules.SAMPLE and cadence.first % cadence.every == 0


def test_exact_auc_counts_ties_a_half():
    golden = np.load(GOLDEN)
    assert len(np.unique(golden["auc_scores"])) < len(golden["auc_scores"]) / 10  # many ties
    assert exact_auc(golden["auc_scores"], golden["auc_labels"]) == pytest.approx(float(golden["auc"]), abs=1e-12)
    assert exact_auc([0.1, 0.2, 0.3], [0, 1, 1]) == 1.0
    assert exact_auc([0.5, 0.5], [0, 1]) == 0.5
    assert exact_auc([0.3, 0.2], [1, 1]) == 0.5  # one class: torchrec's 0.5


def write_closed_log(path: str, gbs: int, lr: float, first_eval: int, scores: list[float]) -> None:
    log = MLPerfLog(path)
    log.event(K.CACHE_CLEAR, True)
    log.start(K.INIT_START)
    for key, value in (("submission_org", "mlperf-harness"), ("submission_platform", "test"),
                       ("submission_division", "closed"), ("submission_status", "research"),
                       ("submission_benchmark", "dlrmv4"), ("seed", 1), ("global_batch_size", gbs),
                       ("gradient_accumulation_steps", 1), ("train_samples", rules.DLRMV4_TRAIN_SAMPLES),
                       ("eval_samples", rules.DLRMV4_EVAL_SAMPLES)):
        log.event(key, value)
    hparams = closed_hparams(lr, WARMUP_STEPS, 4096, {"linear": "bfloat16", "attn": "bfloat16", "comm": "fp16"},
                             gbs // 8, 8, "reference.yaml")
    for key, value in hparams.items():
        log.event(key, value)
    log.end(K.INIT_STOP)
    log.start(K.RUN_START)
    every = rules.dlrmv4_eval_every(gbs)
    prev = 0
    for i, score in enumerate(scores):
        samples = first_eval + i * every
        log.start(K.BLOCK_START, metadata={"first_epoch_num": prev, "epoch_count": samples - prev,
                                           "samples_count": prev})
        log.end(K.BLOCK_STOP, metadata={"first_epoch_num": prev, "samples_count": samples})
        log.start(K.EVAL_START, metadata={"epoch_num": samples})
        log.event(K.EVAL_ACCURACY, score, metadata={"epoch_num": samples, "samples_count": samples})
        log.end(K.EVAL_STOP, metadata={"epoch_num": samples})
        prev = samples
    log.end(K.RUN_STOP, metadata={"status": "success"})
    log.close()


def test_closed_log_of_the_reference_keys_passes_the_checker(tmp_path):
    gbs = 8192
    first = rules.dlrmv4_first_eval(gbs)
    low, high = rules.dlrmv4_lr_band(gbs)
    assert low < 1e-6 < high
    good = str(tmp_path / "good.log")
    write_closed_log(good, gbs, 1e-6, first, [0.63, 0.72, 0.751])
    verdict = run_compliance_checker(good, "6.1.0")
    assert verdict.passed, verdict.errors
    early = str(tmp_path / "early.log")
    write_closed_log(early, gbs, 1e-6, first - rules.dlrmv4_eval_every(gbs), [0.63, 0.72, 0.751])
    assert not run_compliance_checker(early, "6.1.0").passed
    hot = str(tmp_path / "hot.log")
    write_closed_log(hot, gbs, high * 1.1, first, [0.63, 0.72, 0.751])
    assert not run_compliance_checker(hot, "6.1.0").passed


def test_memory_bound_per_device_and_the_smallest_mesh():
    """benchmarks/dlrmv4/memory.py: the reference's tables split 8 ways are 75.02 GB of float32 rows and 0.15 GB of
    accumulators per device (the sizes worked by hand). Every device looking up the whole step's ids (GBS 8192 on
    8 H200s, batch not split over the rows' devices) is refused with no split fitting; a batch of 512 names 16
    devices, which then fits. Routed (batch split over the rows' devices): a device's lookups are its share's ids,
    its routing buffers n x min(its ids, an owner's rows) rows per lookup in each direction; GBS 8192 on 8 H200s
    is refused naming 32 devices, which fit, and fits the reference's 288 GB MI350X on 8."""
    from harness import config as config_lib

    from benchmarks.dlrmv4 import memory
    from conftest import REPO

    cfg = config_lib.load_config(os.path.join(REPO, "configs/dlrmv4/gpu-8x-h200.yaml"), [])
    b = memory.per_device(cfg, 8, 8192)
    assert b.tables == b.table_gradients == 4 * 512 * sum(-(-n // 8) for n in cfg.model.tables.values())
    assert round(b.tables / 1e9, 2) == 75.02 and round(b.accumulators / 1e9, 2) == 0.15
    assert b.lookups == 8 * 8192 * (3 * 4088 + 8) * 512 and b.dense == 16 * 15_243_057  # 3 candidate ids too
    assert b.routing == 0
    h200 = (141 * 10**9, "H200 141 GB")
    line = memory.refusal(cfg, 8, 8192, h200)
    assert line.startswith("dlrmv4 needs at least") and "no split of the rows fits" in line, line
    assert memory.smallest_mesh(cfg, 512, h200[0]) == 16
    assert "splits the rows 16 ways" in memory.refusal(cfg, 8, 512, h200)
    assert memory.refusal(cfg, 16, 512, h200) is None
    r = memory.per_device(cfg, 8, 1024, routed=True)
    assert r.lookups == 8 * 1024 * (3 * 4088 + 8) * 512 and r.tables == b.tables
    rows = {t: -(-n // 8) for t, n in cfg.model.tables.items()}
    slots = sum(8 * min(1024 * 4087, rows[t]) + 8 * min(1024, rows[t]) for t in ("item_id", "artist_id", "album_id"))
    assert r.routing == 2 * 4 * 512 * (slots + 8 * 1024 * 8)
    line = memory.refusal(cfg, 8, 8192, h200, routed=True)
    assert "1,024-sample share" in line and line.endswith("the smallest mesh that fits splits the rows 32 ways "
                                                          "(101.1 GiB)"), line
    assert memory.refusal(cfg, 32, 8192, h200, routed=True) is None
    assert memory.refusal(cfg, 8, 8192, memory.REFERENCE_DEVICE, routed=True) is None
