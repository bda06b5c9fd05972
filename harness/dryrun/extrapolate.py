"""A model too big to build on this host, reported from compiles at small values of the config keys it is
linear in (`Workload.DRY_RUN_LINEAR`, `DRY_RUN_PAIRS`), and a step of many accumulated micro-batches from
compiles with one and two."""
from __future__ import annotations

import dataclasses
from typing import Any

from harness import config as config_lib
from harness.dryrun import apart
from harness.dryrun.compile import useful_train_flops
from harness.dryrun.memory import host_memory_bytes
from harness.dryrun.report import CompileReport
from harness.train.reference import lookup

# The report's numbers that grow linearly with a layer count or a vocabulary size.
_LINEAR_FIELDS = ("params", "replica_params", "train_flops_per_replica_step", "eval_flops_per_replica_step",
                  "weight_bytes_per_device", "optimizer_bytes_per_device", "gradient_bytes",
                  "gradient_bytes_per_device", "activation_bytes_per_device", "peak_bytes_per_device",
                  "eval_peak_bytes_per_device", "fsdp_saved_bytes_per_device", "fsdp_replicated_bytes")


def linear_stand_in(config_path: str, overrides: list[str], optimize: bool, cfg: config_lib.Config,
                    sizes: dict[str, tuple[int, int]],
                    pairs: tuple[tuple[str, str], ...] = ()) -> CompileReport:
    """The report of a model too big to build here, from compiles at small values of the config keys it is
    linear in (`sizes`: key -> (a, b)): one at every key's `a`, one per key at its `b`, and one per `pairs`
    entry with both keys at `b` (keys whose effects multiply, e.g. layers x experts per layer). Each number is
    extrapolated as base + sum over keys of f_k x (its change from a to b) + sum over pairs of f_i x f_j x
    (the pair's change beyond the two single changes), f_k = (full value - a) / (b - a). Exact for
    parameters, FLOPs and bytes of weights, gradients and optimizer state; the activation and peak memory
    estimates assume XLA's plan grows so too."""
    def compiled(extra: list[str]) -> CompileReport:
        return apart.compile_small(config_path, overrides + extra, optimize, cfg)

    base = [f"{k}={a}" for k, (a, _) in sizes.items()]
    r0 = compiled(base)
    slopes: dict[str, list[tuple[float, Any]]] = {}
    seconds = dict(r0.compile_seconds)
    for key, (a, b) in sizes.items():
        rk = compiled([x for x in base if not x.startswith(key + "=")] + [f"{key}={b}"])
        seconds = {w: seconds[w] + rk.compile_seconds[w] for w in seconds}
        slopes[key] = [((lookup(cfg, key) - a) / (b - a), rk)]
    cross = []
    for ki, kj in pairs:
        rij = compiled([x for x in base if not x.startswith((ki + "=", kj + "="))]
                       + [f"{ki}={sizes[ki][1]}", f"{kj}={sizes[kj][1]}"])
        seconds = {w: seconds[w] + rij.compile_seconds[w] for w in seconds}
        cross.append((slopes[ki][0][0] * slopes[kj][0][0], slopes[ki][0][1], slopes[kj][0][1], rij))
    values = {}
    for name in _LINEAR_FIELDS:
        v0 = getattr(r0, name)
        if v0 is None:
            values[name] = None
            continue
        total = v0 + sum(f * (getattr(rk, name) - v0) for pts in slopes.values() for f, rk in pts)
        total += sum(f * (getattr(rij, name) - getattr(ri, name) - getattr(rj, name) + v0)
                     for f, ri, rj, rij in cross)
        values[name] = type(v0)(round(total)) if isinstance(v0, int) else float(total)
    built = ", ".join(f"{k}={a} and {b}" for k, (a, b) in sizes.items())
    full = ", ".join(f"{k}={lookup(cfg, k)}" for k in sizes)
    both = "".join(f", {i} and {j} together at {sizes[i][1]} and {sizes[j][1]}" for i, j in pairs)
    note = (f"model: too big to build on this host ({host_memory_bytes() / 2**30:.0f} GiB), so it was compiled "
            f"{len(sizes) + 1 + len(pairs)} times at {built}{both} (everything else full size) and each number "
            f"extrapolated to {full} ({'bi' if pairs else ''}linearly); activations and peaks assume XLA's plan "
            f"grows so too")
    return dataclasses.replace(
        r0, **values, config=config_path, compile_seconds={w: round(v, 2) for w, v in seconds.items()},
        useful_train_flops_per_replica_step=useful_train_flops(cfg, r0.per_replica_batch),
        stand_in=[note] + r0.stand_in)


def micro_batched_stand_in(config_path: str, overrides: list[str], optimize: bool, cfg: config_lib.Config,
                           sizes: dict[str, tuple[int, int]],
                           pairs: tuple[tuple[str, str], ...] = ()) -> CompileReport:
    """`linear_stand_in` for a step of many accumulated micro-batches, which the loop unrolls (one copy of the
    forward and backward pass per micro-batch: too long to compile at 64): compiled with 1 micro-batch (trace
    only: its FLOPs) and with 2, each of the real per-replica rows. A step's FLOPs are the optimizer's plus
    its micro-batches' (1 + (k - 1) x the difference); its memory is the 2-micro-batch step's (one
    micro-batch's activations live at a time beside the accumulated gradients, whatever k)."""
    schedule = cfg.schedule
    k = schedule.gradient_accumulation_steps
    rows = schedule.global_batch_size // k
    pinned = overrides + [f"schedule.eval_batch_size={schedule.eval_batch_size or schedule.global_batch_size}"]
    one = linear_stand_in(config_path, pinned + [f"schedule.global_batch_size={rows}",
                                                 "schedule.gradient_accumulation_steps=1"], False, cfg, sizes, pairs)
    two = linear_stand_in(config_path, pinned + [f"schedule.global_batch_size={2 * rows}",
                                                 "schedule.gradient_accumulation_steps=2"], optimize, cfg, sizes, pairs)
    per_replica = schedule.global_batch_size // two.replicas
    flops = one.train_flops_per_replica_step + (k - 1) * (two.train_flops_per_replica_step
                                                          - one.train_flops_per_replica_step)
    note = (f"train step: {k} accumulated micro-batches of {per_replica // k} row(s) per replica, compiled with 1 "
            f"(FLOPs only) and 2: FLOPs = the 1-micro-batch step's + {k - 1} x the second micro-batch's; memory "
            f"the 2-micro-batch step's")
    return dataclasses.replace(
        two, per_replica_batch=per_replica, global_batch=schedule.global_batch_size, train_flops_per_replica_step=flops,
        useful_train_flops_per_replica_step=useful_train_flops(cfg, per_replica),
        compile_seconds={w: round(one.compile_seconds[w] + two.compile_seconds[w], 2) for w in two.compile_seconds},
        stand_in=[note] + [n for n in two.stand_in if not n.startswith("train step: ")])
