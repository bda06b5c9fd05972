"""Matmul and convolution FLOPs of an XLA HLO module's text (2 per multiply-add), the compiler's own view
of a model: `tf.function(jit_compile=True).experimental_get_compiler_ir(...)(stage="hlo")` prints every
dot and convolution with its operand shapes. Element-wise work is left out, as in the analytic counts.
"""
from __future__ import annotations

import math
import re

_SHAPE = r"[a-z0-9]+\[([0-9,]*)\]"
_DOT = re.compile(rf"= {_SHAPE}\S* dot\({_SHAPE}\S* %[^,]+, {_SHAPE}\S* %[^)]+\)"
                  rf".*?lhs_contracting_dims=\{{([0-9,]*)\}}")
_CONV = re.compile(rf"= {_SHAPE}\S* convolution\({_SHAPE}\S* %[^,]+, {_SHAPE}\S* %[^)]+\)(.*)")


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def hlo_flops(hlo_text: str) -> float:
    total = 0
    for line in hlo_text.splitlines():
        m = _DOT.search(line)
        if m:
            out, lhs, _, contracting = _dims(m.group(1)), _dims(m.group(2)), m.group(3), _dims(m.group(4))
            total += math.prod(out) * math.prod(lhs[i] for i in contracting)
            continue
        m = _CONV.search(line)
        if m:
            out, kernel, rest = _dims(m.group(1)), _dims(m.group(3)), m.group(4)
            labels = re.search(r"dim_labels=\w+_(\w+)->(\w+)", rest)
            batch_groups = re.search(r"batch_group_count=(\d+)", rest)
            kernel_labels = labels.group(1) if labels else "01io"
            o = kernel[kernel_labels.index("o")]
            bg = int(batch_groups.group(1)) if batch_groups else 1
            # each output element sums over the kernel's window x its input features (the kernel's "i"
            # dimension is already input features / feature_group_count)
            total += math.prod(out) * math.prod(kernel) // o // max(1, bg)
    return 2.0 * total
