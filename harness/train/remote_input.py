"""Training input that must run where no Python interpreter of this process runs.

On a multi-host TPU slice under TPUStrategy, each host's input pipeline runs in that host's TensorFlow
server, and a tf.data service worker runs the pipelines it is sent: neither can call back into this
process's Python, so a pipeline with `tf.numpy_function` / `tf.py_function` fails there at its first
batch (or hangs). `check` finds such ops in the training pipeline's graph before the log exists.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from harness.errors import HarnessError
from harness.runtime.base import InputContext

PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")


def python_ops(dataset: tf.data.Dataset) -> list[str]:
    """The Python-callback ops in `dataset`'s graph, its function library included (sorted, distinct)."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())  # noqa: SLF001 - no public accessor
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    return sorted(ops & set(PYTHON_OPS))


def check(workload: Any, runtime: Any, service: bool) -> None:
    """Refuses a training pipeline with Python callbacks on a TPU runtime or through the tf.data service."""
    if runtime.kind != "tpu" and not service:
        return
    where = ("runtime.kind=tpu: a TPU slice's hosts run the input pipeline in their TensorFlow servers"
             if runtime.kind == "tpu" else
             "data.service: the service's workers run the input pipeline")
    ctx = InputContext(num_hosts=1, host_id=0, batch_size=1, seed=workload.cfg.seed)
    found = python_ops(workload.train_dataset(ctx))
    if found:
        source = getattr(workload.cfg.data, "source", "?")
        raise HarnessError(f"{where}, which cannot call back into Python, and {workload.NAME}'s "
                           f"data.source={source} pipeline calls Python ({', '.join(found)}); use a source "
                           f"without Python callbacks (e.g. data.source=tfrecord)")
