"""Whether a run on the host's CPU fits the host's memory, told before its log opens.

A CPU run too big for the host is not refused by TensorFlow: it grows until the kernel's out-of-memory
killer ends it with SIGKILL, minutes in and with no line from the harness. So a run whose devices are the
host (every runtime on CPU: `default`, `mirrored` on logical CPUs, a CPU `mesh`, a CPU `multi_worker`
worker) first estimates the peak host memory of its train step from the config alone, in milliseconds,
and is refused in one line when that exceeds the memory the host has left for it.

The estimate (docs/running.md, "Host memory"):
- per parameter (the workload's cost module's count, benchmarks/<name>/cost.py): float32 weights, float32
  gradients and two float32 optimizer slots (Adam's; one-slot optimizers are overstated by 4 bytes), once
  per replica that holds a whole copy (each local replica of a tf.distribute runtime, each data-axis
  replica of a mesh without FSDP); plus the warm-up's host copy of weights and slots, once; a frozen
  base (a fine-tune's, `ModelCost.frozen_bytes`) counts in the bytes it is held in, with the weights and
  in the warm-up copy;
- the activations and temporaries of the train step, where the cost module can tell
  (`train_activation_bytes(cfg, rows)`, the decoder LMs: benchmarks/lm/cost.py), for this host's rows of
  one micro-batch;
- a fixed allowance for what the runtime allocates once running (graphs, kernels, input buffers).
What the process holds already (Python, TensorFlow) is outside the estimate: the available memory is read
while it is loaded.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from harness.errors import HarnessError

GIB = 2 ** 30
FLOAT32 = 4
OPTIMIZER_SLOTS = 2            # Adam / AdamW / LAMB: m and v
RUNTIME_ALLOWANCE = GIB // 2   # graphs, kernels, tf.data buffers: measured ~0.3-0.4 GiB on the smoke runs


@dataclasses.dataclass
class Estimate:
    """Peak host memory of the train step: bytes by part, the parts' sum, and what was left out."""
    parts: dict[str, int]
    unknown: str = ""  # non-empty: a part the workload cannot estimate (then the estimate is a lower bound)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _meminfo(root: str) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    for line in (_read(os.path.join(root, "proc/meminfo")) or "").splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def available_bytes(root: str = "/") -> tuple[int, str] | None:
    """(bytes this process may still take, where that was read): the cgroup's limit less its usage where a
    limit below the host's memory is set (cgroup v2 memory.max, else v1 memory.limit_in_bytes), bounded by
    /proc/meminfo's MemAvailable; None when neither can be read (not Linux)."""
    info = _meminfo(root)
    best = None
    if "MemAvailable" in info:
        best = (info["MemAvailable"], "MemAvailable in /proc/meminfo")
    total = info.get("MemTotal")
    for limit_file, usage_file, name in (
            ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current", "cgroup memory.max"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "sys/fs/cgroup/memory/memory.usage_in_bytes",
             "cgroup memory.limit_in_bytes")):
        limit = _read(os.path.join(root, limit_file))
        if limit is None or not limit.isdigit():  # absent, or "max": no limit
            continue
        # v1 reports "no limit" as a huge number; a limit at or above the host's memory changes nothing.
        if total is not None and int(limit) >= total:
            break
        usage = _read(os.path.join(root, usage_file))
        left = int(limit) - (int(usage) if usage and usage.isdigit() else 0)
        if best is None or left < best[0]:
            best = (max(left, 0), f"{name} {int(limit) / GIB:.1f} GiB less its usage")
        break
    return best


def whole_copies(cfg: Any, runtime: Any) -> int:
    """Replicas on this host that each hold every variable whole (weights, gradients, slots)."""
    if cfg.runtime.kind == "mesh":
        return 1 if cfg.runtime.fsdp else max(1, runtime.num_replicas // runtime.num_hosts)
    return max(1, runtime.num_replicas // runtime.num_hosts)


def estimate(cfg: Any, runtime: Any) -> Estimate | None:
    """The train step's peak host memory on this host; None for a workload without a cost module."""
    declared = cfg.cost_model
    if declared is None:
        return None
    cost = declared.model_cost(cfg)
    params = cost.params
    copies = whole_copies(cfg, runtime)
    parts = {
        "weights": (params * FLOAT32 + cost.frozen_bytes) * copies,
        "gradients": params * FLOAT32 * copies,
        "optimizer slots": params * FLOAT32 * OPTIMIZER_SLOTS * copies,
        "warm-up copy": params * FLOAT32 * (1 + OPTIMIZER_SLOTS) + cost.frozen_bytes,
        "runtime": RUNTIME_ALLOWANCE,
    }
    s = cfg.schedule
    rows = s.global_batch_size // max(1, s.gradient_accumulation_steps) // runtime.num_hosts
    activations = declared.train_activation_bytes
    if activations is None:
        return Estimate(parts, unknown=f"activations ({cfg.workload} does not estimate them)")
    parts["activations"] = int(activations(cfg, rows))
    return Estimate(parts)


def check(cfg: Any, runtime: Any) -> Estimate | None:
    """Refuses (HarnessError, one line) a run on the host CPU whose estimate exceeds the memory available;
    the estimate made, or None where nothing was checked (not on the CPU, `runtime.host_memory_check:
    false`, no cost module, memory unreadable)."""
    if runtime.device_type != "CPU" or not cfg.runtime.host_memory_check:
        return None
    found = estimate(cfg, runtime)
    have = available_bytes()
    if found is None or have is None:
        return None
    if found.total > have[0]:
        largest = sorted(found.parts.items(), key=lambda kv: -kv[1])[:3]
        raise HarnessError(
            f"this run needs about {found.total / GIB:.1f} GiB of host memory (largest parts: "
            f"{', '.join(f'{k} {v / GIB:.1f} GiB' for k, v in largest)}; method: docs/running.md) but "
            f"{have[0] / GIB:.1f} GiB are available ({have[1]}); use a smaller schedule.global_batch_size, "
            f"data.seq_length or model size, model.remat where the workload has it, or "
            f"--set runtime.host_memory_check=false to run anyway")
    return found
