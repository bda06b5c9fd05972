"""The MLPerf BERT initial checkpoint: TF checkpoints with the reference's variable names.

`name_map` says, for every model variable, which checkpoint tensor fills it and the shape it has there
(attention kernels are stored 2-D in the reference and per-head 3-D here). Loading checks every entry
first and fails with the name of the first missing or mis-shaped variable, before touching any weight.
"""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError
from harness.runtime.base import Runtime

_RENAMES = [
    (r"^(bert/embeddings/\w+)_layer/embeddings$", r"\1"),
    (r"^(bert/encoder/layer_\d+/attention)/self/output/(kernel|bias)$", r"\1/output/dense/\2"),
]


def checkpoint_name(path: str) -> str:
    for pattern, repl in _RENAMES:
        path = re.sub(pattern, repl, path)
    return path


def name_map(runtime: Runtime, hidden: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Model variable path -> (checkpoint name, shape in the checkpoint), for trainable weights."""
    out = {}
    for v in runtime.variables(trainable=True):
        shape = tuple(v.variable.shape)
        if re.search(r"/attention/self/(query|key|value)/kernel$", v.path):
            shape = (hidden, hidden)
        elif re.search(r"/attention/self/(query|key|value)/bias$", v.path):
            shape = (hidden,)
        elif re.search(r"/attention/self/output/kernel$", v.path):
            shape = (hidden, hidden)
        out[v.path] = (checkpoint_name(v.path), shape)
    return out


def host_value(t: tf.Tensor) -> np.ndarray:
    """The full value of a (possibly sharded DTensor) variable, on the host."""
    from tensorflow.experimental import dtensor

    if dtensor.is_dtensor(t):
        layout = dtensor.fetch_layout(t)
        t = dtensor.relayout(t, dtensor.Layout.replicated(layout.mesh, t.shape.rank))
        return dtensor.unpack(t)[0].numpy()
    return np.asarray(t)


def save(runtime: Runtime, hidden: int, prefix: str) -> str:
    """Writes the model's weights under the reference names (a name-based TF checkpoint)."""
    mapping = name_map(runtime, hidden)
    names, values = [], []
    for v in runtime.variables(trainable=True):
        name, shape = mapping[v.path]
        names.append(name)
        values.append(tf.constant(host_value(v.variable.read_value()).reshape(shape)))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=values)
    return prefix


def load(runtime: Runtime, hidden: int, path: str) -> int:
    """Fills every trainable variable from checkpoint `path`; returns how many were loaded."""
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as e:
        raise HarnessError(f"model.init_checkpoint {path}: cannot read a TF checkpoint there "
                           f"({str(e).strip().splitlines()[0][:200]})") from None
    shapes = reader.get_variable_to_shape_map()
    mapping = name_map(runtime, hidden)
    for v in runtime.variables(trainable=True):
        name, shape = mapping[v.path]
        if name not in shapes:
            raise HarnessError(f"model.init_checkpoint {path}: variable {name} (for {v.path}) is missing")
        if tuple(shapes[name]) != shape:
            raise HarnessError(f"model.init_checkpoint {path}: variable {name} has shape {list(shapes[name])}, "
                               f"the model needs {list(shape)}")
    for v in runtime.variables(trainable=True):
        name, _ = mapping[v.path]
        value = reader.get_tensor(name).reshape(tuple(v.variable.shape)).astype(v.variable.dtype.as_numpy_dtype)
        assign_host(runtime, v.variable, value)
    return len(mapping)


def assign_host(runtime: Runtime, var: tf.Variable, value: np.ndarray) -> None:
    to_mesh = getattr(runtime, "to_mesh", None)
    if to_mesh is None:
        var.assign(value)
        return
    from tensorflow.experimental import dtensor

    var.assign(to_mesh(value, dtensor.fetch_layout(var)))
