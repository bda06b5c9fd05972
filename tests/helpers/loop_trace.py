"""Traces the toy workload's host train loop and reports what a step's input fetch waits on.

Run in-process (the default runtime) or as a script in a subprocess (`python loop_trace.py mirrored`:
2 logical CPUs, which must be configured before TensorFlow starts). Two findings:
- `fetch_ancestors`: the loop-body inputs (loop-carried values) that any `*GetNext*` op of the while body
  reaches through data or control edges; only the iterator resource itself may appear, otherwise step i+1's
  batch waits for step i's outputs (a host round trip per step on an accelerator);
- `reduce_graphs`: the graphs the runtime's cross-replica `sum`/`mean` (and the strategy's `reduce`) were
  traced in; a while body there means a reduction to the host every step instead of once per call.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def _spy(obj: Any, name: str, graphs: list[str]) -> None:
    original = getattr(obj, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        graphs.append(tf.compat.v1.get_default_graph().name)
        return original(*args, **kwargs)

    setattr(obj, name, recorded)


def fetch_ancestors(graph_def: Any) -> dict[str, list[str]]:
    """For each function holding a GetNext op: the function inputs its GetNext ops reach (data or control),
    minus the iterator each reads from."""
    found = {}
    for f in graph_def.library.function:
        nodes = {n.name: n for n in f.node_def}
        args = {a.name for a in f.signature.input_arg}
        fetches = [n for n in f.node_def if "GetNext" in n.op]
        if not fetches:
            continue
        iterators = {n.input[0].split(":")[0] for n in fetches}
        reached, todo = set(), [i for n in fetches for i in n.input[1:]]
        while todo:
            name = todo.pop().lstrip("^").split(":")[0]
            if name in reached:
                continue
            reached.add(name)
            if name in nodes:
                todo.extend(nodes[name].input)
        found[f.signature.name] = sorted((reached & args) - iterators)
    return found


def trace(runtime: Any) -> dict[str, Any]:
    import toy
    from harness.train.loop import CompiledSteps, train_input

    wl = toy.make("/tmp", runtime)
    with runtime.scope():
        wl.build()
    steps = CompiledSteps(runtime, wl)
    graphs: list[str] = []
    _spy(runtime, "sum", graphs)
    _spy(runtime, "mean", graphs)
    if hasattr(runtime, "strategy"):
        _spy(runtime.strategy, "reduce", graphs)
    iterator = iter(train_input(runtime, wl, 10, 0))
    loop = getattr(steps.train_loop, "compiled", steps.train_loop)
    concrete = loop.get_concrete_function(iterator, tf.constant(2))
    return {"fetch_ancestors": fetch_ancestors(concrete.graph.as_graph_def()), "reduce_graphs": graphs,
            "replicas": runtime.num_replicas}


if __name__ == "__main__":
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    cfg = RuntimeConfig(kind="mirrored", cpu_devices=2) if sys.argv[1:] == ["mirrored"] else RuntimeConfig()
    print("RESULT " + json.dumps(trace(make_runtime(cfg))))
