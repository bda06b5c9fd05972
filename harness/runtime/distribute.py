"""tf.distribute runtimes: one device, mirrored (GPUs or logical CPUs), multi-worker, TPU."""
from __future__ import annotations

import json
import os
import re
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from absl import logging

from harness.errors import HarnessError
from harness.runtime.base import InputContext, Runtime


class StrategyRuntime(Runtime):
    """Data parallelism through a tf.distribute.Strategy; variables are mirrored on every replica."""

    def __init__(self, kind: str, strategy: tf.distribute.Strategy, device_type: str, precision: str,
                 jit_compile: bool | None) -> None:
        self.kind = kind
        self.strategy = strategy
        self._device_type = device_type
        self._broadcast_fn: Callable | None = None
        super().__init__(precision, jit_compile)

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def num_hosts(self) -> int:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver is not None:
            spec = resolver.cluster_spec().as_dict()
            return max(1, sum(len(spec.get(job, [])) for job in ("chief", "worker")))
        return 1

    @property
    def host_id(self) -> int:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver is not None:
            spec = resolver.cluster_spec().as_dict()
            offset = len(spec.get("chief", [])) if resolver.task_type == "worker" else 0
            return offset + int(resolver.task_id or 0)
        return 0

    def scope(self) -> Any:
        return self.strategy.scope()

    def _make_variable(self, path, shape, dims, initializer, trainable, dtype, sync) -> tf.Variable:
        aggregation = {"first": tf.VariableAggregation.ONLY_FIRST_REPLICA,
                       "mean": tf.VariableAggregation.MEAN}[sync]
        with self.strategy.scope():
            # A callable initial value lets the strategy create it on each device without a host copy.
            return tf.Variable(lambda: initializer(shape, dtype), trainable=trainable, name=path,
                               dtype=dtype, aggregation=aggregation)

    def distribute_dataset(self, dataset_fn: Callable[[InputContext], tf.data.Dataset],
                           global_batch: int, seed: int) -> Any:
        self.check_batch(global_batch)
        per_replica = global_batch // self.num_replicas

        def fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            return dataset_fn(InputContext(num_hosts=ctx.num_input_pipelines,
                                           host_id=ctx.input_pipeline_id,
                                           batch_size=per_replica, seed=seed))

        options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
        return self.strategy.distribute_datasets_from_function(fn, options)

    def run(self, fn: Callable, args: tuple) -> Any:
        return self.strategy.run(fn, args=args)

    def sum(self, per_replica: Any) -> Any:
        return tf.nest.map_structure(
            lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), per_replica)

    def mean(self, per_replica: Any) -> Any:
        return tf.nest.map_structure(
            lambda t: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, t, axis=None), per_replica)

    def all_reduce_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        if self.num_replicas == 1:
            return grads
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)

    def replica_id(self) -> tf.Tensor:
        return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int32)

    def gather(self, per_replica: Any) -> Any:
        return tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), per_replica)

    def broadcast_from_chief(self, value: np.ndarray) -> np.ndarray:
        # Every replica contributes zeros except the chief's first (global replica 0): a sum over all
        # replicas is then the chief's value, on every host.
        value = np.asarray(value)
        if self.num_hosts == 1:
            return value
        if self._broadcast_fn is None:
            def replica_fn(x: tf.Tensor) -> tf.Tensor:
                first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
                return x * tf.cast(first, x.dtype)

            self._broadcast_fn = tf.function(lambda x: self.strategy.reduce(
                tf.distribute.ReduceOp.SUM, self.strategy.run(replica_fn, (x,)), axis=None))
        mine = value if self.is_chief else np.zeros_like(value)
        return self._broadcast_fn(tf.constant(mine, tf.float64)).numpy()

    def replica_all_sum(self, tensors: Any, group_size: int) -> Any:
        if group_size == 1:
            return tensors
        if group_size == self.num_replicas:
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tensors)
        raise HarnessError(f"batch-norm span over {group_size} of {self.num_replicas} replicas is not "
                           f"supported by the {self.kind} runtime: use a span of one replica's batch or "
                           f"of the global batch")

    def shutdown(self) -> None:
        if isinstance(self.strategy, tf.distribute.experimental.TPUStrategy):
            try:
                tf.tpu.experimental.shutdown_tpu_system()
            except Exception as e:  # noqa: BLE001 - shutdown is best effort
                logging.warning("TPU shutdown failed: %s", e)


def configure_logical_cpus(n: int) -> None:
    """Splits the host CPU into `n` logical devices; must run before TensorFlow touches a device."""
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current and len(current) == n:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    except RuntimeError as e:
        raise HarnessError(f"runtime.cpu_devices={n}: TensorFlow devices were already initialized in "
                           f"this process ({e}); run in a fresh process") from None


def make_default(precision: str, jit: str) -> StrategyRuntime:
    gpus = tf.config.list_physical_devices("GPU")
    return StrategyRuntime("default", tf.distribute.get_strategy(), "GPU" if gpus else "CPU", precision, jit)


def make_mirrored(cpu_devices: int, gpus: int, precision: str, jit: str) -> StrategyRuntime:
    physical_gpus = tf.config.list_physical_devices("GPU")
    if cpu_devices > 0 or not physical_gpus:
        n = max(cpu_devices, 1)
        configure_logical_cpus(n)
        devices = [f"/cpu:{i}" for i in range(n)]
        device_type = "CPU"
    else:
        n = len(physical_gpus) if gpus < 0 else gpus
        if n > len(physical_gpus):
            raise HarnessError(f"runtime.gpus={n} but only {len(physical_gpus)} GPU(s) are visible")
        devices = [f"/gpu:{i}" for i in range(n)]
        device_type = "GPU"
    cross = tf.distribute.ReductionToOneDevice() if device_type == "CPU" else None
    strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross)
    return StrategyRuntime("mirrored", strategy, device_type, precision, jit)


def make_multi_worker(precision: str, jit: str, collective_timeout_s: float = 600.0) -> StrategyRuntime:
    """MultiWorkerMirroredStrategy over TF_CONFIG's cluster.

    A peer that dies is noticed by the coordination service's heartbeats; one that stops answering while
    its process lives (hung, stopped, cut off) would leave the others waiting in a collective forever, so
    every collective gets `collective_timeout_s` (TensorFlow raises DeadlineExceededError; it costs a
    thread per collective, microseconds against a training step).
    """
    _cluster_from_env()
    gpus = tf.config.list_physical_devices("GPU")
    impl = (tf.distribute.experimental.CommunicationImplementation.NCCL if gpus
            else tf.distribute.experimental.CommunicationImplementation.RING)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=impl, timeout_seconds=collective_timeout_s or None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return StrategyRuntime("multi_worker", strategy, "GPU" if gpus else "CPU", precision, jit)


def _cluster_from_env() -> tuple[dict[str, list[str]], tuple[str, int]]:
    """TF_CONFIG's cluster (job -> addresses) and this task (job, index)."""
    raw = os.environ.get("TF_CONFIG", "")
    if not raw:
        raise HarnessError("runtime.kind=multi_worker needs the TF_CONFIG environment variable "
                           "(cluster and task, see README)")
    try:
        tf_config = json.loads(raw)
        cluster = {job: list(addresses) for job, addresses in tf_config["cluster"].items()}
        me = (tf_config["task"]["type"], int(tf_config["task"].get("index", 0)))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise HarnessError(f"TF_CONFIG is not valid cluster JSON: {e}") from None
    return cluster, me


# What a collective raises when a peer died, stopped answering or cannot be reached.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
                tf.errors.AbortedError)
_TASK_NAME = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")


def lost_peer_error(error: BaseException, collective_timeout_s: float) -> HarnessError | None:
    """A multi-worker failure caused by a lost peer, as one line naming it (from TF_CONFIG); None otherwise.

    TensorFlow reports it as a long gRPC error whose text names tasks as /job:worker/replica:0/task:1;
    the peer is the task named there other than this one, or the only other task of the cluster.
    """
    if not isinstance(error, tf.errors.OpError):
        return None
    text = error.message or str(error)
    if not isinstance(error, _PEER_ERRORS) and not (
            isinstance(error, tf.errors.InternalError)
            and re.search(r"collective|coordination|heartbeat", text, re.IGNORECASE)):
        return None
    try:
        cluster, me = _cluster_from_env()
    except HarnessError:
        return None
    tasks = [(job, i) for job, addresses in cluster.items() for i in range(len(addresses))]
    named = sorted({(job, int(i)) for job, i in _TASK_NAME.findall(text)} & set(tasks) - {me})
    others = [t for t in tasks if t != me]
    peers = named or (others if len(others) == 1 else [])

    def name(task: tuple[str, int]) -> str:
        return f"{task[0]} {task[1]} ({cluster[task[0]][task[1]]})"

    who = ", ".join(name(t) for t in peers) if peers else f"a peer (one of {', '.join(name(t) for t in others)})"
    if isinstance(error, tf.errors.DeadlineExceededError):
        why = f"no answer within runtime.collective_timeout_s={collective_timeout_s:g}s"
    elif "heartbeat" in text:
        why = "it stopped sending heartbeats (crashed, stopped or cut off)"
    elif re.search(r"coordination service|connect|socket closed|connection reset", text, re.IGNORECASE):
        why = "it cannot be reached (crashed or cut off)"
    else:
        why = f"{type(error).__name__} in a collective"
    return HarnessError(f"lost contact with {who}: {why}; this run is incomplete")


def make_tpu(address: str, timeout_s: float, precision: str, jit: str) -> StrategyRuntime:
    """Connects to a TPU, giving up after `timeout_s`: an unreachable address otherwise hangs forever."""
    result: dict[str, Any] = {}

    def connect() -> None:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address or None)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            result["strategy"] = tf.distribute.TPUStrategy(resolver)
        except Exception as e:  # noqa: BLE001 - any failure to reach the TPU is the user's to fix
            result["error"] = e

    thread = threading.Thread(target=connect, daemon=True, name="tpu-connect")
    thread.start()
    thread.join(timeout_s)
    where = address or "(local / TPU_NAME)"
    if thread.is_alive():
        raise HarnessError(f"could not reach TPU {where} within runtime.tpu_timeout_s={timeout_s:g}s")
    if "error" in result:
        first = str(result["error"]).strip().splitlines()[0] if str(result["error"]).strip() else ""
        raise HarnessError(f"could not connect to TPU {where}: {type(result['error']).__name__}: {first}")
    return StrategyRuntime("tpu", result["strategy"], "TPU", precision, jit)
