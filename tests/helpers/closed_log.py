"""The log a closed run of a config that cannot run here would write: its own submission keys and a run's
timeline, for the official checker to judge (tests of the reference configs).

The keys are the workload's, logged by the run's own `log_submission_keys`; the timeline follows the
training loop (harness/train/loop.py: init, then per eval point of the workload's schedule a block from the
previous point, eval_start / eval_accuracy / eval_stop, and run_stop), with given eval scores.
"""
from __future__ import annotations

from typing import Any, Sequence

from harness import config as config_lib, mlperf
from harness.dryrun.standin import standin_checked
from harness.train import run
from harness.train.workload import SAMPLE, EvalPoint


def checked_workload(config: str, overrides: Sequence[str] = ()) -> tuple[config_lib.Config, Any]:
    """The config's workload after the dry run's pre-log checks (no data, weights or devices read)."""
    cfg = config_lib.load_config(config, list(overrides))
    checked, _, _ = standin_checked(cfg)
    return cfg, checked.workload


def write_run_log(path: str, cfg: config_lib.Config, workload: Any, scores: Sequence[float],
                  points: Sequence[EvalPoint] | None = None, status: str = "success") -> list[EvalPoint]:
    """Writes the log of a run whose evals score `scores`, at the workload's first len(scores) eval points
    (or at `points`), ending with run_stop `status`; returns the points used."""
    from mlperf_logging.mllog import constants as K

    schedule = workload.eval_schedule()
    points = list(points if points is not None else schedule.points)[:len(scores)]
    assert len(points) == len(scores), "more scores than eval points"
    log = mlperf.MLPerfLog(path)
    log.event(K.CACHE_CLEAR, True)
    log.start(K.INIT_START)
    run.log_submission_keys(log, cfg, workload)
    log.end(K.INIT_STOP)
    log.start(K.RUN_START)
    prev = EvalPoint(0, 0, 0)
    for point, score in zip(points, scores):
        first = schedule.first_epoch_num(prev)
        log.start(K.BLOCK_START, metadata={"first_epoch_num": first, "epoch_count": point.epoch_num - prev.epoch_num,
                                           "samples_count": prev.samples})
        log.end(K.BLOCK_STOP, metadata={"first_epoch_num": first, "samples_count": point.samples})
        log.start(K.EVAL_START, metadata={"epoch_num": point.epoch_num})
        position = {"samples_count": point.samples} if schedule.unit == SAMPLE else {}
        log.event(K.EVAL_ACCURACY, score, metadata={"epoch_num": point.epoch_num, **position})
        log.end(K.EVAL_STOP, metadata={"epoch_num": point.epoch_num})
        prev = point
    log.end(K.RUN_STOP, metadata={"status": status})
    log.close()
    return points
