"""Which cells of a launch run side by side: those that differ only in engine, when their models fit.

naive has no bucket size (its cell id says `bna`), so it joins the group at torch DDP's default bucket size
(the torch cell the report compares it with), else the first group of its configuration.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench.config import BenchConfig
from bench.matrix import Cell
from bench.schema import CONFIG_KEYS, DEFAULT_BUCKET_MB
from bench.workloads import get_workload

# Bytes a trainer keeps resident per fp32 parameter: the parameter, its gradient, AdamW's two moments and
# the engine's flat bucket copy (torch DDP and ddp_core without gradient_as_bucket_view) = 5 × 4 bytes.
RESIDENT_BYTES_PER_PARAM = 20
# Side by side only when the extra trainers take at most this share of the free memory: activations of
# the engine stepping (one at a time) need the rest.
SIDE_BY_SIDE_SHARE = 0.5


GROUP_KEYS = tuple(k for k in CONFIG_KEYS if k != "engine")  # what a group's cells share


def engine_groups(cells: list[Cell]) -> list[list[Cell]]:
    """The cells grouped by everything but engine, in the order their first cell appears."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        if cell.bucket_cap_mb is not None:
            groups.setdefault(tuple(getattr(cell, k) for k in GROUP_KEYS), []).append(cell)
    for cell in cells:
        if cell.bucket_cap_mb is None:  # naive
            key = {k: getattr(cell, k) for k in GROUP_KEYS}
            same = [g for g in groups
                    if all(v == key[k] for k, v in zip(GROUP_KEYS, g) if k != "bucket_cap_mb")]
            default = [g for g in same if dict(zip(GROUP_KEYS, g))["bucket_cap_mb"] == DEFAULT_BUCKET_MB]
            target = (default or same or [tuple(key.values())])[0]
            groups.setdefault(target, []).append(cell)
    order = {cell.cell_id: i for i, cell in enumerate(cells)}
    return sorted(groups.values(), key=lambda g: min(order[c.cell_id] for c in g))


def free_memory_bytes(device: torch.device) -> int | None:
    """Free memory where the models live: the GPU's (cudaMemGetInfo) or the machine's (MemAvailable)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def fit_side_by_side(group: list[Cell], config: BenchConfig, device: torch.device) -> bool:
    """True when the group's extra trainers fit in the share of free memory they may take (estimated
    from the parameter count, built on the meta device: nothing is allocated)."""
    if len(group) < 2:
        return True
    cell = group[0]
    with torch.device("meta"):
        model = get_workload(cell.model, cell.model_size, config.workload.options()).build_model()
    n_params = sum(p.numel() for p in model.parameters())
    free = free_memory_bytes(device)
    need = (len(group) - 1) * n_params * RESIDENT_BYTES_PER_PARAM
    return free is not None and need <= SIDE_BY_SIDE_SHARE * free


def plan_groups(cells: list[Cell], config: BenchConfig, device: torch.device) -> list[list[Cell]]:
    """The launch's groups: engine groups when run.interleave is on and they fit, else one cell each."""
    if not config.run.interleave:
        return [[c] for c in cells]
    out = []
    for group in engine_groups(cells):
        out += [group] if fit_side_by_side(group, config, device) else [[c] for c in group]
    return out
