"""Shared helpers: run the CLI in a subprocess (device setup is per process) and read its outputs."""
from __future__ import annotations

import glob
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import harness  # noqa: F401 - before any test module imports TensorFlow: it then starts without Keras

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, "configs", "resnet", "smoke.yaml")
# The smoke's ResNet cut to one stage of width 4 on 8px images, for tests of the harness's mechanics (aborts,
# faults, reductions, runtimes, input files) rather than of the model: about half the CPU of the smoke's ResNet.
TINY_RESNET = ["model.blocks=[1]", "model.width=4", "data.image_size=8"]
# ResNet's TFRecord smoke (configs/resnet/smoke-tfrecord.yaml) as short as a run can be while still training to a
# target, for tests of what carries the run (campaigns and packaging, the tf.data service), not of ResNet's quality:
# 2,048 train images, 16px crops of 20px files (a quarter of the smoke's pixels), 256 eval images, short warmup,
# an open-division target of top-1 0.4 (10 classes: 0.1 untrained) judged every 2 epochs, which seeds reach at
# epoch 2 or 4 (seed 1: 0.46 at epoch 2; seed 2: 0.36 at epoch 2, 0.91 at epoch 4) within the 8-epoch budget;
# its ruleset alone (0.7.0's checker holds every run to top-1 0.759).
SHORT_RESNET_TFRECORD = ["data.train_samples=2048", "data.image_size=16", "data.eval_samples=256",
                         "optimizer.warmup_epochs=0.5", "check_rulesets=[]", "schedule.target=0.4",
                         "schedule.eval_every_epochs=2"]


def harness_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *args]


def script_result(script: str, timeout: float = 600) -> dict:
    """Runs a Python script (dedented) in a fresh process from the repository, where logical devices can still
    be set up, and returns the JSON of the last `RESULT ` line it printed; asserts it exited 0 and printed one."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return subprocess.run(harness_cmd(*args), cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def default_signals() -> None:
    """A child's preexec_fn: SIGINT, SIGTERM and SIGHUP at their default dispositions, as from a terminal.
    Under `nohup` or in a shell's background job the suite starts with SIGHUP or SIGINT ignored, and exec keeps
    an ignored signal ignored (the harness rightly leaves it so): a test that signals a child sets them."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def run_signalled(args: list[str], signum: int, stderr=subprocess.STDOUT,
                  at: str = "sample ") -> tuple[int, list[str], list[str]]:
    """`mlperf-harness ARGS` in a subprocess, sent `signum` once a line of its stdout starts with `at` (a
    training run's first progress line: mid-training): (exit code, the lines up to that one, the lines after).
    The child starts with default signal dispositions; `stderr` is where its stderr goes."""
    proc = subprocess.Popen(harness_cmd(*args), cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1"),
                            preexec_fn=default_signals)
    seen, after = [], []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(at):
                proc.send_signal(signum)
                break
        after = proc.stdout.readlines()
        proc.wait(timeout=300)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    return proc.returncode, seen, after


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """The CLI's dispatch in this process, for refusals that stop before a run (no device set up, no
    TensorFlow start per call): the same one `error:` line and exit code a subprocess would give."""
    import contextlib
    import io

    from absl import flags

    from harness import cli

    out, err = io.StringIO(), io.StringIO()
    flags.FLAGS.unparse_flags()  # every flag back to its default, as in a fresh process
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.dispatch(flags.FLAGS(["mlperf-harness", *args]))
    finally:
        flags.FLAGS.unparse_flags()
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def sets(*overrides: str, **kv) -> list[str]:
    """--set flags from `key=value` overrides, then from keyword args, '__' standing for '.'
    (schedule__max_epochs=1)."""
    out = [a for o in overrides for a in ("--set", o)]
    for k, v in kv.items():
        out += ["--set", f"{k.replace('__', '.')}={v}"]
    return out


def run_dir(output_dir: str, workload: str = "resnet") -> str:
    dirs = sorted(glob.glob(os.path.join(output_dir, workload, "*")))
    assert len(dirs) == 1, dirs
    return dirs[0]


def read_summary(output_dir: str, workload: str = "resnet") -> dict:
    with open(os.path.join(run_dir(output_dir, workload), "summary.json")) as f:
        return json.load(f)


def runs_in_one_process(devices: int, runs: list[list[str]], output_dir: str, env: dict | None = None,
                        timeout: float = 900) -> list[subprocess.CompletedProcess]:
    """`mlperf-harness run CONFIG [ARG ...] --output_dir OUTPUT_DIR/<n>` for each run, one after another in one
    process (tests/helpers/shipped_runs.py: one TensorFlow start, `devices` logical CPUs; a one-device config
    takes the first): a family's smokes share it. Per run, the CompletedProcess a subprocess of its own would
    give (its exit code, stdout and stderr); run n writes under OUTPUT_DIR/<n>."""
    helper = os.path.join(REPO, "tests", "helpers", "shipped_runs.py")
    args = [a for run in runs for a in ("--", *run)]
    proc = subprocess.run([sys.executable, helper, str(devices), output_dir, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout * len(runs),
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {})))
    results = []
    for line in proc.stdout.splitlines():
        status, config, detail = (line.split(" ", 2) + ["", ""])[:3]
        if status == "RESULT":
            r = json.loads(detail)
            results.append(subprocess.CompletedProcess(["run", config], r["code"], r["stdout"], r["stderr"]))
        elif status == "FAILED":
            results.append(subprocess.CompletedProcess(["run", config], None, "", json.loads(detail)))
    assert len(results) == len(runs), proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


def refusals_in_one_process(runs: list[tuple[str, list[str]]], output_dir: str, timeout: int = 600) -> list[str]:
    """`run.execute(config, overrides)` for each run in one fresh process (one TensorFlow start, devices as a
    run sets them up): per run, "error: <message>" for a HarnessError or "NO ERROR"."""
    script = textwrap.dedent(f"""
        from harness.train import run
        from harness.errors import HarnessError
        for config, overrides in {runs!r}:
            try:
                run.execute(config, overrides, {output_dir!r})
                print("NO ERROR")
            except HarnessError as e:
                print("error:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("error:", "NO ERROR"))]
    assert len(lines) == len(runs), proc.stdout + proc.stderr[-2000:]
    return lines


def refused(tmp_path, overrides: list[str], match: str, config: str) -> None:
    """`run.execute(config, overrides)` in this process is refused with a HarnessError matching `match`, and
    writes no result log (a log is written only for a run that starts)."""
    from harness.errors import HarnessError
    from harness.train.run import execute

    out = str(tmp_path / "runs")
    with pytest.raises(HarnessError, match=match):
        execute(config, overrides + [f"output_dir={out}"])
    assert not glob.glob(os.path.join(out, "**", "result_*"), recursive=True)


def stderr_error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def free_ports(n: int, consecutive: bool = False) -> list[int]:
    """n ports on 127.0.0.1 free right now (`consecutive`: p, p + 1, ...) for the servers a test starts.

    Taken below the kernel's ephemeral range (32768+ on Linux), which bind(0) and outgoing connections draw
    from, so no other process gets one between this check and the server's bind; and from a slice of 1000
    ports per pytest-xdist worker, so the workers of one session never pick the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    low = 20000 + 1000 * (int(worker.removeprefix("gw") or 0) % 12)
    start = random.randrange(1000)
    picked: list[int] = []
    for i in range(1000):
        port = low + (start + i) % 1000
        if consecutive and picked and port != picked[-1] + 1:
            picked = []
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                picked = []
                continue
        picked.append(port)
        if len(picked) == n:
            return picked
    raise RuntimeError(f"no {n} free ports in {low}-{low + 999}")


# pytest-xdist (`make test` runs `pytest -n auto --dist loadfile`): test files that share one in-process
# cache run in the same worker, or each worker would build it anew. The step cases' subprocesses
# (tests/step_cases.py) run once per session only because of this (the collection check below holds every
# step_cases mark to these files); tests/dry_run_shared.py's compiles are shared the same way.
SHARED_WORKER = {
    "test_workload_contract.py": "step cases", "test_xla_precision.py": "step cases",
    "test_dry_run.py": "dry runs", "test_tpu_rules.py": "dry runs",
}
# The files (or groups) that take longest, longest first: the workers start their units first so that none of
# them starts last and leaves the other workers idle at the end (the rest keep their order; a unit split from
# a file takes the file's place). Serial seconds per file on 2 cores under load ~8, before the splits below:
# test_shipped_configs 540, step cases 420, test_ruleset_matrix 330, test_transformer 300, test_data_service
# 245, test_e2e_resnet 240, dry runs 220, test_multi_worker 200, test_ssd 185, then 120 and less. Since the
# splits the two SHARED_WORKER groups are the longest units, with qwen35's two smokes (180 CPU-s at 8fdc38f,
# on an idle AVX-512 machine: its mesh smoke alone ~140); `scripts/suite_schedule.py` projects the wall time.
LONGEST_FIRST = ["step cases", "test_qwen35_grpo_runs.py", "dry runs", "test_shipped_configs.py",
                 "test_ruleset_matrix.py", "test_transformer.py",
                 "test_data_service.py", "test_e2e_resnet.py", "test_multi_worker.py", "test_ssd.py",
                 "test_llama31_8b.py"]


# Long files split over the workers: the tests that use one of the file's module-scoped fixtures (its smoke
# runs, read by several tests) are one work unit, `<file>~fixtures`; every other test is a unit of its own.
# Which tests use them is read from the file's source (the scheduler sees test ids only); the collection
# checks it against pytest's own fixture closure. A file with an in-process cache outside fixtures stays whole.
SPLIT_FILES = {"test_ruleset_matrix.py", "test_multi_worker.py", "test_host_memory.py", "test_bert.py",
               "test_e2e_resnet.py", "test_transformer.py", "test_data_service.py", "test_ssd.py", "test_gpt_oss.py",
               "test_llama2_lora.py", "test_deepseek_v3.py"}
_fixture_users: dict[str, set[str]] = {}
# A test whose parameter id starts with "<unit>~" is a work unit with the file's other tests of that unit
# (`<file>~<unit>`): a file of long independent parts that share a fixture per part (tests/test_shipped_configs.py's
# groups of smoke runs, one process each) spreads over the workers instead of running on one.
UNIT_IN_ID = re.compile(r"\[([\w.-]+)~")


def unit_rank(scope: str) -> int:
    """A work unit's place in LONGEST_FIRST (a unit split from a file takes the file's place), or after them."""
    for key in (scope, scope.split("::")[0].split("~")[0]):
        if key in LONGEST_FIRST:
            return LONGEST_FIRST.index(key)
    return len(LONGEST_FIRST)


def module_fixture_users(path: str) -> set[str]:
    """The test functions of a test file that take, directly or through the file's other fixtures, a fixture
    the file defines with a scope wider than the function's."""
    if path not in _fixture_users:
        import ast

        with open(os.path.join(REPO, path)) as f:
            tree = ast.parse(f.read())
        fixtures, tests = {}, {}
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            args = {a.arg for a in node.args.args}
            marks = [d for d in node.decorator_list if "fixture" in ast.unparse(d)]
            if marks:
                wide = any(kw.arg == "scope" and getattr(kw.value, "value", "function") != "function"
                           for d in marks if isinstance(d, ast.Call) for kw in d.keywords)
                fixtures[node.name] = (wide, args)
            elif node.name.startswith("test"):
                tests[node.name] = args
        wide = {name for name, (is_wide, _) in fixtures.items() if is_wide}
        while True:  # a function-scoped fixture that takes a wide one passes it on
            more = {name for name, (_, args) in fixtures.items() if args & wide} - wide
            if not more:
                break
            wide |= more
        _fixture_users[path] = {name for name, args in tests.items() if args & wide}
    return _fixture_users[path]


def _scope(nodeid: str) -> str:
    """The xdist work unit of a test: its file's name, the SHARED_WORKER group of its file, `<file>~<unit>` for
    a test id that names its unit, or in a SPLIT_FILES file the test itself or `<file>~fixtures`."""
    path, _, rest = nodeid.partition("::")
    name = os.path.basename(path)
    unit = UNIT_IN_ID.search(rest)
    if unit:
        return f"{name}~{unit.group(1)}"
    if name in SPLIT_FILES:
        function = rest.split("::")[-1].split("[")[0]
        return f"{name}~fixtures" if function in module_fixture_users(path) else f"{name}::{rest}"
    return SHARED_WORKER.get(name, name)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core, at most 4. Each worker's TensorFlow (and the subprocesses its tests
    start) already uses every core for its ops; the workers fill the single-threaded stretches (imports,
    tracing, compiles, process starts). More than 4 would mostly add memory (a few GiB per worker) and
    the longest file bounds the wall time anyway. PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the SHARED_WORKER files in one work unit and the units in collection order
    (pytest_collection_modifyitems puts LONGEST_FIRST first) instead of xdist's most-tests-first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False
    return SharedFileScheduling(config, log)


# Per-test CPU seconds, `SUITE_CPU_LOG=FILE make test`: one JSON line per test (its id, its xdist work unit, wall
# seconds, the CPU seconds of the pytest process and of the subprocesses it reaped meanwhile), appended by every
# worker. On a shared machine a test's wall time says how busy the machine was; its CPU seconds say what it costs
# (`scripts/suite_schedule.py --cpu FILE` sums them per work unit). A subprocess is counted when it is reaped, by
# the test that waits for it (the step cases' processes, started by one test, land on the one that reads them).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("SUITE_CPU_LOG")
    if not path:
        yield
        return
    cpu = lambda who: sum(resource.getrusage(who)[:2])  # noqa: E731 - user + system seconds
    t0, self0, children0 = time.time(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    yield
    line = json.dumps({"test": item.nodeid, "unit": _scope(item.nodeid), "wall": round(time.time() - t0, 2),
                       "cpu": round(cpu(resource.RUSAGE_SELF) - self0, 2),
                       "children": round(cpu(resource.RUSAGE_CHILDREN) - children0, 2)})
    with open(path, "a") as f:
        f.write(line + "\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "step_cases(onednn, name=None): the test reads tests/step_cases.py's "
                            "results in these oneDNN modes, for its `name` parameter or the workload `name`")


def pytest_collection_modifyitems(config, items):
    """Under xdist, the LONGEST_FIRST work units first (a stable sort: the order within files is kept)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: unit_rank(_scope(item.nodeid)))


def pytest_collection_finish(session):
    """Tells tests/step_cases.py which workloads the selected tests read (after -k/-m deselection), so each
    oneDNN mode's step cases run in one process. Under xdist every worker collects every test, but only the
    worker that runs the SHARED_WORKER "step cases" unit asks for a step case, so they still run once."""
    import step_cases

    for item in session.items:
        module = item.nodeid.split("::", 1)[0]
        if os.path.basename(module) in SPLIT_FILES:
            shared = [name for name, defs in item._fixtureinfo.name2fixturedefs.items()
                      if defs[-1].scope != "function" and defs[-1].baseid == module]
            assert bool(shared) == _scope(item.nodeid).endswith("~fixtures"), \
                f"{item.nodeid}: uses {shared}, but conftest.module_fixture_users reads its source otherwise"
        mark = item.get_closest_marker("step_cases")
        if mark is None:
            continue
        assert _scope(item.nodeid) == "step cases", \
            f"{item.nodeid}: a test file that reads step cases belongs in conftest.SHARED_WORKER's 'step cases'"
        callspec = getattr(item, "callspec", None)
        name = mark.kwargs.get("name") or (callspec.params["name"] if callspec else None)
        assert name, f"{item.nodeid}: a step_cases mark needs a workload (name= or a `name` parameter)"
        step_cases.plan(name, tuple(mark.kwargs["onednn"]))


@pytest.fixture
def tmp_out(tmp_path):
    return str(tmp_path / "runs")
