"""A mixture of experts' capacity, TensorFlow-free: the dispatch (benchmarks/lm/moe_dispatch.py) sizes its
buffers by it, and `plan` (benchmarks/<name>/cost.py) and the dry run's notes count with it."""
from __future__ import annotations

import math

# The metric of the share of expert assignments a capacity factor dropped (the evals' and training's: the run
# names it a deviation from the dropless references).
DROPPED_METRIC = "dropped assignments"


def expert_capacity(group: int, experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert per group: the whole group when dropless (no expert can receive a token twice, so
    nothing overflows), else ceil(cf * group * k / experts) (Switch eq. 3 for top-k), at most the group."""
    if capacity_factor <= 0:
        return group
    return max(1, min(group, math.ceil(capacity_factor * group * k / experts)))
