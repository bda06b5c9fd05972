"""tf.distribute runtimes: one device, mirrored (GPUs or logical CPUs), multi-worker, TPU.

multi_worker reads its cluster from TF_CONFIG, or from the variables SLURM's `srun` sets when TF_CONFIG is
absent; its collectives run under one watchdog deadline (watchdog.py). tpu connects with a timeout, since an
unreachable address otherwise hangs. Every wrong-hardware case (GPUs asked for and absent, `gpus: 0`, a CPU
multi-worker without `cpu_devices=1`, a local TPU smaller than the platform) is refused in one line, never
run on other devices than the config says.
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from absl import logging

from harness import platforms
from harness.errors import HarnessError
from harness.runtime.base import SPATIAL_COMPUTATION_SHAPES, InputContext, Runtime
from harness.runtime.watchdog import CollectiveWatchdog


class StrategyRuntime(Runtime):
    """Data parallelism through a tf.distribute.Strategy; variables are mirrored on every replica."""

    def __init__(self, kind: str, strategy: tf.distribute.Strategy, device_type: str, precision: str,
                 jit_compile: bool | None, spatial_dims: tuple[int, ...] = (),
                 watchdog: CollectiveWatchdog | None = None) -> None:
        self.kind = kind
        self.strategy = strategy
        self.spatial_dims = tuple(spatial_dims)
        self._device_type = device_type
        self._broadcast_fn: Callable | None = None
        self.watchdog = watchdog
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
        if self._on_tpu:
            # One client drives a whole slice; its hosts come from the TPU system's metadata (or the
            # device assignment), so the summary and system description count a pod's hosts.
            try:
                return max(1, int(self.strategy.extended.num_hosts))
            except Exception:  # noqa: BLE001 - a description; never fail a run over it
                return 1
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
        # "first": every replica applies the same all-reduced update to its own copy (NONE). With
        # ONLY_FIRST_REPLICA each replica-context assign is a merge_call, which raises inside an XLA step
        # on GPUs and becomes a broadcast of every variable per step (an all_to_all on TPU).
        # "mean" values are averaged explicitly by assign_mean (all of a step's in one all-reduce), then
        # assigned locally: NONE as well.
        aggregation = {"first": tf.VariableAggregation.NONE, "mean": tf.VariableAggregation.NONE}[sync]
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

    def _apply_means(self, pending: list[tuple[tf.Variable, tf.Tensor]]) -> None:
        values = [tf.cast(value, variable.dtype) for variable, value in pending]
        if self.num_replicas > 1:
            values = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, values)
        for (variable, _), value in zip(pending, values):
            variable.assign(value)

    def replica_id(self) -> tf.Tensor:
        return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int32)

    def gather(self, per_replica: Any) -> Any:
        return tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), per_replica)

    def broadcast_from_chief(self, value: np.ndarray) -> np.ndarray:
        # Every replica contributes zeros except the chief's first (global replica 0): a sum over all
        # replicas is then the chief's value, on every host.
        value = np.asarray(value)
        if self.num_hosts == 1 or self._on_tpu:  # TPUStrategy: one client process for every host
            return value
        if self._broadcast_fn is None:
            def replica_fn(x: tf.Tensor) -> tf.Tensor:
                first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
                return x * tf.cast(first, x.dtype)

            self._broadcast_fn = self.function(lambda x: self.strategy.reduce(
                tf.distribute.ReduceOp.SUM, self.strategy.run(replica_fn, (x,)), axis=None))
        mine = value if self.is_chief else np.zeros_like(value)
        return self._broadcast_fn(tf.constant(mine, tf.float64)).numpy()

    def function(self, fn: Callable) -> Callable:
        if self.watchdog is None:
            return super().function(fn)
        watchdog = self.watchdog

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            watchdog.compiling()  # runs only while tracing: this call compiles, no deadline for it
            return fn(*args, **kwargs)

        return watchdog.wrap(super().function(traced))

    def replica_function(self, fn: Callable) -> Callable:
        # TPUStrategy.run already compiles the replica function with XLA.
        return fn if self._on_tpu else super().replica_function(fn)

    @property
    def _on_tpu(self) -> bool:
        return isinstance(self.strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy))

    def replica_all_sum(self, tensors: Any, group_size: int) -> Any:
        n, k = self.num_replicas, group_size
        if k == 1:
            return tensors
        if k < 1 or n % k:
            raise HarnessError(f"cannot sum over groups of {k} replicas: {k} does not divide the {n} replicas")
        ctx = tf.distribute.get_replica_context()
        if k == n:
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tensors)
        if self._on_tpu:
            # Written by construction, never run (no TPU here): XLA's grouped all-reduce, whose registered
            # gradient is the same grouped sum of the incoming gradients.
            groups = [list(range(g * k, (g + 1) * k)) for g in range(n // k)]
            return tf.nest.map_structure(
                lambda t: tf.compat.v1.tpu.cross_replica_sum(t, group_assignment=groups), tensors)
        # Mirrored / multi-worker: every replica writes its values (one flat row per dtype) into its own slot
        # of a zero [n, row length] tensor, one all_reduce sums the slots (which fills them all), and each
        # replica keeps its group's rows. ReplicaContext.all_gather would be the obvious tool, but it always
        # goes through merge_call, which raises inside a per-replica XLA function on GPUs; all_reduce has a
        # path without it. Its gradient is an all-reduce of the incoming gradients, so each input gets the
        # sum of its group's output gradients. n times the bytes of the rows: batch-norm statistics, small.
        flat = tf.nest.flatten(tensors)
        me = self.replica_id()
        slot = tf.one_hot(me, n)  # [n]
        in_group = tf.equal(tf.range(n) // k, me // k)
        summed: list[tf.Tensor | None] = [None] * len(flat)
        for dtype in dict.fromkeys(t.dtype for t in flat):  # first-seen order: the same on every host
            which = [i for i, t in enumerate(flat) if t.dtype == dtype]
            row = tf.concat([tf.reshape(flat[i], [-1]) for i in which], axis=0)
            rows = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(slot, dtype)[:, None] * row[None])
            # Others' rows are zeroed, so every group member adds the same numbers in the same order.
            total = tf.reduce_sum(rows * tf.cast(in_group, dtype)[:, None], axis=0)
            parts = tf.split(total, [tf.size(flat[i]) for i in which])
            for i, part in zip(which, parts):
                summed[i] = tf.reshape(part, tf.shape(flat[i]))
        return tf.nest.pack_sequence_as(tensors, summed)

    def split_spatially(self, t: tf.Tensor) -> tf.Tensor:
        ways = self.spatial_partition_ways
        if ways == 1:
            return t
        if t.shape.rank is None or t.shape.rank < 2:
            raise ValueError(f"split_spatially needs a [batch, height, ...] tensor, got shape {t.shape}")
        # Never run (no TPU here): the height axis goes to the replica's `ways` logical devices.
        return self.strategy.experimental_split_to_logical_devices(t, [1, ways] + [1] * (t.shape.rank - 2))

    def shutdown(self) -> None:
        if self._on_tpu:
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
    warn_bfloat16_without_math(precision, gpus[:1])
    return StrategyRuntime("default", tf.distribute.get_strategy(), "GPU" if gpus else "CPU", precision, jit)


def bfloat16_warning(precision: str, gpus: list) -> str | None:
    """The warning for bfloat16 on GPUs without bfloat16 math (compute capability < 8.0: V100, T4, ...),
    where XLA computes in float32 instead: the run works, slowly. None when it does not apply."""
    if precision != "bfloat16" or not gpus:
        return None
    old = []
    for gpu in gpus:
        try:
            capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        except Exception:  # noqa: BLE001 - a warning; an unreadable device says nothing
            capability = None
        if capability and tuple(capability) < (8, 0):
            old.append((gpu.name, tuple(capability)))
    if not old:
        return None
    name, (major, minor) = old[0]
    return (f"runtime.precision=bfloat16 on {len(old)} GPU(s) without bfloat16 math ({name}: compute "
            f"capability {major}.{minor} < 8.0): computed in float32, slower than precision=float16 there")


def warn_bfloat16_without_math(precision: str, gpus: list) -> None:
    message = bfloat16_warning(precision, gpus)
    if message:
        logging.warning(message)


def refuse_cpu_replica_jit(kind: str, replicas: int, jit: bool | None) -> None:
    """XLA over several CPU replicas is refused: off GPUs, MirroredStrategy makes one XLA cluster of all
    replicas (not one per replica), which cannot read the other devices' variables, and XLA on CPU
    compiles no ring collectives. The per-replica XLA step is checked on one device and, for GPUs, by
    tracing it as a GPU would (tests/test_xla.py)."""
    if jit and replicas > 1:
        raise HarnessError(f"runtime.jit_compile=true with runtime.kind={kind} over {replicas} CPU replicas: "
                           f"TensorFlow compiles per replica only on GPUs/TPUs (on CPUs it builds one XLA "
                           f"cluster across devices, which fails); use one device or jit_compile=false")


def make_mirrored(cpu_devices: int, gpus: int, precision: str, jit: str) -> StrategyRuntime:
    physical_gpus = tf.config.list_physical_devices("GPU")
    if cpu_devices == 0 and not physical_gpus:
        asked = f"runtime.gpus={gpus}" if gpus > 0 else "runtime.kind=mirrored"
        raise HarnessError(f"{asked} but TensorFlow sees no GPU (no GPU here, the CPU-only TensorFlow "
                           f"wheel, or a broken CUDA install); refusing to run on the CPU instead. "
                           f"For a CPU test set runtime.cpu_devices=N")
    if cpu_devices > 0:
        n = cpu_devices
        refuse_cpu_replica_jit("mirrored", n, jit)
        configure_logical_cpus(n)
        devices = [f"/cpu:{i}" for i in range(n)]
        device_type = "CPU"
    else:
        n = len(physical_gpus) if gpus < 0 else gpus
        if n < 1:  # TensorFlow reads an empty device list as every device (config.py refuses gpus=0)
            raise HarnessError(f"runtime.gpus={gpus}: at least one GPU is needed")
        if n > len(physical_gpus):
            raise HarnessError(f"runtime.gpus={n} but only {len(physical_gpus)} GPU(s) are visible")
        warn_bfloat16_without_math(precision, physical_gpus[:n])
        devices = [f"/gpu:{i}" for i in range(n)]
        device_type = "GPU"
    cross = tf.distribute.ReductionToOneDevice() if device_type == "CPU" else None
    strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross)
    return StrategyRuntime("mirrored", strategy, device_type, precision, jit)


def make_multi_worker(precision: str, jit: str, collective_timeout_s: float = 600.0,
                      cpu_devices: int = 0, slurm_port_base: int = 8888) -> StrategyRuntime:
    """MultiWorkerMirroredStrategy over TF_CONFIG's cluster, or, without TF_CONFIG, the cluster of the
    SLURM job step this process is a task of (see slurm_cluster).

    Each worker computes on its GPUs; one that sees none is refused (a broken CUDA install would otherwise
    train on CPU, or mix NCCL and ring hosts), unless `cpu_devices` is 1: each worker on its CPU (tests),
    as `cpu_devices` puts the mirrored runtime on the CPU.

    A peer that dies is noticed by the coordination service's heartbeats; one that stops answering while
    its process lives (hung, stopped, cut off) would leave the others waiting in a collective forever, so
    every compiled call (a chunk of steps, an eval batch, a broadcast) gets `collective_timeout_s` from a
    host-side watchdog (watchdog.py), which then aborts the collectives (DeadlineExceededError).
    TensorFlow's own per-collective timeout is not used: it keeps a thread alive per collective.
    """
    global _slurm
    slurm = not os.environ.get("TF_CONFIG") and in_slurm_step()
    if slurm:
        _slurm = slurm_cluster(slurm_port_base)
    _cluster_from_env()
    if cpu_devices > 1:
        raise HarnessError(f"runtime.cpu_devices={cpu_devices} with runtime.kind=multi_worker: a worker runs "
                           f"on one CPU device; set runtime.cpu_devices=1 (or 0 for GPUs)")
    gpus = tf.config.list_physical_devices("GPU")
    if cpu_devices == 1 and gpus:
        tf.config.set_visible_devices([], "GPU")  # the CPU was asked for: keep TensorFlow off the GPUs
        gpus = []
    elif not gpus and cpu_devices == 0:
        raise HarnessError("runtime.kind=multi_worker but TensorFlow sees no GPU on this worker (no GPU here, "
                           "the CPU-only TensorFlow wheel, or a broken CUDA install); refusing to run on the "
                           "CPU instead. For a CPU test set runtime.cpu_devices=1")
    warn_bfloat16_without_math(precision, gpus)
    impl = (tf.distribute.experimental.CommunicationImplementation.NCCL if gpus
            else tf.distribute.experimental.CommunicationImplementation.RING)
    options = tf.distribute.experimental.CommunicationOptions(implementation=impl)
    resolver = None
    if slurm:
        cluster, (job, index) = _cluster_from_env()
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type=job, task_id=index, rpc_layer="grpc",
            num_accelerators={"GPU": len(gpus)} if gpus else {})
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
    if not gpus:
        refuse_cpu_replica_jit("multi_worker", strategy.num_replicas_in_sync, jit)
    watchdog = CollectiveWatchdog(collective_timeout_s) if collective_timeout_s else None
    return StrategyRuntime("multi_worker", strategy, "GPU" if gpus else "CPU", precision, jit, watchdog=watchdog)


# The SLURM job step's cluster once make_multi_worker has read it (the error translation needs it too).
_slurm: tuple[dict[str, list[str]], tuple[str, int]] | None = None


def in_slurm_step() -> bool:
    """Whether this process is a task of a SLURM job step (srun sets SLURM_PROCID)."""
    return "SLURM_PROCID" in os.environ


def slurm_cluster(port_base: int) -> tuple[dict[str, list[str]], tuple[str, int]]:
    """The cluster (one "worker" per SLURM task) and this task, from the variables srun sets.

    Tasks are listed node by node in SLURM's node order, the k-th task of a node at port_base + k, so
    task SLURM_PROCID is the one srun's default block distribution started there. TensorFlow's
    SlurmClusterResolver is not used as such: it sorts host names as strings (node10 before node9, so
    ranks land on another node's address beyond 9 nodes) and needs GPUs per task. Its parsers of SLURM's
    compressed lists ("node[01-04]", "2(x3),1") are.
    """
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as slurm

    def var(*names: str) -> str:
        for name in names:
            if os.environ.get(name):
                return os.environ[name]
        raise HarnessError(f"runtime.kind=multi_worker under SLURM: {names[0]} is not set (start the harness "
                           f"with srun, one task per host; see docs/accelerators.md)")

    nodes_text = var("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    counts_text = var("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    try:
        nodes = slurm.expand_hostlist(nodes_text)
        counts = slurm.expand_tasks_per_node(counts_text)
        tasks, rank = int(var("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")), int(var("SLURM_PROCID"))
    except ValueError as e:
        raise HarnessError(f"runtime.kind=multi_worker under SLURM: cannot read the job step ({e})") from None
    addresses = [f"{node}:{port_base + k}" for node, count in zip(nodes, counts) for k in range(count)]
    if len(nodes) != len(counts) or len(addresses) != tasks or not 0 <= rank < tasks:
        raise HarnessError(f"runtime.kind=multi_worker under SLURM: nodes {nodes_text!r} with tasks per node "
                           f"{counts_text!r} do not give {tasks} tasks with this one (SLURM_PROCID={rank}) "
                           f"among them")
    return {"worker": addresses}, ("worker", rank)


def _cluster_from_env() -> tuple[dict[str, list[str]], tuple[str, int]]:
    """TF_CONFIG's cluster (job -> addresses) and this task (job, index); without TF_CONFIG, the SLURM job
    step's once make_multi_worker has read it."""
    raw = os.environ.get("TF_CONFIG", "")
    if not raw and _slurm is not None:
        return _slurm
    if not raw:
        raise HarnessError("runtime.kind=multi_worker needs the TF_CONFIG environment variable "
                           "(cluster and task, see docs/accelerators.md), or to be started by srun as a task of "
                           "a SLURM job step")
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
    the peer is the task named there other than this one, or the only other task of the cluster. A
    deadline (the collective watchdog's DeadlineExceededError) names no one: it cannot know who stopped
    answering, so the line says how long the call waited and lists the peers.
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

    if isinstance(error, tf.errors.DeadlineExceededError):
        # A deadline cannot tell who stopped answering, or whether the call was merely slow: no one is
        # blamed, every peer is listed.
        return HarnessError(f"a collective call waited more than {collective_timeout_s:g}s "
                            f"(runtime.collective_timeout_s) for its peers ({', '.join(name(t) for t in others)}): "
                            f"one of them stopped answering (hung, stopped or cut off), or the call is "
                            f"slower than the timeout (then raise runtime.collective_timeout_s); this run is "
                            f"incomplete")
    who = ", ".join(name(t) for t in peers) if peers else f"a peer (one of {', '.join(name(t) for t in others)})"
    if "heartbeat" in text:
        why = "it stopped sending heartbeats (crashed, stopped or cut off)"
    elif re.search(r"coordination service|connect|socket closed|connection reset", text, re.IGNORECASE):
        why = "it cannot be reached (crashed or cut off)"
    else:
        why = f"{type(error).__name__} in a collective"
    return HarnessError(f"lost contact with {who}: {why}; this run is incomplete")


def make_tpu(address: str, timeout_s: float, precision: str, jit: str,
             spatial_dims: tuple[int, ...] = (), platform: str = "") -> StrategyRuntime:
    """Connects to a TPU, giving up after `timeout_s`: an unreachable address otherwise hangs forever.

    With spatial partitioning (`spatial_dims` from base.check_spatial_partition, height split k ways)
    each replica spans k cores: the device assignment groups cores by Model Garden's computation shape for
    k, and the replicas are cores / k. That path has never run (no TPU was available to the authors).
    """
    result: dict[str, Any] = {}
    ways = spatial_dims[1] if spatial_dims else 1
    # '' means this host's TPU: $TPU_NAME where set (a TPU node), else 'local' (a TPU VM). TensorFlow's
    # own default (None) refuses to guess on a TPU VM without TPU_NAME.
    target = address or os.environ.get("TPU_NAME", "") or "local"
    if target == "local" and not tf.config.list_physical_devices("TPU"):
        raise HarnessError("runtime.kind=tpu with runtime.tpu='' (this host's TPU) but TensorFlow sees no "
                           "TPU here and TPU_NAME is not set; set runtime.tpu to the TPU's name or "
                           "grpc:// address, or run on the TPU VM")
    if target == "local":
        # A TPU VM of a pod sees only its own chips: the slice the config declares must fit on them.
        platforms.check_local_tpu_slice(platform, len(tf.config.list_physical_devices("TPU")))

    def connect() -> None:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=target)
            tf.config.experimental_connect_to_cluster(resolver)
            topology = tf.tpu.experimental.initialize_tpu_system(resolver)
            if ways == 1:
                result["strategy"] = tf.distribute.TPUStrategy(resolver)
                return
            cores = topology.num_tasks * topology.num_tpus_per_task
            if cores % ways:
                raise HarnessError(f"runtime.spatial_partition splits each replica over {ways} cores, which "
                                   f"does not divide this TPU's {cores} cores")
            assignment = tf.tpu.experimental.DeviceAssignment.build(
                topology, computation_shape=SPATIAL_COMPUTATION_SHAPES[ways], num_replicas=cores // ways)
            # SPMD partitioning: TensorFlow's suggested mode for experimental_split_to_logical_devices.
            result["strategy"] = tf.distribute.TPUStrategy(
                resolver, experimental_device_assignment=assignment, experimental_spmd_xla_partitioning=True)
        except Exception as e:  # noqa: BLE001 - any failure to reach the TPU is the user's to fix
            result["error"] = e

    thread = threading.Thread(target=connect, daemon=True, name="tpu-connect")
    thread.start()
    thread.join(timeout_s)
    where = target
    if thread.is_alive():
        raise HarnessError(f"could not reach TPU {where} within runtime.tpu_timeout_s={timeout_s:g}s")
    if isinstance(result.get("error"), HarnessError):
        raise result["error"]
    if "error" in result:
        first = str(result["error"]).strip().splitlines()[0] if str(result["error"]).strip() else ""
        raise HarnessError(f"could not connect to TPU {where}: {type(result['error']).__name__}: {first}")
    return StrategyRuntime("tpu", result["strategy"], "TPU", precision, jit, spatial_dims)
