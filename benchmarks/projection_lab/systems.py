"""The network of a published system, read from what its table states: the hardware name, the interconnect
text, and the GPU and node counts (benchmarks/projection_lab/published.py; docs/projection.md).

Inside a node: the first rule of INTRA_RULES whose hardware and interconnect patterns both match (case-
blind re.search); a part whose form factor is not stated (e.g. "A100-40GB") is taken as NVIDIA's 8-GPU
HGX/DGX board of that GPU, and the answer says so.

Between nodes, the first that applies:
  1. the text states NICs × rate ("8x 200 Gb/s"): that many NICs per node at that line rate;
  2. the text states a rate per GPU ("400 Gb/s per GPU"): one NIC per GPU at it;
  3. the text states a rate for the node ("1600 Gbps node-node", "per node", EFA): shared by its GPUs, one
     NIC per GPU at rate / GPUs per node;
  4. a bare rate or a fabric word (NDR 400, HDR 200, EDR 100, FDR 56 Gb/s per NIC), NICs as the hardware's
     reference node has them, else one per GPU;
  5. nothing stated: the vendor's reference configuration of the hardware (DGX_REFERENCE: NVIDIA's DGX
     nodes, Intel's Gaudi boxes, AMD's MI300X platforms), said so.
Each NIC is a `line_fabric` (line rate × the NDR busbw/line ratio, bench/project/network.py).

GPUs per node: the row's gpus / nodes where the row gives nodes; a row without one in a table with a node
column: the hardware's reference node when the GPUs fill whole ones of it; else all of them (a table
without a node count is a single-node table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.project.network import FABRICS, Fabric, Network, line_fabric, preset_network

# (hardware pattern, interconnect pattern, preset, why): first match wins.
INTRA_RULES: tuple[tuple[str, str, str, str], ...] = (
    (r"", r"NVLink bridges", "nvlink-bridge", "NVLink-bridged pairs, PCIe gen 3 between pairs (Turing)"),
    (r"DGX-2|V100-SXM3", r"", "v100-dgx2", "DGX-2: NVSwitch"),
    (r"V100-SXM2|DGX-1", r"", "v100-dgx1", "V100 SXM2 8-GPU board: DGX-1 hybrid cube mesh"),
    (r"B200|B100|GB200", r"", "b200-nvlink", "HGX B200: NVLink 5 / NVSwitch"),
    (r"H100-PCIe|H100 PCIe", r"", "pcie5", "H100 PCIe: PCIe gen 5"),
    (r"H100-SXM|H200|H100 SXM|DGX H100", r"", "h100-nvlink", "HGX H100/H200: NVLink 4 / NVSwitch"),
    (r"A100-SXM|DGX A100", r"", "a100-nvlink", "A100 SXM4: NVLink 3 / NVSwitch"),
    (r"A100-PCIe|A100 PCIe|A40|A10\b|A30|L40|L4\b|RTX 30|RTX A\d|RTX 40|RTX 6000 Ada", r"", "pcie4",
     "Ampere/Ada PCIe cards: PCIe gen 4"),
    (r"V100|RTX 20|Quadro RTX|T4\b|P100-PCIe", r"", "pcie3", "Volta/Turing PCIe cards: PCIe gen 3"),
    (r"Gaudi ?3|HL-325", r"", "gaudi3", "Intel Gaudi 3: 21 × 200 Gb/s RoCE all-to-all in the box"),
    (r"Gaudi ?2|HL-225", r"", "gaudi2", "Intel Gaudi 2: 21 × 100 Gb/s RoCE all-to-all in the box"),
    (r"MI300X|MI325X", r"", "mi300x", "AMD MI300X/MI325X: Infinity Fabric, 8 GPUs fully connected"),
    (r"", r"PCIe (?:gen ?)?5|PCIe5", "pcie5", "the table states PCIe gen 5"),
    (r"", r"PCIe (?:gen ?)?4|PCIe4", "pcie4", "the table states PCIe gen 4"),
    (r"", r"PCIe", "pcie3", "the table states PCIe (generation not stated: gen 3 assumed)"),
    # form factor not stated: NVIDIA's 8-GPU board of the GPU (HGX/DGX), the configuration its data sheet
    # describes for multi-GPU training
    (r"H100|H200|GH200", r"", "h100-nvlink", "H100 form factor not stated: HGX H100 (NVLink 4, NVSwitch), "
     "NVIDIA's reference 8-GPU board"),
    (r"A100", r"", "a100-nvlink", "A100 form factor not stated: HGX A100 (NVLink 3, NVSwitch), NVIDIA's "
     "reference 8-GPU board"),
    (r"", r"NVSwitch|NVLink", "a100-nvlink", "NVLink/NVSwitch stated for an unknown GPU: A100's NVLink 3 "
     "figures assumed"),
)
# Unknown hardware and no fabric stated: a PCIe gen 4 card (the most common slot of the tables' era).
INTRA_FALLBACK = ("pcie4", "hardware not recognised and no intra-node fabric stated: PCIe gen 4 assumed")

# NVIDIA's reference nodes (data sheets): (hardware pattern, GPUs per node, NICs, Gb/s per NIC, words).
DGX_REFERENCE: tuple[tuple[str, int, int, float, str], ...] = (
    (r"DGX-2|V100-SXM3", 16, 8, 100.0, "DGX-2/2H: 8× EDR 100 Gb/s InfiniBand (DGX-2 data sheet)"),
    (r"V100", 8, 4, 100.0, "DGX-1: 4× EDR 100 Gb/s InfiniBand (DGX-1 data sheet)"),
    (r"A100", 8, 8, 200.0, "DGX A100: 8× HDR 200 Gb/s ConnectX-6 (DGX A100 data sheet)"),
    (r"H100|H200|B200|B100|GH200", 8, 8, 400.0, "DGX H100/H200/B200: 8× NDR 400 Gb/s ConnectX-7 (data "
     "sheets)"),
    (r"Gaudi ?3|HL-325", 8, 8, 600.0, "Gaudi 3: 3 × 200 Gb/s scale-out RoCE ports per accelerator (Intel "
     "Gaudi docs, Network Configuration)"),
    (r"Gaudi ?2|HL-225", 8, 8, 300.0, "Gaudi 2: 3 × 100 Gb/s scale-out RoCE ports per accelerator (half "
     "Gaudi 3's rate, same layout)"),
    (r"MI300X|MI325X", 8, 8, 400.0, "MI300X platforms: one 400 Gb/s NIC per GPU (the rail-optimised "
     "layout of DGX H100; an assumption)"),
)
# Not a DGX part: one HDR 200 Gb/s NIC per GPU, the DGX A100 generation's rail-optimised design.
REFERENCE_FALLBACK = (8, None, 200.0, "no reference node known for this hardware: one HDR 200 Gb/s NIC per "
                      "GPU assumed (DGX A100's design)")
FABRIC_WORDS = (("NDR", 400.0), ("HDR", 200.0), ("EDR", 100.0), ("FDR", 56.0))

_RATE = r"(\d+(?:\.\d+)?)\s*(T|G)(?:b/s|bps|bit/s|b\b|bit\b|bE\b|\b)"
_NICS_X_RATE = re.compile(r"(\d+)\s*[x×]\s*" + _RATE, re.I)
_PER_GPU = re.compile(_RATE + r"[^;,.]*?per (?:GPU|rank)", re.I)
_PER_NODE = re.compile(_RATE + r"[^;,.]*?(?:per node|node-node|node-to-node|per instance|EFA)|EFA[^;,.]*?"
                       + _RATE, re.I)
_BARE = re.compile(_RATE, re.I)
_INTER_TEXT = re.compile(r"inter-node|node-node|node-to-node|between nodes|per node|scale-out|InfiniBand|"
                         r"RoCE|Ethernet|GbE|EFA|NIC|\bIB\b|HDR|EDR|NDR|FDR|Gb/s|Gbps", re.I)


@dataclass(frozen=True)
class System:
    """What connects a published row's GPUs, and how each part was known."""

    intra: str               # preset inside a node
    intra_why: str
    inter: Fabric
    nics_per_node: int | None
    inter_why: str
    gpus_per_node: int

    def network(self) -> Network:
        return preset_network(self.intra, self.gpus_per_node, self.inter, self.nics_per_node)

    @property
    def words(self) -> str:
        nics = f"{self.nics_per_node}× " if self.nics_per_node else "1 per GPU × "
        return (f"{self.intra} ({self.intra_why}); between nodes {nics}{self.inter.name} ({self.inter_why}); "
                f"{self.gpus_per_node} GPUs per node")


def intra_of(hardware: str, interconnect: str) -> tuple[str, str]:
    """(preset inside a node, why) for a hardware name and interconnect text (INTRA_RULES)."""
    for hw, ic, preset, why in INTRA_RULES:
        if re.search(hw, hardware, re.I) and re.search(ic, interconnect, re.I):
            return preset, why
    return INTRA_FALLBACK


def _reference(hardware: str) -> tuple[int, int | None, float, str]:
    for pattern, gpus, nics, gbit, words in DGX_REFERENCE:
        if re.search(pattern, hardware, re.I):
            return gpus, nics, gbit, words
    return REFERENCE_FALLBACK


def _gbit(value: str, unit: str) -> float:
    return float(value) * (1000.0 if unit.upper() == "T" else 1.0)


def inter_of(hardware: str, interconnect: str, gpus_per_node: int) -> tuple[Fabric, int | None, str]:
    """(NIC fabric, NICs per node (None: one per GPU), why) between nodes (module docstring)."""
    _, ref_nics, ref_gbit, ref_words = _reference(hardware)
    text = interconnect
    # only the part of the text about the fabric between nodes carries its rate
    parts = [p for p in re.split(r";", text) if _INTER_TEXT.search(p)]
    inter_text = "; ".join(parts)
    stated = "NOT STATED" not in inter_text.upper()
    how = "stated" if stated else "the table's note of the reference configuration (not stated by the table)"
    if m := _NICS_X_RATE.search(inter_text):
        nics, gbit = int(m.group(1)), _gbit(m.group(2), m.group(3))
        return _fabric(gbit, inter_text), nics, f"{nics} × {gbit:g} Gb/s per node, {how}"
    if m := _PER_GPU.search(inter_text):
        gbit = _gbit(m.group(1), m.group(2))
        return _fabric(gbit, inter_text), None, f"{gbit:g} Gb/s per GPU, {how}"
    if m := _PER_NODE.search(inter_text):
        value, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        gbit = _gbit(value, unit)
        return (_fabric(gbit / gpus_per_node, inter_text), None,
                f"{gbit:g} Gb/s per node shared by {gpus_per_node} GPUs, {how}")
    nics = ref_nics if ref_nics is not None and gpus_per_node == _reference(hardware)[0] else None
    if m := _BARE.search(inter_text):
        gbit = _gbit(m.group(1), m.group(2))
        return _fabric(gbit, inter_text), nics, f"{gbit:g} Gb/s per NIC, {how}"
    for word, gbit in FABRIC_WORDS:
        if re.search(rf"\b{word}\b", inter_text):
            return _fabric(gbit, word), nics, f"{word} {gbit:g} Gb/s per NIC (the fabric's line rate), {how}"
    return (_fabric(ref_gbit, ref_words), ref_nics,
            f"not stated: the vendor's reference configuration, {ref_words}")


def _fabric(gbit: float, text: str) -> Fabric:
    """A NIC of `gbit` line rate: an InfiniBand preset when the text is not about Ethernet and a preset has
    that rate, else a line_fabric named by its kind."""
    kind = next((k for k in ("RoCE", "EFA", "Ethernet", "GbE") if re.search(k, text, re.I)), "")
    if not kind:
        for name in ("ib-ndr400", "ib-hdr200", "ib-edr100"):
            if abs(FABRICS[name].bandwidth_gbps(1.0) - line_fabric("x", gbit, "").bandwidth_gbps(1.0)) < 1e-9:
                return FABRICS[name]
    kind = kind or "NIC"
    return line_fabric(f"{kind.lower()}-{gbit:g}g", gbit, f"{kind} {gbit:g} Gb/s")


def gpus_per_node_of(gpus: int, nodes, hardware: str = "", multi_node_table: bool = False) -> int:
    """GPUs per node: gpus / nodes when the row states nodes (and they divide); else, in a table that has a
    node count for other rows, the hardware's reference node when the GPUs fill whole ones of it; else one
    node of all of them (a table without a node count is a single-node table)."""
    try:
        count = float(nodes)
    except (TypeError, ValueError):
        count = float("nan")
    if count == count and count >= 1 and count == int(count) and gpus % int(count) == 0:
        return gpus // int(count)
    reference = _reference(hardware)[0]
    if multi_node_table and gpus > reference and gpus % reference == 0:
        return reference
    return gpus


def system_of(hardware: str, interconnect: str, gpus: int, nodes, multi_node_table: bool = False) -> System:
    """The network of `gpus` GPUs of `hardware` on `nodes` nodes (None or empty: not stated), from the
    table's text; `multi_node_table`: the table has a node column (gpus_per_node_of)."""
    interconnect = "" if interconnect != interconnect else str(interconnect)  # NaN: nothing stated
    intra, intra_why = intra_of(hardware, interconnect)
    g = gpus_per_node_of(gpus, nodes, hardware, multi_node_table)
    inter, nics, inter_why = inter_of(hardware, interconnect, g)
    return System(intra, intra_why, inter, nics, inter_why, g)
