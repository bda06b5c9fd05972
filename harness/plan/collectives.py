"""Collective times from bytes, participants and the topology's algorithm (bandwidth + latency terms).

Ring all-reduce: reduce-scatter then all-gather, each moving (n-1)/n of the bytes through every link in
2(n-1) latency-bound steps. Torus: the same ring along each dimension in turn over both directions of
its links, each dimension working on the shard the previous one left (so the first dimension dominates).
Hierarchical (GPU clusters): ring reduce-scatter inside a host over NVLink, ring all-reduce of each GPU's
shard between hosts over its own NIC, ring all-gather inside the host.
"""
from __future__ import annotations

import math

from harness.errors import HarnessError
from harness.plan.system import System


def ring_allreduce(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds to all-reduce `nbytes` over a ring of `n` members, `bandwidth` bytes/s per direction."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def torus_allreduce(nbytes: float, dims: list[int], link_bandwidth: float, latency: float = 0.0) -> float:
    """Dimension by dimension: a bidirectional ring (2 links) per dimension, on a shrinking shard."""
    total, shard = 0.0, float(nbytes)
    for k in dims:
        total += ring_allreduce(shard, k, 2 * link_bandwidth, latency)
        shard /= k
    return total


def hierarchical_allreduce(nbytes: float, n: int, per_host: int, intra_bw: float, inter_bw: float,
                           intra_lat: float = 0.0, inter_lat: float = 0.0) -> float:
    if n <= per_host:
        return ring_allreduce(nbytes, n, intra_bw, intra_lat)
    if n % per_host:
        raise HarnessError(f"{n} GPUs is not a whole number of {per_host}-GPU hosts")
    hosts = n // per_host
    scatter = (per_host - 1) / per_host * nbytes / intra_bw + (per_host - 1) * intra_lat
    return 2 * scatter + ring_allreduce(nbytes / per_host, hosts, inter_bw, inter_lat)


def torus_dims(n: int, rank: int) -> list[int]:
    """The most balanced `rank`-dimensional factorization of n (largest first): the slice shape assumed."""
    if rank == 1 or n == 1:
        return [n] + [1] * (rank - 1)
    best = None
    for a in range(1, int(round(n ** (1 / rank))) + 2):
        if n % a:
            continue
        rest = torus_dims(n // a, rank - 1)
        cand = sorted([a] + rest, reverse=True)
        if best is None or cand[0] < best[0]:
            best = cand
    return best or [n] + [1] * (rank - 1)


def allreduce_seconds(system: System, nbytes: float, n: int, stride: int = 1) -> float:
    """All-reduce of `nbytes` per member among `n` members spaced `stride` chips apart (stride = the model
    axis: the data-parallel group of a model-parallel layout skips over the model group's chips)."""
    if n <= 1:
        return 0.0
    if system.topology == "hierarchical":
        per_host = max(1, system.chips_per_host // stride) if stride < system.chips_per_host else 1
        if per_host == 1:
            return ring_allreduce(nbytes, n, system.inter_bandwidth, system.inter_latency)
        return hierarchical_allreduce(nbytes, n, per_host, system.intra_bandwidth, system.inter_bandwidth,
                                      system.intra_latency, system.inter_latency)
    if system.topology == "ring":
        return ring_allreduce(nbytes, n, system.link_bandwidth, system.link_latency)
    rank = 2 if system.topology == "torus2d" else 3
    return torus_allreduce(nbytes, torus_dims(n, rank), system.link_bandwidth, system.link_latency)


def reduce_scatter_seconds(system: System, nbytes: float, n: int, stride: int = 1) -> float:
    """Reduce-scatter of `nbytes` per member (each keeps 1/n of the sum): the first half of the all-reduce
    above, (n-1)/n of the bytes through every link in half its steps."""
    return allreduce_seconds(system, nbytes, n, stride) / 2


def allgather_seconds(system: System, nbytes: float, n: int, stride: int = 1) -> float:
    """All-gather of `nbytes` in all (each member holds 1/n of them): the second half of the all-reduce."""
    return allreduce_seconds(system, nbytes, n, stride) / 2


def model_group_allreduce_seconds(system: System, nbytes: float, m: int) -> float:
    """An activation all-reduce inside one model-parallel group of m neighbouring chips."""
    if m <= 1:
        return 0.0
    if system.topology == "hierarchical":
        if m <= system.chips_per_host:
            return ring_allreduce(nbytes, m, system.intra_bandwidth, system.intra_latency)
        return hierarchical_allreduce(nbytes, m, system.chips_per_host, system.intra_bandwidth,
                                      system.inter_bandwidth, system.intra_latency, system.inter_latency)
    return ring_allreduce(nbytes, m, 2 * system.link_bandwidth, system.link_latency)


def describe(system: System, n: int) -> str:
    if system.topology == "hierarchical":
        hosts = math.ceil(n / system.chips_per_host)
        return (f"hierarchical: ring in host over NVLink ({system.intra_bandwidth / 1e9:g} GB/s), ring over "
                f"{hosts} hosts ({system.inter_bandwidth / 1e9:g} GB/s per GPU)")
    if system.topology == "ring":
        return f"ring of {n} ({system.link_bandwidth / 1e9:g} GB/s)"
    dims = torus_dims(n, 2 if system.topology == "torus2d" else 3)
    return f"{'x'.join(map(str, dims))} torus, ring per dimension ({system.link_bandwidth / 1e9:g} GB/s per link)"
