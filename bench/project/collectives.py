"""Alpha-beta cost of one all-reduce of S bytes on n ranks of a Network (docs/design.md "Projection").

With g ranks per node, N nodes, B_i = intra B(S), B_n = inter B(S), α = per-step latency, base = fixed:

    ring          base + (2(n−1) − 2(N−1))·α_i + 2(N−1)·α_n  +  2(n−1)/n · S / B,   B = B_i if N = 1
                                                                                  else min(B_i, c·B_n)
    tree          base + 2·((g−1)·α_i + log2(N)·α_n)        +  2·S / (0.92·B)      (N = 1: 2(n−1)·α_i)
    hierarchical  reduce-scatter in the node, ring all-reduce of S/g between nodes, all-gather in the node:
                  2·(base_i + (g−1)·α_i) + base_n + 2(N−1)·α_n + 2(g−1)/g · S/B_i
                  + 2(N−1)/N · (S/g)/(c·B_n/g)
    all-gather,   (FSDP) NCCL's ring, S the whole (unsharded) buffer: half an all-reduce's steps and bytes,
    reduce-scatter  base + ((n−1) − (N−1))·α_i + (N−1)·α_n + (n−1)/n · S / B   (B as the ring's)

c = NICs per node (Network.nics_per_node; g when every GPU has its own), so c·B_n is what a node moves.

The ring's bandwidth term is nccl-tests' all-reduce bound (PERFORMANCE.md: t = S/B · 2(n−1)/n); its latency
and the tree's are NCCL's (tuning.cc: ring `(nsteps − nInterSteps)·intraLat + nInterSteps·interLat`, tree
`2·((nRanks/nNodes − 1)·intraLat + log2i(nNodes)·interLat)`, tree algbw = busbw·0.92·0.5). `auto` takes the
cheapest of the three per message, as NCCL's tuner takes the fastest algorithm per size.
One rank has nothing to reduce: cost 0. All-gather and reduce-scatter are nccl-tests' bounds too
(PERFORMANCE.md: busbw = algbw·(n−1)/n for both), on the all-reduce's bus bandwidth; NCCL runs them as
rings (tuning.cc: `nsteps = nRanks − 1` for them, against 2(nRanks − 1) for the all-reduce).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.project.network import Network

ALGORITHMS = ("auto", "ring", "tree", "hierarchical")
TREE_BW_FACTOR = 0.92  # tuning.cc: `if (a == NCCL_ALGO_TREE && coll == ncclFuncAllReduce) busBw *= .92`


@dataclass(frozen=True)
class Cost:
    """One all-reduce: its latency part and its bandwidth part (µs), and the algorithm that gave them."""

    latency_us: float
    bandwidth_us: float
    algorithm: str

    @property
    def total_us(self) -> float:
        return self.latency_us + self.bandwidth_us


NONE = Cost(0.0, 0.0, "none")


def _bus_gbps(net: Network, size: float, n: int, nodes: int) -> float:
    """The busbw the slowest hop allows: the node's fabric, or its NICs together once nodes are involved."""
    intra = net.intra_at(n).bandwidth_gbps(size)
    if nodes == 1:
        return intra
    return min(intra, net.node_inter_gbps(size))


def _us(size: float, gbps: float) -> float:
    return size / (gbps * 1e3)  # bytes / (GB/s) → µs


def ring(net: Network, size: float, n: int) -> Cost:
    """Ring all-reduce (see module docstring)."""
    nodes = net.nodes(n)
    intra = net.intra_at(n)
    fabric = intra if nodes == 1 else net.inter
    inter_steps = 2 * (nodes - 1)
    latency = fabric.base_us + (2 * (n - 1) - inter_steps) * intra.hop_us + inter_steps * net.inter.hop_us
    return Cost(latency, 2 * (n - 1) / n * _us(size, _bus_gbps(net, size, n, nodes)), "ring")


def tree(net: Network, size: float, n: int) -> Cost:
    """NCCL's tree all-reduce: a chain inside each node, a (double binary) tree between nodes."""
    nodes = net.nodes(n)
    if nodes == 1:
        latency = net.intra_at(n).tree_base_us + 2 * (n - 1) * net.intra_at(n).tree_hop_us
    else:
        per_node = n // nodes
        latency = net.inter.tree_base_us + 2 * ((per_node - 1) * net.intra.tree_hop_us
                                                + math.floor(math.log2(nodes)) * net.inter.tree_hop_us)
    return Cost(latency, 2 * _us(size, TREE_BW_FACTOR * _bus_gbps(net, size, n, nodes)), "tree")


def hierarchical(net: Network, size: float, n: int) -> Cost:
    """Reduce-scatter inside the node, ring all-reduce of each GPU's S/g shard between nodes over its own
    NIC, all-gather inside the node. One node: the ring."""
    nodes = net.nodes(n)
    if nodes == 1:
        return Cost(*_parts(ring(net, size, n)), "hierarchical")
    g = n // nodes
    shard = size / g
    latency = (2 * (net.intra.base_us + (g - 1) * net.intra.hop_us)
               + net.inter.base_us + 2 * (nodes - 1) * net.inter.hop_us)
    per_gpu_inter = net.node_inter_gbps(shard) / g  # each GPU's share of its node's NICs
    bandwidth = (2 * (g - 1) / g * _us(size, net.intra.bandwidth_gbps(size))
                 + 2 * (nodes - 1) / nodes * _us(shard, per_gpu_inter))
    return Cost(latency, bandwidth, "hierarchical")


def _parts(cost: Cost) -> tuple[float, float]:
    return cost.latency_us, cost.bandwidth_us


def allreduce_cost(net: Network, size: float, n: int, algorithm: str = "auto") -> Cost:
    """Cost of one all-reduce of `size` bytes on `n` ranks with `algorithm` (ALGORITHMS)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    if n < 1:
        raise ValueError(f"world size {n} must be >= 1")
    if n == 1:
        return NONE
    if net.ring_only or algorithm == "ring":
        return ring(net, size, n)
    if algorithm == "tree":
        return tree(net, size, n)
    if algorithm == "hierarchical":
        return hierarchical(net, size, n)
    return min((ring(net, size, n), tree(net, size, n), hierarchical(net, size, n)), key=lambda c: c.total_us)


def ring_half(net: Network, size: float, n: int, algorithm: str) -> Cost:
    """A ring all-gather or reduce-scatter of a `size`-byte (unsharded) buffer on n ranks (module
    docstring): one pass of the ring, n − 1 steps, each rank moving (n − 1)/n of the buffer."""
    if n < 1:
        raise ValueError(f"world size {n} must be >= 1")
    if n == 1:
        return NONE
    nodes = net.nodes(n)
    intra = net.intra_at(n)
    fabric = intra if nodes == 1 else net.inter
    inter_steps = nodes - 1
    latency = fabric.base_us + ((n - 1) - inter_steps) * intra.hop_us + inter_steps * net.inter.hop_us
    return Cost(latency, (n - 1) / n * _us(size, _bus_gbps(net, size, n, nodes)), algorithm)


def allgather_cost(net: Network, size: float, n: int) -> Cost:
    """All-gather of a `size`-byte buffer (each rank holds size/n) on n ranks: NCCL's ring."""
    return ring_half(net, size, n, "all_gather")


def reduce_scatter_cost(net: Network, size: float, n: int) -> Cost:
    """Reduce-scatter of a `size`-byte buffer (each rank keeps size/n, reduced) on n ranks: NCCL's ring."""
    return ring_half(net, size, n, "reduce_scatter")
