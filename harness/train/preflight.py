"""Every check a run makes before its MLPerf log exists, in one order, shared by `run` and `run --dry_run`.

A config that cannot make a valid run fails here with one `error:` line, before a run directory, a log
file or a compile exists. The dry run goes through the same sequence on its stand-in runtime and skips
only the steps that need what it does not have: the data files, and (for the platform check) the real
devices; each skip says why where it happens. A closed run on real data checks its files against the
workload's data manifest (`harness/data/verify.py`) before they are read. Last, a run on the host's CPU
is held to the host's memory (`harness/train/host_memory.py`), which the dry run skips too.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf
from absl import logging

from harness import config as config_lib
from harness import mlperf, platforms
from harness.errors import HarnessError
from harness.runtime.base import Runtime
from harness.data import service as data_service
from harness.data import verify as data_verify
from harness.train import host_memory, reference, remote_input, weights_init
from harness.train.input_pipeline import pipeline_config
from harness.train.workload import EvalSchedule, Workload

# The unbatched train example, the parsed eval features and a note per fact stood in for the data.
DryRunInputs = tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]


@dataclasses.dataclass
class Checked:
    """What the checks produce that the run goes on to use."""
    workload: Workload
    schedule: EvalSchedule
    initialized: dict[str, str]          # weights_initialization tensor name -> variable path
    dry_run_inputs: DryRunInputs | None  # the dry run only: what stands in for the data files


def run_rulesets(cfg: config_lib.Config) -> list[str]:
    """The configured ruleset first, then every other `check_rulesets` entry: one log must pass them all."""
    return [cfg.ruleset] + [r for r in cfg.check_rulesets if r != cfg.ruleset]


def check_checker_rulesets(cfg: config_lib.Config) -> None:
    """Every ruleset the run's log is checked against is one the installed checker has, and its rules for
    the run's division list the benchmark: known after the run otherwise, with the log already a result
    and no summary."""
    benchmark = cfg.workload_class.MLPERF_KEY
    for ruleset in run_rulesets(cfg):
        mlperf.require_ruleset(ruleset)
        mlperf.require_benchmark(ruleset, cfg.submission.division, benchmark)


def check_batches(cfg: config_lib.Config, runtime: Runtime) -> None:
    """The global batch splits over the replicas and into the configured micro-batches; the eval batch
    splits over the replicas."""
    gbs, micro = cfg.schedule.global_batch_size, cfg.schedule.gradient_accumulation_steps
    runtime.check_batch(gbs)
    if gbs % (runtime.num_replicas * micro):
        raise HarnessError(f"schedule.global_batch_size={gbs} does not split into {micro} micro-batches "
                           f"(schedule.gradient_accumulation_steps) on each of {runtime.num_replicas} "
                           f"replica(s); use a multiple of {runtime.num_replicas * micro}")
    runtime.check_batch(cfg.schedule.eval_batch_size or gbs, "schedule.eval_batch_size")


def check_closed_target(cfg: config_lib.Config, workload: Workload) -> None:
    """A closed-division run may not stop at a quality below the ruleset's target."""
    closed = workload.closed_target(cfg.ruleset)
    if cfg.submission.division == "closed" and cfg.schedule.target and cfg.schedule.target < closed:
        raise HarnessError(f"schedule.target={cfg.schedule.target} is below the closed-division target {closed} "
                           f"for ruleset {cfg.ruleset}; use submission.division=open for a lower target")


def preflight(cfg: config_lib.Config, runtime: Runtime, dry_run: bool = False) -> Checked:
    """Builds the config's workload on `runtime` (not its model) and runs every pre-log check in order;
    HarnessError on the first that fails.

    `dry_run`: `runtime` is the dry run's stand-in replica, and the workload describes its inputs from the
    config (`Workload.dry_run_inputs`) where a run reads its data files.
    """
    if not dry_run:  # the stand-in is one CPU, not the devices submission.platform declares
        platforms.check_platform_matches(runtime, cfg.submission.platform, cfg.submission.division,
                                         cfg.runtime.allow_platform_mismatch)
    workload: Any = cfg.workload_class(cfg, runtime)
    if not dry_run:
        check_checker_rulesets(cfg)
    check_batches(cfg, runtime)
    check_closed_target(cfg, workload)
    inputs = None
    if dry_run:
        # In place of the data checks below: the config's share of `validate`, the data's sizes stood in.
        # Also skipped: the closed division's reference-model check, since the dry run compiles stand-ins
        # smaller than the reference (Workload.DRY_RUN_LINEAR) and a model's vocabulary can be the data's.
        inputs = workload.dry_run_inputs()
    else:
        reference.check_closed_model(workload)
        # Closed, real data: the files are the references' (names, sizes, counts; hashes only on request, from
        # `data verify`), before the checks below read them; open runs and synthetic data skip it and say so.
        logging.info(data_verify.check_closed_data(workload))
        # These read the data files (and reach the tf.data service), which a dry run does not have.
        workload.validate()
        data_service.validate(workload)
        remote_input.check(workload, runtime, bool(pipeline_config(cfg.data).service.dispatcher))
    schedule = workload.eval_schedule()
    # A ruleset that names the reference model's tensors must find all of them in this model, now.
    initialized = weights_init.plan(workload, run_rulesets(cfg), cfg.submission.division)
    if not dry_run:  # last: a config or data error is the more specific line; the stand-in's CPU is not the run's
        host_memory.check(cfg, runtime)
    return Checked(workload, schedule, initialized, inputs)
