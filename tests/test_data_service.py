"""tf.data service: a dispatcher and two workers started by `mlperf-harness data-service` on 127.0.0.1
(subprocesses, always cleaned up, every wait bounded). Each epoch served sees every id exactly once; the
ResNet TFRecord and llama31_8b smokes reach their targets through the service with compliant logs, short
BERT, Transformer, SSD and gpt_oss_20b runs log compliantly through it; a worker killed mid-run is survived or
ends the run with one `error:` line and an incomplete log, never a hang."""
from __future__ import annotations

import glob
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import (REPO, SHORT_RESNET_TFRECORD, TINY_RESNET, cli_in_process, free_ports, harness_cmd,
                      runs_in_one_process, stderr_error_lines)
from harness.runtime.base import InputContext
from harness.data.service import distribute_epochs
from harness.train.input_pipeline import ServiceConfig, pipeline_config, train_options

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
START_TIMEOUT_S = 180  # importing TensorFlow on a loaded 2-core machine


def free_port() -> int:
    """One port from conftest's per-xdist-worker slice below the ephemeral range (no race with bind(0))."""
    return free_ports(1)[0]


class Proc:
    """A subprocess whose stdout lines are read by a thread, so every wait on it can be bounded."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(harness_cmd(*args), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._read, args=(self.p.stdout, self.stdout, True), daemon=True).start()
        threading.Thread(target=self._read, args=(self.p.stderr, self.stderr, False), daemon=True).start()

    def _read(self, stream, store: list[str], announce: bool) -> None:
        for line in stream:
            store.append(line.rstrip("\n"))
            if announce:
                self.lines.put(line)

    def wait_line(self, text: str, timeout: float) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, min(1.0, deadline - time.time())))
            except queue.Empty:
                if self.p.poll() is not None:
                    break
                continue
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout} s; stdout {self.stdout[-5:]}, "
                             f"stderr {self.stderr[-5:]}")

    def stop(self, interrupt: bool = False) -> int | None:
        """Ends the process (Ctrl-C first when `interrupt`: a server ends quietly with 0 on it); its exit code."""
        if interrupt and self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                return self.p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass  # still serving: killed below, and the caller sees None
        if self.p.poll() is not None:
            return self.p.returncode  # ended before: its own exit code (a killed worker's -9)
        self.p.kill()
        self.p.wait(timeout=30)
        return None if interrupt else self.p.returncode


class Fleet:
    """A dispatcher and two workers on 127.0.0.1, started with the harness's own command."""

    def __init__(self) -> None:
        self.port = free_port()
        self.procs: list[Proc] = []
        self.killed: list[Proc] = []  # killed by a test on purpose
        try:
            self.procs.append(Proc("data-service", "dispatcher", f"--port={self.port}"))
            self.procs[0].wait_line("data-service dispatcher ready", START_TIMEOUT_S)
            self.workers = [Proc("data-service", "worker", f"--dispatcher=127.0.0.1:{self.port}")
                            for _ in range(2)]
            self.procs += self.workers
            for w in self.workers:
                w.wait_line("data-service worker ready", START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    @property
    def dispatcher(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def stop(self, interrupt: bool = False) -> list[int | None]:
        return [p.stop(interrupt) for p in self.procs[::-1]][::-1]  # the workers first


@pytest.fixture(scope="module")
def fleet():
    f = Fleet()
    yield f
    # Ctrl-C ends a dispatcher and its workers quietly with 0 (the servers' join() once blocked it in C++).
    codes = f.stop(interrupt=True)
    expected = [-signal.SIGKILL if p in f.killed else 0 for p in f.procs]
    assert codes == expected, (codes, [p.stderr[-3:] for p in f.procs])


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    from benchmarks.resnet.tfrecord_writer import write_imagenet_tfrecords

    out = str(tmp_path_factory.mktemp("imagenet"))
    write_imagenet_tfrecords(out, 2048, 256, image_size=20, noise=0.3)
    return out


def resnet_sets(data_dir: str) -> list[str]:
    # What is tested is that every image reaches the step with its label through the workers, not ResNet's
    # quality: the short run to a target (its ruleset, 4.0.0, alone).
    return [f"data.data_dir={data_dir}", *SHORT_RESNET_TFRECORD]


def smoke_args(data_dir: str, out: str, dispatcher: str, *extra: str) -> list[str]:
    args = ["run", os.path.join(REPO, "configs", "resnet", "smoke-tfrecord.yaml"), f"--output_dir={out}"]
    sets = resnet_sets(data_dir) + [f"data.service.dispatcher={dispatcher}", *extra]
    return args + [a for e in sets for a in ("--set", e)]


def test_every_epoch_through_the_service_sees_each_id_once(fleet):
    n, batch = 100, 8
    epoch = tf.data.Dataset.range(n).shuffle(n)
    ds = distribute_epochs(epoch, n, batch, ServiceConfig(dispatcher=fleet.dispatcher))
    ids = [int(i) for b in ds.take(3 * n // batch) for i in b.numpy()]  # 300 ids: 3 epochs (drop the tail)
    assert len(ids) == 3 * n - (3 * n) % batch
    assert sorted(ids[:n]) == list(range(n)), "epoch 1"
    assert sorted(ids[n:2 * n]) == list(range(n)), "epoch 2"
    assert len(set(ids[2 * n:])) == len(ids[2 * n:]), "epoch 3 repeats an id"


def test_resnet_tfrecord_smoke_through_the_service_reaches_target(served_runs, fleet):
    summary, stdout = checked_run(served_runs, "resnet", fleet.dispatcher)
    assert list(summary["compliance"]) == ["4.0.0"], summary["compliance"]
    assert 0.0 <= summary["input_wait"]["share_of_train_time"] <= 1.0, summary["input_wait"]
    assert any("of step time waiting for data (data.source=tfrecord" in line for line in stdout), stdout


# ResNet's TFRecord smoke (above) goes to its target through the service. The other families' pipelines are
# shown to serve every example exactly once by the epoch tests below; here each runs a few steps and one
# eval through the workers to a log that passes every check but the quality target (their smokes reach
# it locally, tests/test_shipped_configs.py): the real targets through the service cost ~10 minutes of CPU.
SHORT = {
    "bert": ["data.train_samples=640", "data.eval_samples=64", "data.eval_every_samples=640",
             "schedule.max_epochs=1"],
    "transformer": ["data.synthetic_train_pairs=300", "data.eval_samples=24", "schedule.eval_batch_size=24",
                    "schedule.max_epochs=1"],
    "ssd": ["submission.division=open", "data.train_samples=64", "data.eval_samples=16",
            "schedule.eval_batch_size=16", "schedule.max_epochs=1", "schedule.eval_epochs=[1]"],
    "gpt_oss_20b": ["data.synthetic_train_rows=4", "data.eval_samples=2", "schedule.eval_batch_size=2",
                    "schedule.max_epochs=1", "data.eval_every_samples=4"],
}
TO_TARGET = ("resnet", "llama31_8b")


@pytest.fixture(scope="module")
def served_runs(fleet, imagenet_dir, tmp_path_factory) -> dict:
    """workload -> (its CompletedProcess, its output dir): ResNet's TFRecord smoke and llama31_8b's smoke to their
    targets and the SHORT runs, each `run` through the fleet, one after another in one process (one TensorFlow
    start for all: conftest.runs_in_one_process)."""
    plans = {"resnet": ("smoke-tfrecord.yaml", resnet_sets(imagenet_dir)), "llama31_8b": ("smoke.yaml", []),
             **{w: ("smoke.yaml", sets) for w, sets in SHORT.items()}}
    runs = [[os.path.join(REPO, "configs", w, config), "--set", f"data.service.dispatcher={fleet.dispatcher}",
             *[a for o in sets for a in ("--set", o)]] for w, (config, sets) in plans.items()]
    out = str(tmp_path_factory.mktemp("served"))
    procs = runs_in_one_process(1, runs, out)
    return {w: (p, os.path.join(out, str(n))) for n, (w, p) in enumerate(zip(plans, procs))}


def checked_run(served_runs: dict, workload: str, dispatcher: str) -> tuple[dict, list[str]]:
    """A served run's summary and stdout lines, checked: a TO_TARGET run must succeed with every compliance
    check passed; a short run may stop at its budget (exit 1), its log passing every check but the quality
    target, as an aborted run's must."""
    proc, out = served_runs[workload]
    to_target = workload in TO_TARGET
    assert proc.returncode in ((0,) if to_target else (0, 1)), (proc.stdout[-3000:], proc.stderr[-3000:])
    (summary_path,) = glob.glob(os.path.join(out, workload, "*", "summary.json"))
    with open(summary_path) as f:
        summary = json.load(f)
    assert summary["compliant"], summary
    if to_target or summary["status"] == "success":
        assert summary["status"] == "success", summary
        assert all(v["passed"] for v in summary["compliance"].values()), summary["compliance"]
    else:
        assert summary["status"] == "aborted" and "target" in summary["reason"], summary
        for ruleset, v in summary["compliance"].items():
            assert v["verdict"].startswith(("PASS", "FAIL (quality target")), (ruleset, v)
    stdout = proc.stdout.splitlines()
    assert any(f"via the tf.data service at {dispatcher}" in line for line in stdout), stdout[-20:]
    return summary, stdout


@pytest.mark.parametrize("workload", sorted(SHORT))
def test_short_run_through_the_service_logs_compliantly(served_runs, fleet, workload):
    summary, _ = checked_run(served_runs, workload, fleet.dispatcher)
    assert summary["evals"], summary


def test_llama31_8b_smoke_through_the_service_reaches_target(served_runs, fleet):
    """The decoder LMs' rows (benchmarks/lm/data.py, shared with gpt_oss_20b) through the workers, to target."""
    summary, _ = checked_run(served_runs, "llama31_8b", fleet.dispatcher)
    assert summary["evals"][-1]["metrics"]["log perplexity"] < 1.0, summary["evals"]


def served(fleet, workload, epochs: int = 2) -> list[list[dict]]:
    """`epochs` epochs of `workload`'s training examples through the fleet, one example a batch; the epoch
    check (exactly train_samples examples each) is distribute_epochs' own."""
    ctx = InputContext(num_hosts=1, host_id=0, batch_size=1, seed=workload.cfg.seed)
    epoch = workload.train_epoch_dataset(ctx).with_options(train_options(pipeline_config(workload.cfg.data)))
    n = workload.train_samples
    ds = distribute_epochs(epoch, n, 1, ServiceConfig(dispatcher=fleet.dispatcher))
    got = [tf.nest.map_structure(lambda t: t.numpy()[0], b) for b in ds.take(epochs * n)]
    return [got[i * n:(i + 1) * n] for i in range(epochs)]


def make_workload(name: str, overrides: list[str]):
    from tests.helpers.decoder_golden import build_workload

    return build_workload(os.path.join(REPO, "configs", name, "smoke.yaml"), overrides, build=False)


@pytest.mark.parametrize("name", ["resnet", "bert", "transformer", "ssd", "gpt_oss_20b", "llama31_8b"])
def test_served_epoch_pipelines_call_no_python(name):
    """What the service's workers run (`train_epoch_dataset`) has no Python callback, which a worker could not
    call (remote_input.check searches the endless pipeline, built by the same code)."""
    from harness.train import remote_input

    wl = make_workload(name, [])
    assert remote_input.python_ops(wl.train_epoch_dataset(InputContext(1, 0, 2, seed=1))) == []


def test_bert_tfrecord_epochs_through_the_service_hold_every_record_once(fleet, tmp_path):
    from benchmarks.bert import tfrecord_writer
    from benchmarks.bert.data import SyntheticSource

    wl = make_workload("bert", [f"data.data_dir={tmp_path}", "data.source=tfrecord", "data.train_samples=40",
                                "data.eval_samples=8", "data.shuffle_buffer=16"])
    arrays = SyntheticSource(wl.cfg.data, wl.cfg.model.vocab_size).generate(40, stream=3)
    tfrecord_writer.write(str(tmp_path / "part-00000-of-00002"), tfrecord_writer.rows(arrays, 0, 20))
    tfrecord_writer.write(str(tmp_path / "part-00001-of-00002"), tfrecord_writer.rows(arrays, 20, 40))
    tfrecord_writer.write(str(tmp_path / "eval_10k"), tfrecord_writer.rows(arrays, 0, 8))
    wl.validate()
    want = sorted(tuple(r) for r in arrays["input_ids"])
    for i, epoch in enumerate(served(fleet, wl)):
        assert sorted(tuple(ex["input_ids"]) for ex in epoch) == want, f"epoch {i + 1}"


def test_ssd_tfrecord_epochs_through_the_service_hold_each_image_with_boxes_once(fleet, tmp_path):
    from benchmarks.ssd.data import count_images_with_boxes
    from benchmarks.ssd.tfrecord_writer import write_synthetic

    paths = write_synthetic(str(tmp_path), train_images=48, val_images=8, image_size=64, seed=0, num_shards=3,
                            empty_fraction=0.1)
    n = count_images_with_boxes(paths["train"])
    assert n < 48  # some images have no boxes: the epoch drops them, as the local pipeline does
    wl = make_workload("ssd", ["submission.division=open", "data.source=tfrecord", f"data.data_dir={tmp_path}",
                               f"data.annotation_file={paths['val_json']}", f"data.train_samples={n}",
                               "data.eval_samples=8"])
    wl.validate()
    for epoch in served(fleet, wl):
        assert len(epoch) == n and all(ex["image"].shape == (64, 64, 3) for ex in epoch)
        assert all((ex["labels"] > 0).any() for ex in epoch)  # every image the epoch serves kept a box


@pytest.mark.parametrize("packed", [True, False])
def test_transformer_tfrecord_epochs_through_the_service_hold_the_counted_rows(fleet, tmp_path, packed):
    """Packed rows depend on the order of every pair before them: one epoch through the service holds
    exactly the rows the synthetic source packs from the same pairs in the files' order."""
    from benchmarks.transformer import tfrecord_writer
    from benchmarks.transformer.config import DataConfig
    from benchmarks.transformer.data import SyntheticSource

    fields = tfrecord_writer.write_synthetic(str(tmp_path), 300, 8, shards=3)
    overrides = [f"data.{k}={v}" for k, v in fields.items() if k != "train_samples"]
    wl = make_workload("transformer", overrides + ["submission.division=open", "model.vocab_size=0",
                                                   f"data.packing={str(packed).lower()}", "data.shuffle_buffer=64"])
    wl.validate()
    if packed:
        assert wl.train_samples == fields["train_samples"]
        rows = SyntheticSource(DataConfig(source="synthetic", max_sequence_length=32, row_length=64,
                                          eval_samples=8, synthetic_train_pairs=300)).rows
        want = sorted(tuple(r) for r in np.concatenate([rows["inputs"], rows["targets"]], axis=1))
    for epoch in served(fleet, wl):
        assert len(epoch) == wl.train_samples
        if packed:
            assert sorted(tuple(np.concatenate([ex["inputs"], ex["targets"]])) for ex in epoch) == want


def test_killed_worker_is_survived_or_ends_the_run_with_one_error(fleet, imagenet_dir, tmp_path):
    """Last in this file: it kills one of the shared fleet's workers."""
    out = str(tmp_path / "runs")
    # Two epochs (32 steps) and one eval: the kill comes at step 4, the rest shows whether the run survives.
    # What is tested is the run's answer to a lost worker, not the model: conftest's TINY_RESNET.
    run = Proc(*smoke_args(imagenet_dir, out, fleet.dispatcher, *TINY_RESNET, "schedule.log_every_steps=4",
                           "data.service.stall_timeout_s=10", "schedule.max_epochs=2",
                           "schedule.eval_every_epochs=2"))
    try:
        run.wait_line("| input wait", START_TIMEOUT_S)
        fleet.killed.append(fleet.workers[0])
        fleet.workers[0].p.send_signal(signal.SIGKILL)
        run.p.wait(timeout=300)  # bounded: a hang fails here
    finally:
        run.stop()
    time.sleep(0.2)
    (run_dir,) = glob.glob(os.path.join(out, "resnet", "*"))
    if run.p.returncode in (0, 1):  # survived (to the target or its short budget): the share was re-routed
        print("killed worker: survived")
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        assert summary["compliant"] and summary["evals"], summary
        assert run.p.returncode == 0 or "budget" in summary["reason"], summary
        return
    print(f"killed worker: run ended with {run.p.returncode}: {run.stderr[-1:]}")
    errors = stderr_error_lines(subprocess.CompletedProcess([], run.p.returncode, "", "\n".join(run.stderr)))
    assert run.p.returncode == 2 and len(errors) == 1, (run.p.returncode, run.stderr[-10:])
    assert "tf.data service" in errors[0], errors
    assert os.path.exists(os.path.join(run_dir, "incomplete_result_1.log")), os.listdir(run_dir)
    assert not glob.glob(os.path.join(run_dir, "result_*.txt")), os.listdir(run_dir)


@pytest.mark.parametrize("workload, dispatcher, message", [
    ("resnet", "grpc://127.0.0.1:{free}", "no dispatcher listening"),
    ("resnet", "http://127.0.0.1:5050", "expected grpc://HOST:PORT"),
    ("resnet-tfds", "grpc://127.0.0.1:{free}", "cannot send data.source=tfds"),
])
def test_service_refusals_come_before_the_log(workload, dispatcher, message):
    from harness.errors import HarnessError
    from harness.data import service as data_service

    workload, _, source = workload.partition("-")
    wl = make_workload(workload, [f"data.service.dispatcher={dispatcher.format(free=free_port())}"]
                       + ([f"data.source={source}"] if source else []))
    with pytest.raises(HarnessError, match=message.replace(".", r"\.")):
        data_service.validate(wl)


# ------------------------------------------------------------------------ fleet processes: bounded, one line

def one_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    errors = stderr_error_lines(proc)
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in errors[0], errors[0]
    return errors[0]


def test_worker_without_a_dispatcher_gives_up_with_one_line():
    port = free_port()
    proc = subprocess.run(harness_cmd("data-service", "worker", f"--dispatcher=127.0.0.1:{port}"), cwd=REPO,
                          env=dict(ENV, MLPERF_HARNESS_DISPATCHER_WAIT_S="1"), capture_output=True, text=True,
                          timeout=START_TIMEOUT_S)
    one_error(proc, f"no data-service dispatcher at 127.0.0.1:{port} after waiting 1 s", "Connection refused")


def test_dispatcher_port_out_of_range_or_taken_is_one_line():
    def dispatcher(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(harness_cmd("data-service", "dispatcher", *args), cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=START_TIMEOUT_S)

    one_error(dispatcher("--port", "-5"), "--port -5: a port is 1..65535")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        one_error(dispatcher(f"--port={port}"), f"--port {port}: the port is in use")


@pytest.mark.parametrize("args, message", [
    (["dispatcher", "--port=70000"], "--port 70000: a port is 1..65535"),
    (["worker", "--dispatcher=127.0.0.1:5050", "--port=70000"], "--port 70000: a port is 0..65535"),
    (["worker", "--dispatcher=127.0.0.1:5050", "--port=-1"], "--port -1: a port is 0..65535"),
])
def test_server_ports_are_checked_where_read(args, message):
    one_error(cli_in_process("data-service", *args), message)


def test_worker_port_taken_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        one_error(cli_in_process("data-service", "worker", "--dispatcher=127.0.0.1:5050", f"--port={port}"),
                  f"--port {port}: the port is in use")


def test_dispatcher_wait_comes_from_the_environment(monkeypatch):
    from harness.errors import HarnessError
    from harness.data import service as data_service

    monkeypatch.delenv(data_service.DISPATCHER_WAIT_ENV, raising=False)
    assert data_service.dispatcher_wait_s() == data_service.DISPATCHER_WAIT_S == 60.0
    monkeypatch.setenv(data_service.DISPATCHER_WAIT_ENV, "2.5")
    assert data_service.dispatcher_wait_s() == 2.5
    for bad in ("0", "-3", "soon", "inf"):
        monkeypatch.setenv(data_service.DISPATCHER_WAIT_ENV, bad)
        with pytest.raises(HarnessError, match=data_service.DISPATCHER_WAIT_ENV):
            data_service.dispatcher_wait_s()


def test_worker_waits_for_a_dispatcher_that_starts_later_and_refuses_a_stranger():
    from harness.errors import HarnessError
    from harness.data import service as data_service

    port = free_port()
    started: list = []

    def start_later() -> None:
        time.sleep(2)  # the worker's first connection attempts are refused
        started.append(tf.data.experimental.service.DispatchServer(
            tf.data.experimental.service.DispatcherConfig(port=port)))

    later = threading.Thread(target=start_later, daemon=True)
    later.start()
    data_service.wait_for_dispatcher("127.0.0.1", port, 120)
    later.join(60)
    assert started, "the dispatcher thread did not start one"
    started[0].stop()
    # Something listening that is not a gRPC server: refused at once, not retried.
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", free_port()))
        stranger.listen()
        with pytest.raises(HarnessError, match="is listening but is not a data-service dispatcher"):
            data_service.wait_for_dispatcher("127.0.0.1", stranger.getsockname()[1], 2)


def test_run_refuses_a_dispatcher_address_that_is_not_grpc():
    from harness.errors import HarnessError
    from harness.data import service as data_service

    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", free_port()))
        stranger.listen()
        cfg = ServiceConfig(dispatcher=f"grpc://127.0.0.1:{stranger.getsockname()[1]}")
        with pytest.raises(HarnessError, match="does not answer gRPC; it is not a data-service dispatcher"):
            data_service.check_reachable(cfg, timeout_s=1)
