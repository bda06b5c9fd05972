"""Collective times from bytes, participants and the topology's algorithm (bandwidth + latency terms).

Ring all-reduce: reduce-scatter then all-gather, each moving (n-1)/n of the bytes through every link in
2(n-1) latency-bound steps. Torus: the same ring along each dimension in turn over both directions of
its links, each dimension working on the shard the previous one left (so the first dimension dominates).
Hierarchical (GPU clusters): ring reduce-scatter inside a scale-up domain (a node's NVLink or Infinity
Fabric, a GB200/GB300 NVL72 rack's 72 GPUs), ring all-reduce of each GPU's shard between domains over its own
NIC, ring all-gather inside the domain. A chip count that is no whole number of domains (512 GPUs of 72-GPU
racks) is taken as equal groups of its largest divisor that fits a domain (8 racks of 64). A torus beyond its
scale-up domain (a TPU pod) does the same with the torus inside and the data-center network between.

All-to-all (experts split over an axis): every member sends 1/n of its bytes to each member. Inside a domain
at the scale-up bandwidth, to other domains at the scale-out one, both at once (the slower sets the time); on
a torus each dimension's bidirectional ring carries k/8 of a member's bytes per link (mean distance k/4 over
2 directions), bounded below by what the chip's links can inject.
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


def domain_group(system: System, n: int, stride: int = 1) -> int:
    """Members of an `n`-member group (spaced `stride` chips apart) that share one scale-up domain: the largest
    divisor of n that fits the domain's domain // stride chips (1: every member in a domain of its own)."""
    fit = system.domain // stride if stride < system.domain else 1
    return max(d for d in range(1, min(n, max(1, fit)) + 1) if n % d == 0)


def _torus_rank(system: System) -> int:
    return 2 if system.topology == "torus2d" else 3


def allreduce_seconds(system: System, nbytes: float, n: int, stride: int = 1) -> float:
    """All-reduce of `nbytes` per member among `n` members spaced `stride` chips apart (stride = the model
    axis: the data-parallel group of a model-parallel layout skips over the model group's chips)."""
    if n <= 1:
        return 0.0
    if system.topology == "hierarchical":
        per_host = domain_group(system, n, stride)
        if per_host == 1:
            return ring_allreduce(nbytes, n, system.inter_bandwidth, system.inter_latency)
        return hierarchical_allreduce(nbytes, n, per_host, system.intra_bandwidth, system.inter_bandwidth,
                                      system.intra_latency, system.inter_latency)
    if system.topology == "ring":
        return ring_allreduce(nbytes, n, system.link_bandwidth, system.link_latency)
    rank = _torus_rank(system)
    inside = domain_group(system, n, stride)
    if inside < n and system.inter_bandwidth:  # slices joined by the data-center network
        within = torus_allreduce(nbytes, torus_dims(inside, rank), system.link_bandwidth, system.link_latency)
        return within + ring_allreduce(nbytes / inside, n // inside, system.inter_bandwidth, system.inter_latency)
    return torus_allreduce(nbytes, torus_dims(n, rank), system.link_bandwidth, system.link_latency)


def alltoall_seconds(system: System, nbytes: float, n: int, stride: int = 1) -> float:
    """All-to-all of `nbytes` per member (1/n of them to each of `n` members spaced `stride` chips apart;
    the rule in the module docstring)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    inside = domain_group(system, n, stride)
    out_share, in_share = (n - inside) / n, (inside - 1) / n
    if system.topology == "hierarchical":
        t_in = in_share * nbytes / system.intra_bandwidth + (inside - 1) * system.intra_latency if inside > 1 else 0.0
        t_out = out_share * nbytes / system.inter_bandwidth + (n // inside - 1) * system.inter_latency
        return max(t_in, t_out) if out_share else t_in
    if system.topology == "ring":
        return nbytes * n / (8 * system.link_bandwidth) + (n - 1) * system.link_latency
    dims = torus_dims(inside, _torus_rank(system))
    t_in = max(sum(nbytes * k / 8 for k in dims if k > 1) / system.link_bandwidth,
               in_share * nbytes / (max(1, system.links_per_chip) * system.link_bandwidth))
    t_in += sum(k // 2 for k in dims) * system.link_latency
    t_out = out_share * nbytes / system.inter_bandwidth if out_share and system.inter_bandwidth else 0.0
    return max(t_in, t_out)


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
        if m <= system.domain:
            return ring_allreduce(nbytes, m, system.intra_bandwidth, system.intra_latency)
        return hierarchical_allreduce(nbytes, m, domain_group(system, m), system.intra_bandwidth,
                                      system.inter_bandwidth, system.intra_latency, system.inter_latency)
    return ring_allreduce(nbytes, m, 2 * system.link_bandwidth, system.link_latency)


def describe(system: System, n: int) -> str:
    if system.topology == "hierarchical":
        inside = domain_group(system, n)
        return (f"hierarchical: ring in each {inside}-GPU scale-up group ({system.intra_bandwidth / 1e9:g} GB/s), "
                f"ring over {math.ceil(n / inside)} groups ({system.inter_bandwidth / 1e9:g} GB/s per GPU)")
    if system.topology == "ring":
        return f"ring of {n} ({system.link_bandwidth / 1e9:g} GB/s)"
    inside = domain_group(system, n)
    dims = torus_dims(inside, _torus_rank(system))
    out = f"{'x'.join(map(str, dims))} torus, ring per dimension ({system.link_bandwidth / 1e9:g} GB/s per link)"
    if inside < n and system.inter_bandwidth:
        out += f", ring over {n // inside} slices ({system.inter_bandwidth / 1e9:g} GB/s per chip)"
    return out
