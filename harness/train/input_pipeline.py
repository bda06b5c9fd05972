"""The workload-agnostic half of a training input pipeline: the `data.*` technique keys every workload's
data section inherits, the tf.data options they turn into, and the meter that stamps each batch's request
and arrival.

A workload's `data.py` owns what is read and how an example is preprocessed; the harness owns how the
pipeline runs (threads, order, prefetch, caching the eval set, the tf.data service) and how its speed is
judged against the steps it feeds.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import tensorflow as tf

from harness.config import field


@dataclasses.dataclass
class ServiceConfig:
    dispatcher: str = field("", doc="grpc://HOST:PORT of a tf.data service dispatcher: training "
                            "preprocessing runs on its workers ('' = on this host)")
    processing_mode: str = field(
        "distributed_epoch", choices=("distributed_epoch",),
        doc="distributed_epoch: the workers split each epoch's files, so every training example is "
        "processed once per epoch")
    stall_timeout_s: float = field(120.0, min=1.0, doc="a training batch awaited this long from the service "
                                   "ends the run with one error line (a lost worker's files never arrive)")


@dataclasses.dataclass
class PipelineConfig:
    """Input techniques, on by default; each can be switched off to measure it (scripts/bench_input.py)."""

    parallel_reads: int = field(16, min=1, doc="training files read at once, records interleaved "
                                "(1 = one file after another)")
    deterministic: bool = field(False, doc="training: keep element order through parallel reads and maps; "
                                "false lets a ready element overtake a slow one (the order is a shuffle "
                                "either way, which the rules allow). Synthetic sources always keep it: their "
                                "runs stay reproducible")
    threads: int = field(0, min=0, doc="training pipeline's private thread pool size (0 = TF's shared, "
                         "autotuned pool)")
    cache_eval: bool = field(True, doc="decode the eval set once and replay it from memory at every eval "
                             "(only when this host's share fits in cache_eval_max_mb)")
    cache_eval_max_mb: int = field(4096, min=0, doc="largest decoded eval share cached in memory")
    prefetch_to_device: bool = field(True, doc="prepare the next training batches on the device while a "
                                     "step runs (false: each step waits for its batch)")
    service: ServiceConfig = field(default_factory=ServiceConfig,
                                   doc="tf.data service: training preprocessing on a fleet of workers")


def pipeline_config(data_cfg: Any) -> PipelineConfig:
    """The technique keys of a workload's data section (defaults where a workload has not adopted them)."""
    return data_cfg if isinstance(data_cfg, PipelineConfig) else PipelineConfig()


def train_options(cfg: PipelineConfig, synthetic: bool = False) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = cfg.deterministic or synthetic
    # autotune left unset (on by default): a pipeline that turns it off (loop.without_autotune) then merges
    # these options without tf.data's "Changing the value of option enabled" warning
    if cfg.threads:
        options.threading.private_threadpool_size = cfg.threads
    return options


@tf.function(jit_compile=True, autograph=False)
def to_uint8(image: tf.Tensor) -> tf.Tensor:
    """0..255 float pixels rounded (half to even), clipped and cast to uint8 in one XLA loop (the same bits as
    the three TF ops, which a test compares): the images workloads send as uint8 (data.normalize_on_device)."""
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def nbytes(spec: Any) -> int | None:
    """Bytes of one element of `spec`, or None when a shape is not fully known."""
    total = 0
    for s in tf.nest.flatten(spec):
        if not s.shape.is_fully_defined():
            return None
        total += math.prod(s.shape.as_list()) * s.dtype.size
    return total


class InputWait:
    """When the last training batch was asked of the pipeline and when it arrived, and the sum of waits.

    The last stage of the pipeline zips a clock read at request time with the batch and stamps its arrival
    in host variables that another thread (the stall watchdog) may read while a step runs. The sum is the
    input wait the loop reports on every runtime: the host loop reads no clock of its own, since a clock
    around `next(iterator)` would have to wait for the previous step (a host round trip per step). It is an
    upper bound where a device prefetch (DTensorDataset's, a strategy's per-device buffers) asks ahead of
    the step: a pipeline that just keeps up reads high.
    """

    def __init__(self) -> None:
        with tf.device("/cpu:0"):
            self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_wait_s")
            self.asked_at = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_asked_at")
            self.arrived_at = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_arrived_at")

    def measure(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        seconds, asked_at, arrived_at = self.seconds, self.asked_at, self.arrived_at

        def clock(_: tf.Tensor) -> tf.Tensor:
            now = tf.timestamp()
            with tf.control_dependencies([asked_at.assign(now)]):
                return tf.identity(now)

        def arrived(asked: tf.Tensor, batch: Any) -> Any:
            now = tf.timestamp()
            updates = [seconds.assign_add(now - asked), arrived_at.assign(now)]
            with tf.control_dependencies(updates):
                return tf.nest.map_structure(tf.identity, batch)

        # Zip asks its inputs in order: the clock is read, then the batch is awaited.
        asked = tf.data.Dataset.from_tensors(tf.constant(0)).repeat().map(clock)
        return tf.data.Dataset.zip((asked, ds)).map(arrived)

    def total(self) -> float:
        return float(self.seconds.numpy())

    def pending_s(self) -> float:
        """How long the batch asked for last has been awaited (0 when it has arrived)."""
        asked, arrived = float(self.asked_at.numpy()), float(self.arrived_at.numpy())
        return max(time.time() - asked, 0.0) if asked > arrived else 0.0
