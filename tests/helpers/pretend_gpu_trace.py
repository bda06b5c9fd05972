"""Traces a workload's multi-replica train loop and eval step the way TensorFlow builds them on a
multi-GPU host with runtime.jit_compile on: 4 logical CPUs, with MirroredStrategy's device-type test
answering "GPU" (so each replica's function is compiled per replica, and no merge_call is lifted out of
it). Tracing is faithful to the GPU path; executing it is not (XLA on CPU compiles no ring collectives),
so nothing runs. Several workloads are traced in this one process (logical devices are set once per
process, and TensorFlow's import is the expensive part).

Usage: pretend_gpu_trace.py '{"cases": {name: [config, [overrides]]}, "only_first_replica": name}'
Prints one RESULT line of JSON, per case: what tracing raised, the batch-norm group, and every
cross-device edge of the traced graphs whose consumer (or anything downstream of it in the same graph)
updates a variable; "only_first_replica" retraces that case with the old variable aggregation."""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402
from tensorflow.python.distribute import mirrored_run, mirrored_strategy  # noqa: E402

from benchmarks import registry  # noqa: E402
from harness import config as C  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402
from harness.train import loop  # noqa: E402

UPDATES = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatterUpdate"}


def graphs(graph):
    yield graph
    for f in graph._functions.values():
        yield from graphs(f.graph)


def updating_calls(graph) -> set[str]:
    """Names of call ops in `graph` whose function (at any depth) updates a variable."""
    out = set()
    for op in graph.get_operations():
        fname = op.node_def.attr["f"].func.name if "f" in op.node_def.attr else ""
        if fname and fname in graph._functions:
            body = graph._functions[fname].graph
            if any(o.type in UPDATES for g in graphs(body) for o in g.get_operations()):
                out.add(op.name)
    return out


def cross_device_updates(root) -> list[str]:
    bad = []
    for g in graphs(root):
        calls = updating_calls(g)
        consumers: dict[str, list] = {}
        for op in g.get_operations():
            for t in op.inputs:
                consumers.setdefault(t.op.name, []).append(op)
        for op in g.get_operations():
            for t in op.inputs:
                if not (op.device and t.op.device and op.device != t.op.device):
                    continue
                # Forward closure of this edge's consumer within the graph.
                seen, todo = set(), [op]
                while todo:
                    o = todo.pop()
                    if o.name in seen:
                        continue
                    seen.add(o.name)
                    if o.type in UPDATES or o.name in calls:
                        bad.append(f"{t.op.type}@{t.op.device} -> {op.type}@{op.device} ... {o.type} {o.name}")
                        break
                    todo.extend(consumers.get(o.name, []))
    return bad


def trace(config: str, small: list[str]) -> dict:
    cfg = C.load_config(config, small + ["submission.division=open", "runtime.kind=mirrored",
                                         "runtime.cpu_devices=4", "runtime.jit_compile=false"])
    rt = make_runtime(cfg.runtime)
    wl = registry.get(cfg.workload)(cfg, rt)
    wl.validate()
    with rt.scope():
        wl.build()
    rt.jit_compile = True  # refused for CPU replicas at make_runtime; here only traced, as on GPUs
    steps = loop.CompiledSteps(rt, wl)
    out = {"replicas": rt.num_replicas, "bn_group": getattr(wl, "bn_group", None), "error": None, "edges": [],
           "xla_calls": 0}
    try:
        train = steps.train_loop.get_concrete_function(
            iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed)), tf.constant(1))
        evaluate = steps.eval_step.get_concrete_function(
            iter(loop.eval_input(rt, wl, cfg.schedule.eval_batch_size, cfg.seed)))
        out["edges"] = cross_device_updates(train.graph) + cross_device_updates(evaluate.graph)
        # Per-replica calls marked for XLA: one per replica for train and for eval.
        out["xla_calls"] = sum(1 for root in (train.graph, evaluate.graph) for g in graphs(root)
                               for o in g.get_operations()
                               if "_XlaMustCompile" in o.node_def.attr and o.node_def.attr["_XlaMustCompile"].b)
    except Exception as e:  # noqa: BLE001 - what tracing raises is the result
        lines = [l.strip() for l in str(e).splitlines() if l.strip()]
        out["error"] = f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"
    return out


def main(spec: dict) -> None:
    mirrored_run._is_gpu_device = lambda d: True
    mirrored_strategy._is_gpu_device = lambda d: True
    result = {name: trace(config, small) for name, (config, small) in spec["cases"].items()}
    # The old aggregation (ONLY_FIRST_REPLICA for replicated values), to show the checks can fail.
    from harness.runtime import distribute
    original = distribute.StrategyRuntime._make_variable

    def make_variable(self, path, shape, dims, initializer, trainable, dtype, sync):
        if sync != "first":
            return original(self, path, shape, dims, initializer, trainable, dtype, sync)
        with self.strategy.scope():
            return tf.Variable(lambda: initializer(shape, dtype), trainable=trainable, name=path, dtype=dtype,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    distribute.StrategyRuntime._make_variable = make_variable
    if spec.get("only_first_replica"):
        result["only_first_replica"] = trace(*spec["cases"][spec["only_first_replica"]])
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
