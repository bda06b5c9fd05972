"""Training preprocessing on a fleet of tf.data service workers (`data.service.dispatcher`).

The fleet: one dispatcher and any number of workers, each a foreground process
(`mlperf-harness data-service dispatcher --port P`, `... worker --dispatcher HOST:P`). A training host sends
one epoch of its preprocessing pipeline per service job (`distributed_epoch`: the workers split the
epoch's files between them, so each example is processed once), checks that the epoch delivered exactly
its number of examples, and repeats with a new job. Batches are re-formed on the host, so epochs join
without dropping a remainder. Eval never uses the service: it stays local and exact.

A worker that dies mid-epoch loses the files it held; the epoch then comes up short and the run ends with
one `error:` line (never a silent short epoch, never a hang). A dispatcher that is not listening is
refused before the log is created. A worker started before its dispatcher waits for it at most
DISPATCHER_WAIT_S, then ends with one line; a server port out of range or taken is one line.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any

import tensorflow as tf

from harness.errors import HarnessError
from harness.runtime.base import InputContext
from harness.train.input_pipeline import InputWait, ServiceConfig, pipeline_config

SHORT_EPOCH = "tf.data service epoch came up short"
WORKER_TIMEOUT_MS = 5000  # the dispatcher drops a worker silent this long, and its tasks with it


def address(dispatcher: str) -> tuple[str, int]:
    """HOST, PORT of `grpc://HOST:PORT` (or `HOST:PORT`), with one clear error for anything else."""
    url = urllib.parse.urlsplit(dispatcher if "://" in dispatcher else f"grpc://{dispatcher}")
    if url.scheme != "grpc" or not url.hostname or not url.port:
        raise HarnessError(f"data.service.dispatcher={dispatcher!r}: expected grpc://HOST:PORT")
    return url.hostname, url.port


def check_reachable(cfg: ServiceConfig, timeout_s: float = 10.0) -> None:
    """Refuses a dispatcher that is not listening, or is not a gRPC server (the tf.data client would retry
    it forever)."""
    host, port = address(cfg.dispatcher)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            grpc = _speaks_http2(conn)
    except OSError as e:
        raise HarnessError(f"data.service.dispatcher {cfg.dispatcher}: no dispatcher listening ({e}); start "
                           f"one with `mlperf-harness data-service dispatcher --port {port}`") from None
    if not grpc:
        raise HarnessError(f"data.service.dispatcher {cfg.dispatcher}: something listens there but does not "
                           f"answer gRPC; it is not a data-service dispatcher")


def validate(workload: Any) -> None:
    """Before the log exists: a configured dispatcher must be listening and the workload's source must
    give one epoch for it."""
    cfg = pipeline_config(workload.cfg.data).service
    if not cfg.dispatcher:
        return
    address(cfg.dispatcher)
    workload.train_epoch_dataset(InputContext(num_hosts=1, host_id=0, batch_size=1, seed=workload.cfg.seed))
    check_reachable(cfg)


def distribute_epochs(epoch: tf.data.Dataset, epoch_examples: int, batch_size: int, cfg: ServiceConfig,
                      job_name: str | None = None) -> tf.data.Dataset:
    """Endless batches of `epoch` (one finite, unbatched epoch of this host's examples), preprocessed by
    the service's workers one epoch per job; an epoch that does not deliver `epoch_examples` fails."""
    host, port = address(cfg.dispatcher)
    served = epoch.batch(batch_size).apply(tf.data.experimental.service.distribute(
        processing_mode=cfg.processing_mode, service=f"grpc://{host}:{port}", job_name=job_name))
    served = served.unbatch().apply(tf.data.experimental.assert_cardinality(epoch_examples))
    return served.repeat().batch(batch_size, drop_remainder=True)


def failure(error: BaseException) -> HarnessError | None:
    """The one-line error for a run whose service epoch came up short (a worker lost), else None."""
    text = str(error)
    if isinstance(error, tf.errors.OpError) and "was expected to contain" in text:
        detail = text.strip().splitlines()[0][:200]
        return HarnessError(f"{SHORT_EPOCH} ({detail}): a data-service worker was probably lost with the "
                            f"files it held; restart the worker and the run")
    return None


class StallGuard:
    """Ends a run whose training input from the service stalls, instead of letting it hang.

    A worker lost mid-epoch takes its files with it and the tf.data client waits for them forever, blocked
    inside a TensorFlow op no Python exception can reach. This thread watches the input meter; when a
    batch has been awaited `cfg.stall_timeout_s`, it prints one `error:` line and exits with code 2; the
    MLPerf log stays `incomplete_result_<seed>.log`, the name it has until the loop ends.
    """

    def __init__(self, wait: InputWait, cfg: ServiceConfig) -> None:
        self.wait, self.cfg = wait, cfg
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="data-service-stall-guard", daemon=True)

    def __enter__(self) -> "StallGuard":
        if self.cfg.dispatcher:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.cfg.stall_timeout_s / 4)):
            stalled = self.wait.pending_s()
            if stalled >= self.cfg.stall_timeout_s and not self._stop.is_set():
                self._fail(stalled)

    def _fail(self, stalled: float) -> None:
        print(f"error: no training batch from the tf.data service at {self.cfg.dispatcher} for {stalled:.0f} s "
              f"(data.service.stall_timeout_s): a worker was lost with the files it held, or none is "
              f"running; restart the workers and the run", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)


# ------------------------------------------------------------------------------ fleet processes

DISPATCHER_WAIT_ENV = "MLPERF_HARNESS_DISPATCHER_WAIT_S"
DISPATCHER_WAIT_S = 60.0  # how long a worker waits for its dispatcher (docs/accelerators.md states it)


def dispatcher_wait_s() -> float:
    """How long a starting worker waits for its dispatcher: DISPATCHER_WAIT_S, or the seconds in the
    MLPERF_HARNESS_DISPATCHER_WAIT_S environment variable."""
    raw = os.environ.get(DISPATCHER_WAIT_ENV, "").strip()
    if not raw:
        return DISPATCHER_WAIT_S
    try:
        wait = float(raw)
    except ValueError:
        wait = -1.0
    if not 0 < wait < float("inf"):
        raise HarnessError(f"{DISPATCHER_WAIT_ENV}={raw!r}: expected a number of seconds above 0")
    return wait


def check_port(port: int, flag: str, allow_any: bool = False) -> None:
    """A port this process can listen on: in range (`allow_any`: 0 picks a free one) and not taken. The
    server itself would print a gRPC log line and raise a bare RuntimeError for a taken port."""
    low = 0 if allow_any else 1
    if not low <= port <= 65535:
        raise HarnessError(f"{flag} {port}: a port is {low}..65535" + (" (0 = any free port)" if allow_any else ""))
    if port == 0:
        return
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR: a port left in TIME_WAIT by a stopped server is free; one another socket holds is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", port))
    except OSError as e:
        raise HarnessError(f"{flag} {port}: the port is in use or not allowed ({e.strerror or e}); "
                           f"pick another") from None
    finally:
        probe.close()


def wait_for_dispatcher(host: str, port: int, wait_s: float) -> None:
    """Returns once a gRPC server listens at HOST:PORT, retrying for `wait_s` (a worker may start before its
    dispatcher); else one error naming the address and the time waited, or at once when what listens there
    does not answer gRPC. The tf.data worker would retry its registration forever, printing nothing."""
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, left))) as conn:
                if _speaks_http2(conn):
                    return
            raise HarnessError(f"{host}:{port} is listening but is not a data-service dispatcher (it does not "
                               f"answer gRPC); fix --dispatcher")
        except OSError as e:
            reason = e.strerror or str(e) or type(e).__name__
        if time.monotonic() + 1.0 > deadline:
            raise HarnessError(f"no data-service dispatcher at {host}:{port} after waiting {wait_s:g} s "
                               f"({reason}); start it with `mlperf-harness data-service dispatcher --port {port}` "
                               f"or fix --dispatcher")
        time.sleep(1.0)


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS


def _speaks_http2(conn: socket.socket) -> bool:
    """Whether the server on `conn` answers an HTTP/2 client preface with a SETTINGS frame, as every gRPC
    server does. The tf.data worker registering with something else would retry forever, holding the
    interpreter's lock, so no timer in this process could end it."""
    try:
        conn.sendall(_HTTP2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
    except OSError:
        return False
    return head[3] == 4  # frame type SETTINGS


def serve_dispatcher(port: int) -> None:
    """Runs a dispatcher on `port` in the foreground; prints one line when it is listening."""
    check_port(port, "--port")
    try:
        server = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(
            port=port, worker_timeout_ms=WORKER_TIMEOUT_MS))
    except RuntimeError as e:  # the port taken between the check and the bind
        raise HarnessError(f"--port {port}: the dispatcher could not listen ({e})") from None
    print(f"data-service dispatcher ready: grpc://{socket.gethostname()}:{port} (port {port})", flush=True)
    _wait(server)


def serve_worker(dispatcher: str, port: int = 0, advertise: str = "", wait_s: float | None = None) -> None:
    """Runs a worker for `dispatcher` (HOST:PORT) in the foreground; prints one line when registered.

    `advertise` is the host name clients use to reach this worker: localhost for a dispatcher on this
    machine, else this machine's name. The dispatcher must be listening, and answer as a gRPC server,
    within `wait_s` (default `dispatcher_wait_s()`); a gRPC server that is not one refuses the registration.
    """
    host, dport = address(dispatcher)
    check_port(port, "--port", allow_any=True)
    wait_s = dispatcher_wait_s() if wait_s is None else wait_s
    wait_for_dispatcher(host, dport, wait_s)
    if not advertise:
        advertise = "localhost" if host in ("localhost", "127.0.0.1", "::1") else socket.getfqdn()
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=f"{host}:{dport}", worker_address=f"{advertise}:%port%", port=port,
        heartbeat_interval_ms=1000)
    try:
        server = tf.data.experimental.service.WorkerServer(config)
    except (tf.errors.OpError, RuntimeError, NotImplementedError) as e:  # e.g. a gRPC server, not a dispatcher
        detail = (getattr(e, "message", "") or str(e)).strip().splitlines()
        raise HarnessError(f"data-service worker could not register with {host}:{dport}: "
                           f"{detail[0].rstrip(': ') if detail else type(e).__name__}") from None
    print(f"data-service worker ready: {advertise}:{server._address.split(':')[-1]} -> dispatcher "
          f"{host}:{dport}", flush=True)
    _wait(server)


def _wait(server: object, poll_s: float = 0.5) -> None:
    """Serves until the process is stopped (Ctrl-C ends it quietly: stopping is how a server is used). The
    server runs on its own threads; the main thread sleeps in Python rather than in the server's `join()`,
    which blocks in C++ where a Ctrl-C is never delivered (it kept serving)."""
    del server  # kept alive by the caller's frame; stopped with the process
    try:
        while True:
            time.sleep(poll_s)
    except KeyboardInterrupt:
        # Out at once: a worker's destructor waits for the tasks of its jobs, and a job whose client is gone
        # (a run that died) kept one from exiting for over a minute. A server has nothing left to flush.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
