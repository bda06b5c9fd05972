"""Numbers from XLA itself, and the rules a TPU would hold a traced step to.

FLOPs are counted from the HLO module TensorFlow hands to XLA (TensorFlow's Python API does not expose XLA's
HloCostAnalysis, so `count_flops` follows its conventions); memory is the optimized module's buffer assignment
(XLA:CPU's memory plan). `host_only_ops` and `dynamic_inputs` find what a TPU could not compile.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import tensorflow as tf

from harness.train.xla_errors import xla_compile_error


def _hlo_pb2() -> Any:
    from tensorflow.compiler.xla.service import hlo_pb2

    return hlo_pb2


_ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "atan2", "negate",
    "abs", "sign", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt", "rsqrt", "cbrt",
    "tanh", "logistic", "sine", "cosine", "tan", "erf", "floor", "ceil", "round-nearest-afz",
    "round-nearest-even", "compare", "select", "clamp", "and", "or", "xor", "not", "is-finite",
}


def _elements(shape: Any) -> int:
    if shape.tuple_shapes:
        return sum(_elements(s) for s in shape.tuple_shapes)
    return math.prod(shape.dimensions) if shape.dimensions else 1


def count_flops(module: Any) -> float:
    """Floating-point operations of an HloModuleProto, by XLA's cost-analysis conventions.

    dot: 2 x output elements x contracted size; convolution: 2 x output elements x kernel window x input
    features per group (padding taps included); elementwise arithmetic, compare and select: one per output
    element; reduce: one per input element. Called computations (while bodies, conditionals, calls) are
    counted once per appearance, as XLA's HloCostAnalysis counts a while body once.
    """
    computations = {c.id: c for c in module.computations}

    def computation_flops(cid: int, seen: tuple[int, ...]) -> float:
        if cid in seen:
            return 0.0
        comp = computations[cid]
        by_id = {i.id: i for i in comp.instructions}
        total = 0.0
        for ins in comp.instructions:
            op = ins.opcode
            out = _elements(ins.shape)
            if op == "dot":
                lhs = by_id[ins.operand_ids[0]].shape
                contracted = math.prod(lhs.dimensions[d] for d in ins.dot_dimension_numbers.lhs_contracting_dimensions)
                total += 2.0 * out * contracted
            elif op == "convolution":
                kernel = by_id[ins.operand_ids[1]].shape
                dn = ins.convolution_dimension_numbers
                window = math.prod(kernel.dimensions[d] for d in dn.kernel_spatial_dimensions)
                total += 2.0 * out * window * kernel.dimensions[dn.kernel_input_feature_dimension]
            elif op in _ELEMENTWISE:
                total += out
            elif op in ("reduce", "reduce-window"):
                total += sum(_elements(by_id[o].shape) for o in ins.operand_ids[: len(ins.operand_ids) // 2])
            elif op in ("while", "conditional", "call", "fusion", "map"):
                total += sum(computation_flops(c, seen + (cid,)) for c in ins.called_computation_ids)
        return total

    return computation_flops(module.entry_computation_id, ())


def buffer_bytes(hlo_proto: Any) -> int:
    """XLA's memory plan for one execution: every buffer allocation but thread-local ones (parameters,
    outputs, constants and the one preallocated temporary buffer the heap simulator sized)."""
    return int(sum(a.size for a in hlo_proto.buffer_assignment.buffer_allocations if not a.is_thread_local))


@dataclasses.dataclass
class Compiled:
    flops: float
    peak_bytes: int | None
    seconds: float
    traced: Any  # the ConcreteFunction XLA compiled (its graph: what a TPU would be handed)


def compile_step(fn: Callable, specs: Any, workload: str, which: str, optimize: bool = True) -> Compiled:
    """Traces `fn(batch)` under XLA at `specs` (no tensor allocated, nothing run) and reads XLA's numbers;
    `optimize` also runs XLA's HLO passes and buffer assignment (the memory plan; most of the time)."""
    flat = tf.nest.flatten(specs)

    def step(*tensors: tf.Tensor) -> Any:
        return fn(tf.nest.pack_sequence_as(specs, list(tensors)))

    # Traced as written, as the run's steps are (harness/train/loop.py: no AutoGraph conversion of the step).
    compiled = tf.function(step, jit_compile=True, autograph=False)
    hlo = _hlo_pb2()
    t0 = time.time()
    try:
        ir = compiled.experimental_get_compiler_ir(*flat)
        module = hlo.HloModuleProto.FromString(ir(stage="hlo_serialized"))
        optimized = hlo.HloProto.FromString(ir(stage="optimized_hlo_proto_serialized")) if optimize else None
    except Exception as e:  # noqa: BLE001 - translated below, or re-raised untouched
        error = xla_compile_error(e, workload, which)
        if error is not None:
            raise error from None
        raise
    seconds = time.time() - t0
    peak = buffer_bytes(optimized) if optimized is not None and optimized.HasField("buffer_assignment") else None
    return Compiled(count_flops(module), peak, seconds, compiled.get_concrete_function(*flat))


# ---------------------------------------------------------------------- TPU rules, checked on CPU

# Ops that only a host can run: Python callbacks, summaries and printing, input iterators, files.
HOST_ONLY_OPS = {
    "PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction", "PrintV2", "Print", "StringFormat",
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "MakeIterator", "AnonymousIterator",
    "AnonymousIteratorV2", "AnonymousIteratorV3", "IteratorV2", "OptionalGetValue", "OptionalHasValue",
    "ReadFile", "WriteFile",
}


def _graph_nodes(concrete: Any) -> list[Any]:
    """NodeDefs of a traced function and of every function it calls (while bodies, branches, calls)."""
    graph_def = concrete.graph.as_graph_def()
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


def host_only_ops(concrete: Any) -> list[str]:
    """`op_type name` of each node in a traced step that cannot be compiled for a TPU: a host-only op
    (HOST_ONLY_OPS, summaries) or any string tensor."""
    bad = []
    for node in _graph_nodes(concrete):
        types = []
        for value in node.attr.values():
            types += [value.type] if value.type else list(value.list.type)
        if (node.op in HOST_ONLY_OPS or "Summary" in node.op or tf.string.as_datatype_enum in types):
            bad.append(f"{node.op} {node.name}")
    return bad


def dynamic_inputs(concrete: Any) -> list[str]:
    """Inputs of a traced step (batch tensors and captured variables) whose shape is not fully static."""
    return [f"{t.name} {t.shape}" for t in concrete.inputs if not t.shape.is_fully_defined()]

