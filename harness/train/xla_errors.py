"""A step that XLA cannot compile, as one line naming the op and where the model created it; a step
that runs out of device memory, as one line naming what it tried to allocate.

Shared by the dry run and the real run's warm-up, where every compiled step is first built and first
runs: TensorFlow's own message is a wall of graph dumps and stack frames.
"""
from __future__ import annotations

import os
import re

import tensorflow as tf

from harness.errors import HarnessError

_UNSUPPORTED = re.compile(r"No registered '([\w>]+)' OpKernel for (\w+) devices")
_DETECTED = re.compile(r"Detected unsupported operations when trying to compile graph \S+ on (\w+): (\w+)")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_CREATED = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# What only a compile failure says (TensorFlow's tf2xla bridge), checked on the error types it raises.
_COMPILE_MARKERS = ("compile-time constant", "XLA compilation requires", "tf2xla")
# experimental_get_compiler_ir (the dry run) wraps the same compile errors in a ValueError.
_COMPILER_IR = "Failed getting HLO text"
# Out of memory, as XLA:GPU ("Out of memory while trying to allocate 17179869184 bytes."), TensorFlow's
# allocator ("ran out of memory trying to allocate 4.00GiB (rounded to 4294967296)", "OOM when allocating
# tensor with shape[...] and type float") and XLA:TPU ("Used 20.5G of 16.00G hbm") word it.
_OOM_BYTES = re.compile(r"trying to allocate (\d+) bytes|rounded to (\d+)\)")
_OOM_SIZE = re.compile(r"trying to allocate ([\d.]+\s*[KMGT]i?B)")
_OOM_TENSOR = re.compile(r"OOM when allocating tensor with shape\s*\[([^\]]*)\] and type (\w+)")
_OOM_HBM = re.compile(r"Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?) hbm", re.IGNORECASE)


def _is_compile_failure(exc: BaseException, text: str) -> bool:
    if isinstance(exc, (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)):
        pass
    elif not (isinstance(exc, ValueError) and text.lstrip("'").startswith(_COMPILER_IR)):
        return False
    return bool(_UNSUPPORTED.search(text) or _DETECTED.search(text) or any(m in text for m in _COMPILE_MARKERS))


def out_of_memory_error(exc: BaseException, workload: str, which: str) -> HarnessError | None:
    """A device out-of-memory error as one line naming what it tried to allocate (None: not one)."""
    if not isinstance(exc, tf.errors.ResourceExhaustedError):
        return None
    text = getattr(exc, "message", None) or str(exc)
    exact, size = _OOM_BYTES.search(text), _OOM_SIZE.search(text)
    tensor = _OOM_TENSOR.search(text)
    hbm = _OOM_HBM.search(text)
    if exact:
        n = int(exact.group(1) or exact.group(2))
        what = f": tried to allocate {n} bytes ({n / 2**30:.2f} GiB)"
    elif size:
        what = f": tried to allocate {size.group(1)}"
    elif tensor:
        what = f": tried to allocate a {tensor.group(2)} tensor of shape [{tensor.group(1)}]"
    elif hbm:
        what = f": the program needs {hbm.group(1)} of {hbm.group(2)} HBM"
    else:
        first = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
        what = f" ({first[:200]})" if first else ""
    return HarnessError(f"{workload} {which} step ran out of device memory{what}; use a smaller per-device "
                        f"batch (schedule.global_batch_size, schedule.gradient_accumulation_steps) or more "
                        f"devices")


def xla_compile_error(exc: BaseException, workload: str, which: str) -> HarnessError | None:
    """A failure to compile a step under XLA as one line naming the op (None: not a compile failure).

    `which` is "train" or "eval". The line reads `<workload> <which> step does not compile under XLA:
    <op> ...`, with where the op was created when TensorFlow says so. Only compile errors get that label
    (InvalidArgument/Unimplemented, or the dry run's compiler-IR ValueError, with a tf2xla marker): out of
    memory is its own line (out_of_memory_error), and runtime failures (Internal, Unavailable: NCCL, a
    lost peer) pass through untouched for the caller to report.
    """
    if isinstance(exc, HarnessError):
        return None
    oom = out_of_memory_error(exc, workload, which)
    if oom is not None:
        return oom
    text = getattr(exc, "message", None) or str(exc)
    if not _is_compile_failure(exc, text):
        return None
    ops = list(dict.fromkeys(_UNSUPPORTED.findall(text)))
    detected = _DETECTED.search(text)
    if ops:
        names = ", ".join(op for op, _ in ops)
        what = f"{names} (no {ops[0][1]} kernel)"
    elif detected:
        what = f"{detected.group(2)} (no {detected.group(1)} kernel)"
    else:
        first = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), type(exc).__name__)
        first = re.sub(r"^Failed getting HLO text: '?", "", first)
        node = _NODE.search(text)
        what = (f"{node.group(1)}: " if node else "") + first[:200]
    frames = [f for f in _CREATED.findall(text) if "site-packages" not in f[0]]
    where = f", created at {os.path.basename(frames[-1][0])}:{frames[-1][1]} in {frames[-1][2]}" if frames else ""
    return HarnessError(f"{workload} {which} step does not compile under XLA: {what}{where}")
