"""Fabrics (one kind of link, its bandwidth per message size and its latencies) and networks (the fabric
inside a node plus the fabric between nodes), with the sources of every number.

Bandwidths are nccl-tests *bus* bandwidths (NVIDIA/nccl-tests doc/PERFORMANCE.md: busbw = algbw · 2(n−1)/n
for all-reduce), in GB/s (1e9 bytes/s). Latencies are NCCL's own tuning constants (NVIDIA/nccl
src/graph/tuning.cc, `ncclTunerConstantsDefaults`, read at commit 5067397c, June 2026), in µs:

    baseLatencies  Ring: LL 6.6, LL128 14.0, Simple 8.4   Tree: LL 6.8, LL128 14.0, Simple 8.4
    hwLatencies    NVLINK Ring: LL 0.6, LL128 1.9, Simple 3.4   Tree: LL 0.6, LL128 1.25, Simple 4.0
                   NET    Ring: LL 2.7, LL128 4.0, Simple 14.0  Tree: LL 5.0, LL128 8.5,  Simple 14.0

NCCL's ring all-reduce latency is base + (2(n−1) − 2(nodes−1))·intra hop + 2(nodes−1)·network hop; its tree
adds 2·((ranks per node − 1)·intra hop + log2(nodes)·network hop) (same file, `ncclTopoTuneModel`).
Which protocol's constants a fabric uses is said at each preset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

MiB = 2**20
GiB = 2**30

# NCCL tuning.cc constants used below (µs), named by (hardware, algorithm, protocol).
NCCL_BASE_RING_LL, NCCL_BASE_TREE_LL = 6.6, 6.8
NCCL_BASE_SIMPLE = 8.4                      # ring and tree
NCCL_NVLINK_RING_LL, NCCL_NVLINK_TREE_LL = 0.6, 0.6
NCCL_NET_RING_SIMPLE, NCCL_NET_TREE_SIMPLE = 14.0, 14.0


@dataclass(frozen=True)
class Fabric:
    """One kind of link. `points`: (message bytes, busbw GB/s) as published, sorted by size.

    When `ref_ranks` is set, the points are end-to-end nccl-tests measurements at that many ranks, so their
    busbw already contains the latency; the fabric's pure bandwidth B(S) at each point is what is left once
    the ring latency at `ref_ranks` is taken out, so that the model returns the published time exactly at
    the published sizes and rank count. Without `ref_ranks` the points are pure bandwidths. Between points
    B is interpolated linearly in log2(size); beyond them it is held at the end point.
    """

    name: str
    points: tuple[tuple[float, float], ...]
    hop_us: float          # ring: latency per step (a ring all-reduce takes 2(n−1) steps)
    base_us: float         # ring: fixed latency per collective
    tree_hop_us: float
    tree_base_us: float
    source: str
    ref_ranks: int | None = None

    def __post_init__(self):
        if not self.points:
            raise ValueError(f"fabric {self.name!r} has no bandwidth points")
        sizes = [s for s, _ in self.points]
        if sizes != sorted(sizes) or any(s <= 0 or b <= 0 for s, b in self.points):
            raise ValueError(f"fabric {self.name!r}: points must be positive and sorted by size: "
                             f"{self.points}")
        if min(self.hop_us, self.base_us, self.tree_hop_us, self.tree_base_us) < 0:
            raise ValueError(f"fabric {self.name!r}: latencies must be >= 0")
        object.__setattr__(self, "_pure", tuple(self._pure_point(s, b) for s, b in self.points))

    def _pure_point(self, size: float, busbw_gbps: float) -> tuple[float, float]:
        """(log2 size, pure bandwidth GB/s) for one published point."""
        if self.ref_ranks is None:
            return math.log2(size), busbw_gbps
        r = self.ref_ranks
        factor = 2 * (r - 1) / r
        measured_us = factor * size / (busbw_gbps * 1e3)  # bytes / (GB/s · 1e3) = µs
        latency_us = self.base_us + 2 * (r - 1) * self.hop_us
        if measured_us <= latency_us:
            raise ValueError(f"fabric {self.name!r}: {busbw_gbps} GB/s at {size:.0f} B on {r} ranks is "
                             f"{measured_us:.1f} µs, not more than the ring latency {latency_us:.1f} µs")
        return math.log2(size), factor * size / ((measured_us - latency_us) * 1e3)

    def bandwidth_gbps(self, size_bytes: float) -> float:
        """Pure bus bandwidth B(S) in GB/s for a message of `size_bytes` (log-size interpolation)."""
        pure = self._pure  # type: ignore[attr-defined]
        x = math.log2(max(size_bytes, 1.0))
        if x <= pure[0][0]:
            return pure[0][1]
        for (x0, b0), (x1, b1) in zip(pure, pure[1:]):
            if x <= x1:
                return b0 + (b1 - b0) * (x - x0) / (x1 - x0)
        return pure[-1][1]


def flat_fabric(name: str, busbw_gbps: float, latency_us: float, source: str) -> Fabric:
    """A fabric of one bandwidth and one per-step latency (ring and tree alike), no fixed latency."""
    return Fabric(name, ((1.0, busbw_gbps),), hop_us=latency_us, base_us=0.0, tree_hop_us=latency_us,
                  tree_base_us=0.0, source=source)


# NVLink presets: the intra-node busbw per message size quoted in issue 13 from nccl-tests all_reduce_perf on
# 8-GPU NVSwitch systems. H100's large-message end is NVLink SHARP (NVLS): NCCL's maintainer gives "a peak
# busBw of ~480GB/s (algbw ~275GB/s)" on 8 H100 (NVIDIA/nccl-tests#212). Latencies: NCCL's LL protocol
# constants, the protocol NCCL runs small messages with; the published 1 MiB points (46 µs on H100, 102 µs
# on A100 at 8 ranks) leave room for LL's 15 µs ring latency, but not for Simple's 56 µs.
_NVLINK_LATENCIES = dict(hop_us=NCCL_NVLINK_RING_LL, base_us=NCCL_BASE_RING_LL,
                         tree_hop_us=NCCL_NVLINK_TREE_LL, tree_base_us=NCCL_BASE_TREE_LL)
H100_NVLINK = Fabric(
    "h100-nvlink", ((MiB, 40.0), (16 * MiB, 220.0), (GiB, 460.0)), ref_ranks=8, **_NVLINK_LATENCIES,
    source="8×H100/H200 NVLink 4 (NVSwitch), nccl-tests all_reduce busbw ≈40 GB/s at 1 MiB, ≈220 at 16 MiB, "
           "≈460 at 1 GiB (issue 13; NVIDIA/nccl-tests#212); latencies: NCCL tuning.cc NVLink LL",
)
A100_NVLINK = Fabric(
    "a100-nvlink", ((MiB, 18.0), (16 * MiB, 106.0), (GiB, 229.0)), ref_ranks=8, **_NVLINK_LATENCIES,
    source="8×A100 NVLink 3 (NVSwitch), nccl-tests all_reduce busbw ≈18 GB/s at 1 MiB, ≈106 at 16 MiB, "
           "≈229 at 1 GiB (issue 13); latencies: NCCL tuning.cc NVLink LL",
)
# Network presets: one busbw for every size (no per-size source), NCCL's NET Simple-protocol latencies (the
# protocol for the MiB-sized buckets DDP sends; NCCL's LL figure, 2.7 µs per ring step, is lower but is
# only used for small messages). NCCL sets no extra latency for IB or sockets (`props->latency = 0`).
_NET_LATENCIES = dict(hop_us=NCCL_NET_RING_SIMPLE, base_us=NCCL_BASE_SIMPLE,
                      tree_hop_us=NCCL_NET_TREE_SIMPLE, tree_base_us=NCCL_BASE_SIMPLE)
IB_NDR400 = Fabric(
    "ib-ndr400", ((1.0, 47.0),), **_NET_LATENCIES,
    source="InfiniBand NDR 400 Gb/s (50 GB/s line rate), nccl-tests busbw ≈46–48 GB/s per NIC (issue 13); "
           "latencies: NCCL tuning.cc NET Simple",
)
# 100 GbE: 12.5 GB/s line rate × 0.94, the fraction of line rate NDR's published busbw reaches (47 / 50).
# An assumption, not a measurement: TCP sockets usually reach less; prefer `measured` or --bw-gbps.
IB_TO_LINE = 47.0 / 50.0
ETH_100G = Fabric(
    "eth-100g", ((1.0, 12.5 * IB_TO_LINE),), **_NET_LATENCIES,
    source="100 Gb Ethernet: 12.5 GB/s line rate × 0.94 (NDR's busbw/line ratio; an assumption); "
           "latencies: NCCL tuning.cc NET Simple",
)


def line_fabric(name: str, gbit_per_s: float, what: str) -> Fabric:
    """A NIC of `gbit_per_s` line rate: busbw = line rate (Gb/s ÷ 8 = GB/s) × IB_TO_LINE, the fraction of
    line rate NDR's published busbw reaches (no per-fabric table is at hand for the older links), with
    NCCL's NET Simple latencies."""
    if not gbit_per_s > 0:
        raise ValueError(f"fabric {name!r}: line rate {gbit_per_s} Gb/s must be > 0")
    return Fabric(name, ((1.0, gbit_per_s / 8 * IB_TO_LINE),), **_NET_LATENCIES,
                  source=f"{what}: {gbit_per_s:g} Gb/s line rate ({gbit_per_s / 8:g} GB/s) × {IB_TO_LINE} "
                         f"(NDR's busbw/line ratio); latencies: NCCL tuning.cc NET Simple")


# The inter-node fabrics of NVIDIA's DGX reference configurations (one ConnectX NIC per port): HDR 200 Gb/s
# (DGX A100 data sheet: 8 × ConnectX-6 200 Gb/s compute ports), EDR 100 Gb/s (DGX-1: 4 × EDR; DGX-2/2H:
# 8 × EDR, their data sheets). RoCE at a stated rate is the same Ethernet link rate (RoCE v2 carries NCCL's
# IB verbs over it; the NDR ratio is assumed for it too).
IB_HDR200 = line_fabric("ib-hdr200", 200.0, "InfiniBand HDR 200 Gb/s (DGX A100 compute port)")
IB_EDR100 = line_fabric("ib-edr100", 100.0, "InfiniBand EDR 100 Gb/s (DGX-1, DGX-2/2H)")

# Systems without a published busbw table of their own: bus bandwidth = link rate per direction × an
# efficiency measured on a system that has one. NVLink: A100's 229 GB/s busbw (above) over its 12 NVLink 3
# links × 25 GB/s = 300 GB/s per direction (NVIDIA A100 datasheet) gives NVLINK_EFFICIENCY = 0.763.
# PCIe: x16 payload rate per direction (PCI-SIG: 8 / 16 / 32 GT/s per lane with 128b/130b encoding =
# 15.75 / 31.5 / 63 GB/s for gen 3 / 4 / 5) × PCIE_EFFICIENCY, the fraction of it a DMA stream of 256 B
# TLPs carries after headers and flow control (≈ 0.8; PCI-SIG's TLP overhead of 20–26 B per 256 B
# payload), times the fraction left when a ring's every hop crosses the host bridge. These systems run
# NCCL's Simple protocol for MiB-sized buckets: ring latency base 8.4 µs + per step 5.7 µs (PCI) or 3.4 µs
# (NVLink), NCCL 2.x tuning.cc `hwLat` (the NCCL of the 2019–2022 NGC containers the tables were made
# with).
NVLINK_EFFICIENCY = 229.0 / 300.0
PCIE_EFFICIENCY = 0.8
PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0}
NCCL_PCI_RING_SIMPLE, NCCL_NVLINK_RING_SIMPLE = 5.7, 3.4
_PCI_LATENCIES = dict(hop_us=NCCL_PCI_RING_SIMPLE, base_us=NCCL_BASE_SIMPLE,
                      tree_hop_us=NCCL_PCI_RING_SIMPLE, tree_base_us=NCCL_BASE_SIMPLE)
_NVLINK_SIMPLE = dict(hop_us=NCCL_NVLINK_RING_SIMPLE, base_us=NCCL_BASE_SIMPLE,
                      tree_hop_us=NCCL_NVLINK_RING_SIMPLE, tree_base_us=NCCL_BASE_SIMPLE)


def _nvlink(name: str, links: int, gbps_per_link: float, what: str) -> Fabric:
    per_direction = links * gbps_per_link
    return Fabric(name, ((1.0, per_direction * NVLINK_EFFICIENCY),), **_NVLINK_SIMPLE,
                  source=f"{what}: {links} links × {gbps_per_link:g} GB/s = {per_direction:g} GB/s per "
                         f"direction × {NVLINK_EFFICIENCY:.3f} (A100's busbw/link rate); NCCL NVLink Simple "
                         f"latencies")


def _pcie(gen: int) -> Fabric:
    rate = PCIE_X16_GBPS[gen]
    return Fabric(f"pcie{gen}", ((1.0, rate * PCIE_EFFICIENCY),), **_PCI_LATENCIES,
                  source=f"PCIe gen {gen} x16: {rate:g} GB/s per direction (PCI-SIG) × {PCIE_EFFICIENCY} "
                         f"(TLP overhead); NCCL PCI Simple latencies")


# DGX-1 V100: 6 NVLink 2 links per GPU (25 GB/s per direction each) in a hybrid cube mesh; NCCL builds its
# rings over all six (NVIDIA DGX-1 with Tesla V100 system architecture white paper, 2017).
V100_DGX1 = _nvlink("v100-dgx1", 6, 25.0, "DGX-1 V100 NVLink 2 hybrid cube mesh")
# DGX-2: each V100's 6 NVLink 2 links go to the NVSwitch planes, 150 GB/s per direction to any GPU (NVIDIA
# DGX-2 data sheet: 2.4 TB/s bisection for 16 GPUs).
V100_DGX2 = _nvlink("v100-dgx2", 6, 25.0, "DGX-2 V100 NVLink 2 through NVSwitch")
# B200: 18 NVLink 5 links, 1.8 TB/s per GPU both directions = 900 GB/s per direction (NVIDIA HGX B200
# data sheet).
B200_NVLINK = _nvlink("b200-nvlink", 18, 50.0, "HGX B200 NVLink 5 (NVSwitch)")
# Turing NVLink bridge: two NVLink 2 links between a pair of RTX 2080 Ti / Quadro RTX 8000 (NVIDIA Turing
# architecture white paper: 2 × 25 GB/s per direction, "100 GB/s bidirectional").
NVLINK_BRIDGE = _nvlink("nvlink-bridge", 2, 25.0, "Turing NVLink bridge between a pair")
PCIE3, PCIE4, PCIE5 = _pcie(3), _pcie(4), _pcie(5)
# Intel Gaudi: 21 on-chip RoCE ports per accelerator connect it all-to-all to the 7 others of its box, 3 per
# peer (Intel Gaudi docs, "Network Configuration": Gaudi 3's 21 × 200 Gb/s = 525 GB/s per direction).
# HCCL's all-reduce on 8 Gaudi 3 measured 512.96 GB/s bus bandwidth at 256 MiB (Intel Gaudi docs,
# "Collectives Performance"): 0.977 of the 525. Gaudi 2 has the same layout at 100 Gb/s per port (21 ×
# 12.5 = 262.5 GB/s); Gaudi 3's measured ratio is assumed for it. Latencies: NCCL's NET Simple constants
# (RoCE; HCCL publishes none).
GAUDI_EFFICIENCY = 512.96 / 525.0
GAUDI3 = Fabric("gaudi3", ((1.0, 512.96),), **_NET_LATENCIES,
                source="8× Gaudi 3, 21 × 200 Gb/s RoCE all-to-all: HCCL all_reduce busbw 512.96 GB/s at "
                       "256 MiB (Intel Gaudi docs); latencies: NCCL NET Simple")
GAUDI2 = Fabric("gaudi2", ((1.0, 21 * 12.5 * GAUDI_EFFICIENCY),), **_NET_LATENCIES,
                source=f"8× Gaudi 2, 21 × 100 Gb/s RoCE all-to-all = 262.5 GB/s × {GAUDI_EFFICIENCY:.3f} "
                       f"(Gaudi 3's measured busbw/peak); latencies: NCCL NET Simple")
# AMD Instinct MI300X: 7 Infinity Fabric links per GPU to the 7 others of an 8-GPU platform, 64 GB/s per
# direction each (AMD Instinct MI300X data sheet: 128 GB/s bidirectional per link) = 448 GB/s; NVLink's
# busbw/link-rate efficiency is assumed (no published RCCL table at hand).
MI300X = _nvlink("mi300x", 7, 64.0, "AMD Instinct MI300X Infinity Fabric, fully connected 8 GPUs")
FABRICS = {f.name: f for f in (H100_NVLINK, A100_NVLINK, V100_DGX1, V100_DGX2, B200_NVLINK, PCIE3, PCIE4,
                               PCIE5, NVLINK_BRIDGE, GAUDI2, GAUDI3, MI300X, IB_NDR400, IB_HDR200, IB_EDR100,
                               ETH_100G)}
# NVLink bridges join GPUs in pairs: two ranks talk over the bridge, a ring through more crosses PCIe.
BRIDGED = {"nvlink-bridge": "pcie3"}
# fabrics that can connect nodes (--inter-network)
INTER_NODE = ("ib-ndr400", "ib-hdr200", "ib-edr100", "eth-100g")


@dataclass(frozen=True)
class Network:
    """Where ranks sit and what connects them.

    Ranks fill nodes of `gpus_per_node`; inside a node they share `intra`, between nodes the node has
    `nics_per_node` NICs of `inter` (None: one per GPU, rail-optimised nodes such as DGX A100/H100), so a
    node moves nics_per_node × B_inter and each GPU's share of it is that over gpus_per_node (DGX-1: 4 NICs
    for 8 GPUs). A flat network (`gpus_per_node` = 1) puts every rank behind its own link of one fabric.
    `ring_only`: the fabric was fitted to one algorithm's measured times (the run's probe), so only the ring
    form is defined.
    """

    name: str
    intra: Fabric
    inter: Fabric
    gpus_per_node: int
    ring_only: bool = False
    pair: Fabric | None = None   # the fabric of exactly two ranks when it differs (NVLink bridges)
    nics_per_node: int | None = None
    # relative error of the bus bandwidth (the fit's RMS residual for the measured network; 0: a preset,
    # whose error the projection's model-error band carries)
    bandwidth_rel_error: float = 0.0

    def node_inter_gbps(self, size: float) -> float:
        """What one node's NICs move together between nodes (GB/s) for messages of `size` bytes."""
        nics = self.gpus_per_node if self.nics_per_node is None else self.nics_per_node
        return nics * self.inter.bandwidth_gbps(size)

    def intra_at(self, n: int) -> Fabric:
        """The fabric inside a node for a collective over n ranks."""
        return self.pair if self.pair is not None and n == 2 else self.intra

    def __post_init__(self):
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node={self.gpus_per_node} must be >= 1")
        if self.nics_per_node is not None and self.nics_per_node < 1:
            raise ValueError(f"nics_per_node={self.nics_per_node} must be >= 1")

    def nodes(self, n: int) -> int:
        """Nodes that n ranks fill; n above a node must fill whole nodes."""
        g = self.gpus_per_node
        if n <= g:
            return 1
        if n % g:
            raise ValueError(f"world size {n} is not a multiple of gpus_per_node={g}")
        return n // g

    @property
    def label(self) -> str:
        if self.gpus_per_node == 1:
            return self.name
        nics = "" if self.nics_per_node is None else f"{self.nics_per_node}× "
        return f"{self.name} (+{nics}{self.inter.name} between nodes)"


def preset_network(name: str, gpus_per_node: int = 8, inter_name: str | Fabric = "ib-ndr400",
                   nics_per_node: int | None = None) -> Network:
    """The network of a preset: an NVLink preset inside nodes of `gpus_per_node` with `inter_name` between
    them (a preset name or a Fabric; `nics_per_node` NICs per node, None: one per GPU); a network preset
    flat (every rank on its own NIC). KeyError names an unknown preset."""
    if name not in FABRICS:
        raise KeyError(name)
    fabric = FABRICS[name]
    if name in INTER_NODE:
        return Network(name, fabric, fabric, gpus_per_node=1)
    inter = FABRICS[inter_name] if isinstance(inter_name, str) else inter_name
    if name in BRIDGED:
        return Network(name, FABRICS[BRIDGED[name]], inter, gpus_per_node=gpus_per_node, pair=fabric,
                       nics_per_node=nics_per_node)
    return Network(name, fabric, inter, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node)


def flat_note(name: str, gpus_per_node: int | None) -> str:
    """What a user who gave --gpus-per-node with a network preset (flat: every GPU on its own NIC, no
    NVLink inside a node, so the flag does not apply) should know; '' when it applies or was not given."""
    if gpus_per_node is None or gpus_per_node == 1 or name not in INTER_NODE:
        return ""
    return (f"note: --gpus-per-node {gpus_per_node} does not apply to --network {name}: a network preset "
            f"alone is flat (every GPU on its own NIC, no NVLink inside a node). For nodes of "
            f"{gpus_per_node} GPUs joined by {name}, name the GPUs' preset: --network h100-nvlink "
            f"--inter-network {name} --gpus-per-node {gpus_per_node}")


def custom_network(bw_gbps: float, latency_us: float) -> Network:
    """--bw-gbps/--latency-us: a flat network, busbw `bw_gbps` at every size, `latency_us` per ring step."""
    if not 0 < bw_gbps < math.inf:
        raise ValueError(f"--bw-gbps={bw_gbps} must be > 0 and finite")
    if not 0 <= latency_us < math.inf:
        raise ValueError(f"--latency-us={latency_us} must be >= 0 and finite")
    fabric = flat_fabric("custom", bw_gbps, latency_us,
                         f"--bw-gbps {bw_gbps:g} --latency-us {latency_us:g} (latency per ring step)")
    return Network("custom", fabric, fabric, gpus_per_node=1)


def scaled_fabric(fabric: Fabric, factor: float) -> Fabric:
    """`fabric` with every published busbw × factor (latencies unchanged)."""
    return replace(fabric, name=f"{fabric.name}×{factor:.3g}",
                   points=tuple((size, busbw * factor) for size, busbw in fabric.points))


def scaled_network(net: Network, factor: float) -> Network:
    """`net` with every fabric's bandwidth × factor: what a busbw off by its error would do."""
    pair = scaled_fabric(net.pair, factor) if net.pair is not None else None
    return replace(net, intra=scaled_fabric(net.intra, factor), inter=scaled_fabric(net.inter, factor),
                   pair=pair)


NetworkAt = Callable[[int, str], tuple[Network, str]]  # (world size, wire dtype) → (network, source words)
