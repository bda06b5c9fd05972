"""A step that XLA cannot compile, as one line naming the op and where the model created it.

Shared by the dry run and the real run's warm-up, where every compiled step is first built: TensorFlow's
own message is a wall of graph dumps and stack frames.
"""
from __future__ import annotations

import os
import re

from harness.errors import HarnessError

_UNSUPPORTED = re.compile(r"No registered '([\w>]+)' OpKernel for (\w+) devices")
_DETECTED = re.compile(r"Detected unsupported operations when trying to compile graph \S+ on (\w+): (\w+)")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_CREATED = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_XLA_HINTS = ("tf2xla", "XLA", "compile-time constant", "jit_compile", "OpKernel for XLA")


def xla_compile_error(exc: BaseException, workload: str, which: str) -> HarnessError | None:
    """A failure to compile a step under XLA as one line naming the op (None: not a compile failure).

    `which` is "train" or "eval". The line reads `<workload> <which> step does not compile under XLA:
    <op> ...`, with where the op was created when TensorFlow says so.
    """
    if isinstance(exc, HarnessError):
        return None
    text = getattr(exc, "message", None) or str(exc)
    if not any(h in text for h in _XLA_HINTS):
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
