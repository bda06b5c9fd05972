"""`mlperf-harness` (also `python -m harness`): run, check, list, campaign, package, report.

Bad input raises HarnessError anywhere below; this is the one place that turns it into a single
`error: ...` line and exit code 2.
"""
from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
from typing import Any

from absl import app, flags, logging

from harness.train import interrupt
from harness.errors import HarnessError, check_output_dir, describe_os_error

# ------------------------------------------------------------------ a quiet start
# `import tensorflow` makes its C++ libraries print several lines to file descriptor 2 before absl's logging
# is initialised (the oneDNN notice, "All log messages before absl::InitializeLog()"), which no environment
# variable silences. Unless asked (--verbose, MLPERF_HARNESS_VERBOSE=1), the first import of tensorflow,
# wherever it happens, runs with descriptor 2 pointed at a temporary file: the lines are dropped when the
# import succeeds and replayed when it fails. Everything after the import prints as usual.

VERBOSE_ENV = "MLPERF_HARNESS_VERBOSE"


def verbose_from_env() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                self.loader.exec_module(module)
            except BaseException as e:
                os.dup2(saved, 2)
                if not isinstance(e, KeyboardInterrupt):  # an interrupt is the user's, not the import's fault
                    captured.seek(0)
                    sys.stderr.write(captured.read().decode(errors="replace"))
                raise
            finally:
                os.dup2(saved, 2)
                os.close(saved)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` through the other finders and wraps its loader; removes itself on first use."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def silence_tensorflow_import() -> None:
    """Makes the process's first `import tensorflow` quiet on descriptor 2 (a no-op once imported)."""
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietFinder())


FLAGS = flags.FLAGS
flags.DEFINE_bool("verbose", False, "print TensorFlow's native start-up and info lines and the harness's info "
                  f"diagnostics (also: {VERBOSE_ENV}=1)")
flags.DEFINE_multi_string("set", [], "Config override key=value (repeatable), e.g. schedule.max_epochs=5")
flags.DEFINE_string("output_dir", None, "run: write runs under this directory (default: config output_dir)")
flags.DEFINE_bool("dry_run", False, "run: build the full-size model and compile one train and one eval step "
                  "under XLA on a stand-in replica; print sizes, FLOPs and memory; no data, no log")
flags.DEFINE_string("report_json", None, "run --dry_run: also write the compile report to this JSON file "
                    "(plan --model_cost reads it)")
flags.DEFINE_multi_string("ruleset", [], "check: ruleset(s) to check against; package: the one round to build for "
                          "(required unless the runs' own is the newest round). Default for check: the run's own, from "
                          "summary.json / config.yaml beside the log, else the benchmark's newest)")
flags.DEFINE_bool("rcp", False, "check: place the result logs (files or directories) of one benchmark "
                  "against the RCP mean for their batch size, with the official RCP checker's verdict")
flags.DEFINE_bool("preflight", False, "check --rcp: treat the logs as pilot runs at the batch to submit and "
                  "simulate full result sets: pass probability, normalization, runs to launch")
flags.DEFINE_float("confidence", 0.9, "check --rcp --preflight: RCP pass probability for LIKELY PASS, and the "
                   "probability of a valid result the runs to launch must reach")
flags.DEFINE_float("eval_every", None, "check: expected eval cadence (epochs or samples) for the "
                   "integrity checks (default: inferred from the log)")
flags.DEFINE_integer("runs", 0, "campaign: number of runs (0 = the benchmark's MLPerf count)")
flags.DEFINE_string("campaign_dir", None, "campaign: directory holding (or to hold) the campaign's runs")
flags.DEFINE_integer("first_seed", 1, "campaign: seed of the first run; later runs get distinct seeds")
flags.DEFINE_string("out", None, "package/report/export: output directory")
flags.DEFINE_string("max_shard_size", "5GB", "export: largest safetensors shard (e.g. 5GB, 500MB)")
flags.DEFINE_string("dtype", "float32", "export: tensor dtype written (float32 or bfloat16)")
flags.DEFINE_string("system", None, "package: system name (default: the logs' submission_platform)")
flags.DEFINE_multi_string("system_field", [], "package: system description field key=value (repeatable)")
flags.DEFINE_string("implementation", "tf2-mlperf-harness", "package: implementation directory name")
flags.DEFINE_bool("rcp_bypass", False, "package: accept a package whose only failure is the RCP check (printed "
                  "as a bypass; a real submission needs the submission committee's review of it)")
flags.DEFINE_bool("merged", False, "export of a LoRA run: also write the merged model (base + adapters) besides "
                  "the PEFT adapters")
flags.DEFINE_integer("chips", None, "plan: number of chips (GPUs, or TPU chips = cores / 2)")
flags.DEFINE_integer("global_batch", None, "plan: global batch (default: the config's; when that is smaller than "
                     "the replicas, the calibration logs' per-chip batch up to the convergence table's largest)")
flags.DEFINE_multi_string("calibrate", [], "plan: MLPerf result logs or directories at one scale of the system, "
                          "to derive the per-chip efficiency from their step times")
flags.DEFINE_integer("calibrate_chips", None, "plan: chips of the --calibrate logs (default: from their "
                     "submission_platform)")
flags.DEFINE_float("real_token_fraction", None, "plan: mean share of real (non-padding) tokens a sample costs, "
                   "for logs of implementations that skip padding (BERT's MLPerf data: 0.4997)")
flags.DEFINE_bool("sweep", False, "plan: project over chip counts and write a PNG (into --out, default .)")
flags.DEFINE_bool("json", False, "plan: print the projection as JSON")
flags.DEFINE_string("model_cost", None, "plan: JSON model cost (a ModelCost or a dry-run CompileReport)")
flags.DEFINE_enum("precision", "bf16", ["bf16", "fp8"], "plan: whose dense peak the compute and the MFU use "
                  "(the harness itself computes in bfloat16/float16/float32 today, no fp8)")
flags.DEFINE_bool("compile", False, "plan: take the model cost from the dry-run compile (minutes at full size)")
flags.DEFINE_bool("hashes", False, "data verify: also check the md5 / sha256 the references publish of files over "
                  "64 MB (reads each once; cached beside the data, keyed by each file's size, times and inode)")
flags.DEFINE_string("manifest", None, "data verify: the data manifest to check against (default: the workload's "
                    "benchmarks/<name>/data_manifest.yaml)")
flags.DEFINE_integer("port", 0, "data-service: port to listen on (dispatcher: required; worker: 0 = any)")
flags.DEFINE_string("dispatcher", None, "data-service worker: the dispatcher's HOST:PORT")
flags.DEFINE_string("advertise", "", "data-service worker: host name clients reach it by (default: "
                    "localhost for a local dispatcher, else this machine's name)")

# Each command: its arguments, one line on what it does, and the flags it reads (any other of the flags
# above given to it is refused by `stray_flag`, not silently ignored). `--help` lists these.
@dataclasses.dataclass(frozen=True)
class Command:
    args: str
    summary: str
    flags: tuple[str, ...]


COMMAND_HELP = {
    "run": Command("CONFIG", "run one benchmark (--dry_run: compile its steps under XLA before booking hardware)",
                   ("set", "output_dir", "dry_run", "report_json")),
    "data": Command("count CONFIG | verify CONFIG", "the sample counts the config's data files hold, or the "
                    "files against what the references publish", ("set", "hashes", "manifest")),
    "check": Command("LOG... | --rcp LOGS_OR_DIRS... [--preflight]", "official checker + integrity checks on any "
                     "log; --rcp: a result set against the RCP mean; --preflight: odds from pilot runs",
                     ("ruleset", "rcp", "preflight", "confidence", "eval_every")),
    "list": Command("", "workloads and their configs", ()),
    "campaign": Command("CONFIG", "N runs of a config with distinct seeds",
                        ("set", "runs", "campaign_dir", "first_seed")),
    "package": Command("CAMPAIGN_DIR | RUN_DIRS_OR_LOGS...", "lay out and check a submission tree for the round "
                       "--ruleset names (a campaign: the rules' median window)",
                       ("out", "system", "system_field", "implementation", "ruleset", "rcp_bypass")),
    "report": Command("LOGS_OR_DIRS...", "markdown + PNG review report", ("out",)),
    "plan": Command("CONFIG", "project time to train at scale",
                    ("set", "system", "chips", "global_batch", "calibrate", "calibrate_chips", "real_token_fraction",
                     "sweep", "json", "model_cost", "compile", "out", "precision")),
    "data-service": Command("dispatcher | worker", "tf.data service for training input",
                            ("port", "dispatcher", "advertise")),
    "export": Command("RUN_DIR", "a run's final weights as a Hugging Face checkpoint (a LoRA run: PEFT "
                      "adapters; --merged: also the merged model)", ("out", "max_shard_size", "dtype", "merged")),
}
COMMON_FLAGS = ("verbose",)
HELP_TOKENS = ("--help", "-h", "-help", "--helpshort", "-?")


def usage() -> str:
    """The command list, one line each."""
    width = max(len(c) for c in COMMAND_HELP)
    lines = ["usage: mlperf-harness COMMAND [ARGS] [--flags]", "", "commands:"]
    lines += [f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMAND_HELP.items()]
    lines += ["", "`mlperf-harness COMMAND --help` lists a command's flags; every flag: --helpfull"]
    return "\n".join(lines)


def command_usage(name: str) -> str:
    """One command's arguments and the flags it reads, with their help texts and defaults."""
    cmd = COMMAND_HELP[name]
    lines = [f"usage: mlperf-harness {name} {cmd.args}".rstrip(), f"  {cmd.summary}", "", "flags:"]
    for flag_name in cmd.flags + COMMON_FLAGS:
        flag = FLAGS[flag_name]
        text = flag.help.split(";\n")[0]  # absl appends "repeat this option ..." to a multi flag's help
        shown = flag.default not in (None, [], "", False)
        repeat = " (repeatable)" if isinstance(flag.default, list) and "repeatable" not in text else ""
        lines.append(f"  --{flag_name}: {text}{repeat}" + (f" (default: {flag.default})" if shown else ""))
    return "\n".join(lines)


def help_request(argv: list[str]) -> str | None:
    """The help text `argv` asks for (`--help` anywhere, `help [COMMAND]`), or None."""
    words = argv[1:]
    if words[:1] == ["help"]:
        return command_usage(words[1]) if len(words) > 1 and words[1] in COMMAND_HELP else usage()
    if not any(w in HELP_TOKENS for w in words):
        return None
    return command_usage(words[0]) if words and words[0] in COMMAND_HELP else usage()


USAGE = usage()

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cmd_list(args: list[str]) -> int:
    from harness import config as config_lib

    configs_root = os.path.join(REPO_ROOT, "configs")
    for name in config_lib.workload_names():
        folder = os.path.join(configs_root, name)
        files = sorted(f for f in os.listdir(folder) if f.endswith(".yaml")) if os.path.isdir(folder) else []
        try:
            cls = config_lib.find_workload(name)
            rulesets = ", ".join(cls.RULESETS)
            state = f"MLPerf key '{cls.MLPERF_KEY}', rulesets {rulesets}"
        except HarnessError as e:
            state = f"not available ({e})"
        print(f"{name}: {state}")
        for f in files:
            print(f"    configs/{name}/{f}")
    return 0


def cmd_run(args: list[str]) -> int:
    if len(args) != 1:
        raise HarnessError("run takes exactly one CONFIG file (overrides go in --set key=value)")
    if FLAGS.report_json and not FLAGS.dry_run:
        raise HarnessError("--report_json writes the --dry_run report; add --dry_run")
    if FLAGS.dry_run:
        from harness.dryrun import command

        return command.main(args[0], FLAGS.set, FLAGS.report_json)
    from harness.train import run

    return run.execute(args[0], FLAGS.set, FLAGS.output_dir)


def cmd_data(args: list[str]) -> int:
    if len(args) != 2 or args[0] not in ("count", "verify"):
        raise HarnessError("data takes `count CONFIG` or `verify CONFIG` (overrides go in --set key=value)")
    if args[0] == "verify":
        return _data_verify(args[1])
    if FLAGS.hashes or FLAGS.manifest:
        raise HarnessError("--hashes and --manifest go with `data verify`")
    from harness.train import reference

    counts = reference.count_data(args[1], FLAGS.set)
    for key, n in counts.items():
        print(f"data.{key}={n}")
    print("use: " + " ".join(f"--set data.{k}={n}" for k, n in counts.items()))
    return 0


def _data_verify(config_path: str) -> int:
    """One `error:` line per difference (exit 2), else what was checked."""
    from harness.data import verify as data_verify

    manifest, report = data_verify.verify_config(config_path, FLAGS.set, FLAGS.hashes, FLAGS.manifest)
    for line in report.warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in report.errors:
        print(f"error: {line}", file=sys.stderr)
    if report.errors:
        return 2
    shown = os.path.relpath(manifest.path)
    print(f"{manifest.workload} data matches {manifest.path if shown.startswith('..') else shown}:")
    for line in report.checked:
        print(f"  {line}")
    return 0


def cmd_check(args: list[str]) -> int:
    if FLAGS.preflight and not FLAGS.rcp:
        raise HarnessError("--preflight goes with --rcp: check --rcp --preflight PILOT_LOGS...")
    if FLAGS.rcp and FLAGS.preflight:
        from harness.review import rcp_preflight

        return rcp_preflight.main(args, FLAGS.ruleset, FLAGS.confidence)
    if FLAGS.rcp:
        from harness.review import rcp

        return rcp.main(args, FLAGS.ruleset)
    if not args:
        raise HarnessError("check takes one or more MLPerf log files")
    from harness.review import checklog

    return checklog.main(args, FLAGS.ruleset, FLAGS.eval_every)


def cmd_report(args: list[str]) -> int:
    if not args:
        raise HarnessError("report takes one or more MLPerf logs or directories")
    from harness.review import report

    out = check_output_dir(FLAGS.out or "report", "--out" if FLAGS.out else "report directory")
    return report.main(args, out)


def cmd_campaign(args: list[str]) -> int:
    if len(args) != 1:
        raise HarnessError("campaign takes exactly one CONFIG file")
    from harness.submission import campaign

    return campaign.main(args[0], FLAGS.set, FLAGS.runs, FLAGS.campaign_dir, FLAGS.first_seed)


def cmd_package(args: list[str]) -> int:
    if not args:
        raise HarnessError("package takes campaign directories, run directories or result logs")
    if not FLAGS.out:
        raise HarnessError("package needs --out DIR for the submission tree")
    check_output_dir(FLAGS.out, "--out")
    from harness.submission import package

    return package.main(args, FLAGS.out, FLAGS.system, FLAGS.system_field, FLAGS.implementation, FLAGS.ruleset,
                        FLAGS.rcp_bypass)


def cmd_plan(args: list[str]) -> int:
    if len(args) != 1:
        raise HarnessError("plan takes exactly one CONFIG file (and --system NAME --chips N)")
    if FLAGS.sweep:
        check_output_dir(FLAGS.out or ".", "--out")
    from harness.plan import planner

    return planner.main(args[0], FLAGS.set, FLAGS.system, FLAGS.chips, FLAGS.global_batch, FLAGS.calibrate,
                        FLAGS.calibrate_chips, FLAGS.sweep, FLAGS.json, FLAGS.model_cost,
                        _dry_run_compile if FLAGS.compile else None, FLAGS.out, FLAGS.real_token_fraction,
                        FLAGS.precision)


def _dry_run_compile(config_path: str, overrides: list[str]) -> Any:
    """`plan --compile`'s model cost: the dry run's compile, handed to plan (plan/ does not import the dry run),
    imported only when plan calls it (after its own checks, before which TensorFlow does not load)."""
    from harness.dryrun.command import compile_report

    return compile_report(config_path, overrides)


def cmd_data_service(args: list[str]) -> int:
    from harness.data import service as data_service

    if args == ["dispatcher"]:
        if not FLAGS.port:
            raise HarnessError("data-service dispatcher needs --port P")
        data_service.serve_dispatcher(FLAGS.port)
    elif args == ["worker"]:
        if not FLAGS.dispatcher:
            raise HarnessError("data-service worker needs --dispatcher HOST:PORT")
        data_service.serve_worker(FLAGS.dispatcher, FLAGS.port, FLAGS.advertise)
    else:
        raise HarnessError("data-service takes `dispatcher --port P` or `worker --dispatcher HOST:P`")
    return 0


def cmd_export(args: list[str]) -> int:
    from harness.export import weights as export

    return export.main(args, FLAGS.out, FLAGS.max_shard_size, FLAGS.dtype, FLAGS.merged)


COMMANDS = {"run": cmd_run, "check": cmd_check, "list": cmd_list, "report": cmd_report,
            "campaign": cmd_campaign, "package": cmd_package, "plan": cmd_plan, "data": cmd_data,
            "data-service": cmd_data_service, "export": cmd_export}


def stray_flag(command: str) -> str | None:
    """Why a flag only one command reads was given to another (which would ignore it silently), or None."""
    for name, owner in (("rcp_bypass", "package"), ("merged", "export"), ("implementation", "package"),
                        ("system_field", "package")):
        if FLAGS[name].present and command != owner:
            return f"--{name} goes with `{owner}`; no other command reads it"
    if command != "data" and (FLAGS.hashes or FLAGS.manifest):
        return "--hashes and --manifest go with `data verify`"
    if FLAGS["confidence"].present and not (command == "check" and FLAGS.rcp and FLAGS.preflight):
        return "--confidence goes with check --rcp --preflight; no other command reads it"
    if FLAGS["real_token_fraction"].present and command != "plan":
        return "--real_token_fraction goes with `plan`; no other command reads it"
    reads = set(COMMAND_HELP[command].flags + COMMON_FLAGS)
    for name in (n for cmd in COMMAND_HELP.values() for n in cmd.flags):
        if name not in reads and FLAGS[name].present:
            users = [c for c, cmd in COMMAND_HELP.items() if name in cmd.flags]
            return f"--{name} goes with {' / '.join(users)}; `{command}` does not read it ({command} --help)"
    return None


def dispatch(argv: list[str]) -> int:
    """Runs one command; a HarnessError becomes its one `error:` line and exit code."""
    if len(argv) < 2:
        print(USAGE)
        return 2
    command, args = argv[1], argv[2:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        stray = stray_flag(command)
        if stray:
            raise HarnessError(stray)
        # run and campaign stop on SIGTERM and SIGHUP as on SIGINT, their logs saying so (train/interrupt.py);
        # package too, with one line, its tree left marked incomplete
        with interrupt.handled(command in ("run", "campaign", "package")):
            return COMMANDS[command](args)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        print(f"error: {interrupt.message(e)}", file=sys.stderr)
        return interrupt.exit_code(e)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except OSError as e:  # a path the user named (or its disk) failed: the same line from every command
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:
        print(f"error: input is not UTF-8 text ({e.reason}: byte {e.object[e.start:e.start + 1]!r} at offset "
              f"{e.start})", file=sys.stderr)
        return 2


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool whose reader went away


def _quiet_broken_pipe() -> int:
    """`mlperf-harness check LOG | head -1`: the reader left; stop without a traceback or a second error
    when Python flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except OSError:
        pass
    return EXIT_BROKEN_PIPE


def main(argv: list[str]) -> None:
    if FLAGS.verbose or verbose_from_env():
        logging.set_verbosity(logging.INFO)
    else:
        # Before TensorFlow is imported anywhere: its C++ info and warning lines, then its start-up lines.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        silence_tensorflow_import()
        logging.set_verbosity(logging.WARNING)
    code = dispatch(argv)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _quiet_broken_pipe()
    # os._exit: a hung TPU connect thread or cluster runtime must not keep a failed run alive.
    sys.stderr.flush()
    os._exit(code)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parse, with a malformed or unknown flag as one `error:` line and exit code 2 (absl's own
    parser prints "FATAL Flags parsing error" and exits 1, the code of an aborted run)."""
    text = help_request(argv)
    if text is not None:  # before absl, whose --help prints only its own "USAGE: mlperf-harness [flags]"
        print(text)
        sys.exit(0)
    try:
        return FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e} (commands and flags: `mlperf-harness help`, all flags: --helpfull)",
              file=sys.stderr)
        sys.exit(2)


def entry_point() -> None:
    if sys.stdout is None or sys.stderr is None:  # started with descriptor 1 or 2 closed (`>&-`)
        if sys.stderr is not None:
            print("error: standard output is closed; send it somewhere (>/dev/null to drop it)", file=sys.stderr)
        sys.exit(2)
    app.run(main, flags_parser=parse_flags)
