"""One run, top to bottom: config -> runtime -> workload -> loop -> MLPerf log -> compliance -> summary."""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time
from typing import Any

import tensorflow as tf

from harness import config as config_lib
from harness.review import integrity, logparse
from harness import benchmark_rules as rules
from harness import platforms, sysinfo
from harness.plan import mfu
from harness.data import service as data_service
from harness.export import weights as export
from harness.train import interrupt, reference, size_bound, weights_init
from harness.train.preflight import Checked, preflight, run_rulesets
from harness.errors import BAD_DATA_MARK, HarnessError, check_output_dir, op_error_line
from harness.train.input_pipeline import InputWait, pipeline_config
from harness.train.loop import RunResult, run_timed
from harness.train.progress import Progress
from harness.mlperf import KEYS as K
from harness.mlperf import Logged, MLPerfLog, Verdict, run_compliance_checker
from harness.runtime import distribute, make_runtime

EXIT_SUCCESS, EXIT_ABORTED, EXIT_NONCOMPLIANT = 0, 1, 3


def log_submission_keys(log: MLPerfLog, cfg: config_lib.Config, workload: Any,
                        initialized: dict[str, str] | None = None) -> None:
    """Submission keys, seed, sample counts, the workload's hyperparameters and the
    `weights_initialization` events the checked rulesets require (all before init_stop)."""
    sub = cfg.submission
    log.event(K.SUBMISSION_ORG, sub.org)
    log.event(K.SUBMISSION_PLATFORM, sub.platform)
    log.event(K.SUBMISSION_DIVISION, sub.division)
    log.event(K.SUBMISSION_STATUS, sub.status)
    log.event(K.SUBMISSION_BENCHMARK, workload.MLPERF_KEY)
    log.event(K.SEED, cfg.seed)
    log.event(K.GLOBAL_BATCH_SIZE, cfg.schedule.global_batch_size)
    log.event(K.GRADIENT_ACCUMULATION_STEPS, cfg.schedule.gradient_accumulation_steps)
    log.event(K.TRAIN_SAMPLES, workload.train_samples)
    log.event(K.EVAL_SAMPLES, workload.eval_samples)
    for key, value in workload.mllog_hparams().items():
        if isinstance(value, Logged):
            log.event(key, value.value, metadata=value.metadata)
        else:
            log.event(key, value)
    weights_init.log_events(log, initialized or {})
    model = reference.disclosure(workload)
    if model is not None:  # not an MLPerf key: the model beside its reference, for `check` and `package`
        log.event(reference.LOG_KEY, model)
    # Not an MLPerf key (checkers ignore it): makes a synthetic-data log say so itself.
    log.event("harness_data_source", workload.data_source)
    init = getattr(getattr(cfg, "model", None), "init_checkpoint", "")
    if init:  # not an MLPerf key either: the initial weights came from this checkpoint
        log.event("harness_init_checkpoint", init)


def new_run_dir(cfg: config_lib.Config, chief: bool) -> str:
    """The run's directory; only the chief decides whether it is taken.

    A non-chief host that looked could see the chief's fresh result file and quit; it writes nothing there.
    """
    run_id = cfg.run_id or time.strftime("%Y%m%d-%H%M%S") + f"-seed{cfg.seed}"
    path = os.path.join(cfg.output_dir, cfg.workload, run_id)
    if chief and os.path.exists(os.path.join(path, f"result_{cfg.seed}.txt")):
        raise HarnessError(f"{path} already holds a result for seed {cfg.seed}; choose another run_id")
    if chief and os.path.exists(os.path.join(path, f"incomplete_result_{cfg.seed}.log")):
        raise HarnessError(f"{path} holds the log of an unfinished run for seed {cfg.seed} (mllog appends, and "
                           f"that log is evidence); choose another run_id")
    # Any other run's files (another seed's log, config.yaml, summary.json) would be written over.
    held = sorted(os.listdir(path)) if chief and os.path.isdir(path) else []
    if held:
        raise HarnessError(f"{path} already holds another run's files ({', '.join(held[:4])}"
                           f"{', ...' if len(held) > 4 else ''}); choose another run_id")
    return path


def check_log(path: str, rulesets: list[str],
              eval_every: float | None = None) -> tuple[dict[str, Verdict], list[integrity.Finding]]:
    """The official checker for each ruleset plus the harness's own integrity checks."""
    verdicts = {r: run_compliance_checker(path, r) for r in rulesets}
    events = logparse.parse_log(path)
    # The rules' eval schedule is checked for every ruleset the log claims (closed ResNet and BERT).
    findings = integrity.check_integrity(events, eval_every=eval_every, ruleset=rulesets[0])
    for r in rulesets[1:]:
        findings += [f for f in integrity.check_eval_schedule(events, r) if f not in findings]
    return verdicts, findings


def execute(config_path: str, overrides: list[str], output_dir: str | None = None) -> int:
    """`mlperf-harness run`: one run top to bottom; the exit code (EXIT_*), or HarnessError for a config,
    device or input that cannot make a valid run (before the log exists wherever it can be known then).

    Config and runtime, then every pre-log check (`preflight`), then the run directory and the MLPerf log,
    the timed loop, and on the chief the compliance gate and summary (`finish`). (`run --dry_run` is
    harness/dryrun/command.py's `main`, dispatched by the command line: no runtime, data, run directory or log.)
    """
    cfg = config_lib.load_config(config_path, overrides)
    if output_dir:
        cfg.output_dir = output_dir
    check_output_dir(cfg.output_dir, "--output_dir" if output_dir else "output_dir")
    runtime = make_runtime(cfg.runtime, cfg.submission.platform)
    interrupt.reclaim()  # a multi-worker runtime's coordination service takes SIGTERM for itself
    checked = preflight(cfg, runtime)
    export.check(cfg, runtime)
    workload = checked.workload
    chief = runtime.is_chief
    run_dir = new_run_dir(cfg, chief)
    log_path = os.path.join(run_dir, f"result_{cfg.seed}.txt")
    # The log takes its result name only once the loop has ended: a run killed outright (SIGKILL, the
    # kernel's out-of-memory killer) leaves it under a name no tool reads as a result.
    open_path = os.path.join(run_dir, f"incomplete_result_{cfg.seed}.log")
    if chief:
        os.makedirs(run_dir, exist_ok=True)
        config_lib.dump_config(cfg, os.path.join(run_dir, "config.yaml"))
        synthetic = " on SYNTHETIC data" if workload.is_synthetic else f" on {workload.data_source} data"
        print(f"{cfg.workload}: {runtime.description}, global batch {cfg.schedule.global_batch_size}, "
              f"target {workload.target}{synthetic}", flush=True)
        tensorboard = os.path.join(run_dir, "tensorboard") if cfg.tensorboard else "off (set tensorboard: true)"
        print(f"output: {run_dir}\nlog: {log_path} (named {os.path.basename(open_path)} until the run ends)\n"
              f"tensorboard: {tensorboard}", flush=True)
    log = MLPerfLog(open_path if chief else None)
    try:
        with interrupt.last_words(log.interrupted):  # a run stuck past the signal's grace ends its log too
            result = _timed_run(cfg, runtime, checked, log, run_dir)
    except BaseException as e:
        stopped_by = interrupt.stopped_by(e)
        if stopped_by:  # SIGINT, SIGTERM, SIGHUP: the log says it was stopped
            log.interrupted(stopped_by)
            raise
        log.close()  # what was written stays under its incomplete name
        error = _as_harness_error(e, cfg, runtime)
        if error is not None:
            raise error from None
        raise
    finally:
        runtime.shutdown()
    log.close()
    if not chief:
        return EXIT_SUCCESS if result.status == "success" else EXIT_ABORTED
    os.replace(open_path, log_path)
    return finish(cfg, checked, runtime, result, run_dir, log_path)


def _timed_run(cfg: config_lib.Config, runtime: Any, checked: Checked, log: MLPerfLog, run_dir: str) -> RunResult:
    """The loop under the data service's stall guard, with progress lines (and TensorBoard when configured)."""
    workload, wait = checked.workload, InputWait()
    progress = Progress(runtime.is_chief, os.path.join(run_dir, "tensorboard") if cfg.tensorboard else None,
                        checked.schedule.unit, workload.METRIC, workload.target, workload.target_relation,
                        tuple(p.step for p in checked.schedule.points), cfg.schedule.global_batch_size)
    with data_service.StallGuard(wait, pipeline_config(cfg.data).service):
        # The submission keys come after init_start, so the loop calls back for them.
        result = run_timed(runtime, workload, log,
                           lambda: log_submission_keys(log, cfg, workload, checked.initialized),
                           progress=progress, wait=wait)
    if cfg.save_final_weights:  # after the log's run_stop: outside the time to train
        print(f"final weights: {export.save(runtime, workload, run_dir)}", flush=True)
    return result


def _as_harness_error(e: BaseException, cfg: config_lib.Config, runtime: Any) -> HarnessError | None:
    """The one-line error for a run that failed for a reason a user can act on (a lost peer, a data-service
    epoch cut short, corrupt or unreadable input data); None: re-raise `e` as it is."""
    if runtime.kind == "multi_worker":
        lost = distribute.lost_peer_error(e, cfg.runtime.collective_timeout_s)
        if lost is not None:
            return lost
    short_epoch = data_service.failure(e)
    if short_epoch is not None:
        return short_epoch
    bad_record = _data_assertion(str(e)) if isinstance(e, tf.errors.OpError) else None
    if bad_record:
        return HarnessError(f"corrupt input data: {bad_record}")
    if isinstance(e, tf.errors.DataLossError) or (isinstance(e, tf.errors.OpError)
                                                  and _looks_like_bad_data(str(e))):
        return HarnessError(f"corrupt or unreadable input data: {_first_line(e)}")
    return None


def device_name(cfg: config_lib.Config, runtime: Any) -> str:
    """What names the run's device for its peak FLOP/s: a GPU's reported name, a TPU slice's
    submission.platform; "" for other devices."""
    if runtime.device_type == "GPU":
        gpus = tf.config.list_physical_devices("GPU")
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "") if gpus else ""
    if runtime.device_type == "TPU":
        return cfg.submission.platform
    return ""


def finish(cfg: config_lib.Config, checked: Checked, runtime: Any, result: RunResult, run_dir: str,
           log_path: str) -> int:
    """On the chief after the loop: the compliance gate (official checker per ruleset, integrity checks),
    summary.json and the printed result; the exit code."""
    workload = checked.workload
    verdicts, findings = check_log(log_path, run_rulesets(cfg), eval_every=checked.schedule.cadence)
    summary = build_summary(cfg, workload, runtime, result, run_dir, log_path, verdicts, findings)
    bound = rules.record(workload.MLPERF_KEY).size_bound
    if bound and not all(v.passed for v in verdicts.values()):
        diagnosis = size_bound.diagnose(log_path, list(verdicts), bound)
        if diagnosis is not None:
            summary["size_bound"] = diagnosis
    # The implementation as it ran: pinned environment, and the uncommitted changes of a dirty checkout.
    with open(os.path.join(run_dir, "requirements.txt"), "w") as f:
        f.write(sysinfo.pinned_requirements())
    changes = sysinfo.harness_changes()
    summary["harness_dirty"] = bool(changes)
    if changes:
        with open(os.path.join(run_dir, "harness_changes.diff"), "w") as f:
            f.write(changes)
    summary_path = os.path.join(run_dir, "summary.json")
    try:
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=2)
    except OSError as e:  # a write's error (a full disk) names no file: name it
        raise OSError(e.errno, e.strerror, e.filename or summary_path) from None
    print_result(summary, result, verdicts, findings, log_path, os.path.join(run_dir, "summary.json"))
    if "size_bound" in summary:
        print(size_bound.describe(summary["size_bound"]))
    for line in summary.get("deviations", []):
        print(f"deviation from the reference: {line}")
    if summary.get("deviations") and cfg.submission.division == "closed":
        print("not compliant: a closed-division run must compute what the reference computes")
    if not summary["compliant"]:
        return EXIT_NONCOMPLIANT
    return EXIT_SUCCESS if result.status == "success" else EXIT_ABORTED


def build_summary(cfg: config_lib.Config, workload: Any, runtime: Any, result: RunResult, run_dir: str,
                  log_path: str, verdicts: dict[str, Verdict], findings: list[integrity.Finding]) -> dict[str, Any]:
    """summary.json: the result, its timings and throughput, the verdicts, and what ran where (host,
    versions, commit); compliant when every checker passed (an aborted run may miss only its target) and
    no integrity error was found."""
    errors = [f for f in findings if f.severity == "error"]
    aborted = result.status != "success"
    compliant = all(v.passed or (aborted and v.only_target_missed) for v in verdicts.values()) and not errors
    summary = {
        "workload": cfg.workload, "benchmark": workload.MLPERF_KEY, "ruleset": cfg.ruleset, "seed": cfg.seed,
        "status": result.status, "reason": result.reason,
        "data_source": workload.data_source, "synthetic_data": workload.is_synthetic,
        "model": reference.disclosure(workload),
        "time_to_train_s": round(result.run_time_s, 3),
        "time_to_train_min": round(result.run_time_s / 60, 4),
        result.converged_key: result.converged_at,
        "epochs_trained": round(result.epochs_done, 4), "samples_trained": result.samples,
        "train_samples_per_s": round(result.samples_per_s, 2),
        "init_time_s": round(result.init_time_s, 3), "train_time_s": round(result.train_time_s, 3),
        "eval_time_s": round(result.eval_time_s, 3), "target": result.target, "evals": result.evals,
        "global_batch_size": cfg.schedule.global_batch_size, "runtime": runtime.description,
        "num_replicas": runtime.num_replicas, "device_type": runtime.device_type,
        "num_hosts": runtime.num_hosts, "traces": result.traces,
        "input_wait": {"seconds": round(result.input_wait_s, 3),
                       "share_of_train_time": round(result.input_wait_s / result.train_time_s, 4)
                       if result.train_time_s > 0 else 0.0},
        "compliance": {r: {"verdict": v.label, "passed": v.passed, "errors": v.errors}
                       for r, v in verdicts.items()},
        "checker": {"package": "mlperf-logging", "version": checker_version()},
        "integrity": [{"severity": f.severity, "code": f.code, "message": f.message} for f in findings],
        "compliant": compliant, "log": os.path.abspath(log_path),
        "config": os.path.abspath(os.path.join(run_dir, "config.yaml")),
        "host": {"python": platform.python_version(), "tensorflow": tf.__version__,
                 "machine": platform.machine()},
        "harness_commit": sysinfo.harness_commit(),
        # The training node's facts: `package` describes the system from these, not from where it packages.
        "node": sysinfo.node_facts(runtime.device_type, runtime.num_replicas // max(runtime.num_hosts, 1),
                                   runtime.num_hosts, device_name(cfg, runtime)),
    }
    summary.update(mfu.model_flops(cfg, result.samples_per_s, platforms.devices_used(runtime),
                                   runtime.device_type, device_name(cfg, runtime)))
    if result.train_totals:
        summary["train_totals"] = result.train_totals
    deviations = workload.deviations(result.evals, result.train_totals)
    if deviations:
        summary["deviations"] = deviations
        # a closed result must be the reference's computation, whatever the checker (which cannot see it) says
        summary["compliant"] = summary["compliant"] and cfg.submission.division != "closed"
    if result.loss_scale is not None:
        summary["loss_scale"] = {"final": result.loss_scale["scale"],
                                 "skipped_steps": result.loss_scale["skipped_steps"]}
    return summary


def print_result(summary: dict[str, Any], result: RunResult, verdicts: dict[str, Verdict],
                 findings: list[integrity.Finding], log_path: str, summary_path: str) -> None:
    """The run's closing lines: status, time to train, each verdict, integrity, log, MFU, summary path."""
    errors = [f for f in findings if f.severity == "error"]
    synthetic = summary["synthetic_data"]
    tag = " [SYNTHETIC DATA: not a valid MLPerf result]" if synthetic else ""
    print(f"run {result.status}: {result.reason}")
    print(f"time to train: {result.run_time_s:.1f} s ({result.run_time_s / 60:.2f} min), "
          f"{result.epochs_done:.2f} epochs, {result.samples_per_s:.1f} train samples/s, "
          f"init {result.init_time_s:.1f} s{tag}")
    for r, v in verdicts.items():
        print(f"compliance (official checker, ruleset {r}): {v.label}")
        if not v.passed:
            for e in v.errors[:5]:
                print(f"    {e}")
    print(f"integrity checks: {'PASS' if not errors else 'FAIL'}"
          + "".join(f"\n    {f.severity}: {f.message}" for f in findings))
    print(f"log: {log_path}")
    print(mfu.mfu_line(summary, synthetic))
    print(f"summary: {summary_path}")


def checker_version() -> str:
    """The installed mlperf-logging version: verdicts are only meaningful together with it."""
    try:
        return importlib.metadata.version("mlperf-logging")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _looks_like_bad_data(message: str) -> bool:
    m = message.lower()
    return any(s in m for s in ("corrupt", "truncated record", "invalid jpeg", "decode", "parse",
                                "key: image", "feature: ", "data loss"))


def _data_assertion(message: str) -> str | None:
    """The sentence of an input pipeline's failed `BAD_DATA_MARK` assertion (its bracketed data items)."""
    for line in message.splitlines():
        if BAD_DATA_MARK in line:
            # "... [bad input data:] [item] [item] ...": tf.debugging.Assert prints each data item in brackets.
            rest = line.split(BAD_DATA_MARK, 1)[1].strip().lstrip("]").strip()
            rest = rest[1:] if rest.startswith("[") else rest
            rest = rest[:-1] if rest.endswith("]") else rest
            return " ".join(i.strip() for i in rest.split("] [") if i.strip())[:500] or None
    return None


def _first_line(e: BaseException) -> str:
    return op_error_line(getattr(e, "message", None) or str(e)) or type(e).__name__
