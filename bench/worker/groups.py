"""Which cells of a launch run side by side: those that differ only in engine, when their models fit; in a
racing search (run.search), a recipe's candidates, as many as fit (`race_groups`).

An engine without buckets (naive: its cell id says `bna`) joins the group at torch DDP's default bucket
size (the reference cell the report compares it with), else the first group of its configuration.

One decision for all ranks. Every rank must build the same trainers in the same order, or their
collectives pair up wrongly (a hang, or NCCL broadcasts of different sizes, which it does not check). So
the free memory the decision reads is the smallest over the ranks (`agreed_free_memory`: an all-reduce MIN,
called once per launch by every rank), never this rank's own.

The memory a group needs, read before any trainer is built (`capacity`), is bench/workloads/memory.py's
model: one trainer stepping (its resident state, the precision's weight copies and the saved activations of
the group's largest micro-batch, from a probe of the model on the CPU), every other trainer waiting with
its resident state (a replicating engine's: the largest), the caching allocator's reserve, the CUDA
context and, above one rank, NCCL's buffers — within FIT_SHARE of the free memory (validated on an H200
within 3 %: docs/gpu-node.md). A model the probe cannot run falls back to the older rule: resident state
(RESIDENT_BYTES_PER_PARAM a parameter) and NCCL's buffers within SIDE_BY_SIDE_SHARE of the free memory, the
rest left to the activations, unestimated.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
import torch.distributed as dist

from bench import engines
from bench.config import BenchConfig
from bench.matrix import Cell, engine_groups
from bench.race import recipe
from bench.schema import GROUP_KEYS, search
from bench.workloads import get_workload, memory

# Bytes a trainer keeps resident per fp32 parameter: the parameter, its gradient, AdamW's two moments and
# the engine's flat bucket copy (torch DDP and ddp_core without gradient_as_bucket_view) = 5 × 4 bytes.
RESIDENT_BYTES_PER_PARAM = 20
# NCCL's device buffers for one communicator, a conservative figure, not measured here: NCCL_BUFFSIZE (4 MiB
# by default, NCCL's environment-variable documentation) per connection for the Simple protocol, counted
# twice to cover LL128 and LL, × 2 peers per channel (a ring's send and receive) × 32 channels (assumed;
# NCCL_MAX_NCHANNELS caps it) = 512 MiB, rounded up to 1 GiB as a margin for tree and NVLS connections,
# which this sum does not derive.
NCCL_RESERVE_BYTES = 1024 * 1024 * 1024
# Side by side only when the trainers' resident state and NCCL's buffers take at most this share of the
# free memory (the older rule, for a model the activation probe cannot run: the rest is the activations').
SIDE_BY_SIDE_SHARE = 0.5
# With the memory model (activations estimated): all of it within this share of the free memory, the rest
# a margin for what the model does not count (fragmentation beyond RESERVED_OVER_ALLOCATED, cuDNN's
# workspaces, another process); the GPU presets are checked at the same share of an 80 GB GPU.
FIT_SHARE = 0.9


def torch_twin(cell: Cell, others: list[Cell]) -> int | None:
    """The index in `others` of the plain torch DDP cell `cell` is compared with (speed_vs_torch, the
    stopping rule's paired ratios): every GROUP_KEYS value equal; for an engine without buckets, torch's at
    the default bucket size, else at the first of its bucket sizes found (where the group put it, as
    `engine_groups` does). None for a torch DDP cell itself, or when the group has no such cell."""
    if cell.is_baseline:
        return None
    rest = [k for k in GROUP_KEYS if k != "bucket_cap_mb"]
    same = [i for i, o in enumerate(others) if o.is_baseline and all(getattr(o, k) == getattr(cell, k)
                                                                      for k in rest)]
    exact = [i for i in same if others[i].bucket_cap_mb == cell.wrap_bucket_mb]
    if cell.bucket_cap_mb is not None:
        return exact[0] if exact else None
    return (exact or same or [None])[0]


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


def agreed_free_memory(device: torch.device) -> int | None:
    """Collective when a process group is up: the smallest free memory over the ranks (None when a rank
    cannot read its own), so that every rank plans the same groups. On gloo the tensor is on the CPU, on
    NCCL on the device (`device` is the one the group was bound to)."""
    free = free_memory_bytes(device)
    if not dist.is_initialized():
        return free
    flag = torch.tensor([-1 if free is None else free], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return None if flag.item() < 0 else int(flag.item())


def side_by_side_need_bytes(n_trainers: int, n_params: int, device_type: str) -> int:
    """Bytes `n_trainers` trainers of `n_params` parameters keep resident, with NCCL's buffers on CUDA
    (activations not included: see the module docstring)."""
    return n_trainers * n_params * RESIDENT_BYTES_PER_PARAM + (NCCL_RESERVE_BYTES if device_type == "cuda"
                                                                else 0)


def gate_trainers(group: list[Cell]) -> int:
    """Trainers' worth of memory the parity gate adds while the group's own are alive (bench/worker/parity.py
    References): per configuration gated in the group, its reference (a module, and its weights and
    gradients of every gate step: about one trainer), and an eager torch DDP trainer when the group does
    not hold it."""
    from bench.worker import parity

    held = {parity.gate_key(c) for c in group if c.is_baseline}
    gated = {parity.gate_key(c) for c in group if parity.needs_gate(c)}
    return sum(1 + (key not in held) for key in gated)


def paired_chunks(group: list[Cell], most: int) -> list[list[Cell]]:
    """A group cut into chunks of at most `most` trainers (its gates' included, gate_trainers), each chunk
    holding the plain torch DDP twin of its other cells (torch_twin), so that every cell is still stepped
    beside the configuration `speed_vs_torch` compares it with: a twin with more cells than fit beside it
    appears in several chunks, measured in the first (its row) and stepped in the others for the pairing
    only (worker.main: a cell already run is a companion there). Cells without a twin in the group, and
    twins left without cells, share chunks in order. `most` below 2: every cell alone."""
    if len(group) + gate_trainers(group) <= most:
        return [group]
    if most < 2:
        return [[c] for c in group]
    twin_of = {c.cell_id: torch_twin(c, group) for c in group}
    chunks, loose = [], []
    for base in (c for c in group if c.is_baseline):
        members = [c for c in group if not c.is_baseline and twin_of[c.cell_id] is not None
                   and group[twin_of[c.cell_id]] is base]
        if not members:
            loose.append(base)
            continue
        chunk = [base]
        for member in members:
            if len(chunk) + 1 + gate_trainers(chunk + [member]) > most and len(chunk) > 1:
                chunks.append(chunk)
                chunk = [base]
            chunk.append(member)
        chunks.append(chunk)
    loose += [c for c in group if not c.is_baseline and twin_of[c.cell_id] is None]
    chunk = []
    for cell in loose:
        if chunk and len(chunk) + 1 + gate_trainers(chunk + [cell]) > most:
            chunks.append(chunk)
            chunk = []
        chunk.append(cell)
    return chunks + ([chunk] if chunk else [])


def capacity(cells: list[Cell], config: BenchConfig, free: int | None, device_type: str) -> int:
    """The most trainers of these cells' model that fit side by side in FIT_SHARE of `free` bytes, one of
    them stepping the largest micro-batch among the cells (module docstring) — at least 1: a cell alone is
    never refused here, and 1 too when the model cannot be built on the meta device, so that its cells run
    one at a time, each under its own guard. At most the trainers these cells could ask for (the cells and
    their gates' trainers): a small model in a large memory would otherwise count trainers for ever."""
    if free is None or not cells:
        return 1
    enough = len(cells) + gate_trainers(cells)
    cell = max(cells, key=lambda c: c.micro_batch)
    options = config.workload.options()
    n_params = parameter_count(cell.model, cell.model_size, options)
    if n_params is None:
        return 1
    per_sample = memory.activation_bytes_per_sample(cell.model, cell.model_size, options, cell.precision)
    if per_sample is None:  # the older rule: resident state within a share, the activations unestimated
        n = 1
        while (n < enough
               and side_by_side_need_bytes(n + 1, n_params, device_type) <= SIDE_BY_SIDE_SHARE * free):
            n += 1
        return n
    state = engines.reference().state_bytes_per_rank(4 * n_params, cell.world_size, cell)
    stepping, waiting = memory.trainer_bytes(state, n_params, cell.precision, per_sample, cell.micro_batch)
    n = 1
    while n < enough and (memory.device_bytes(stepping, [waiting] * n, device_type, cell.world_size)
                          <= FIT_SHARE * free):
        n += 1
    return n


@lru_cache(maxsize=32)
def parameter_count(model: str, size: str, options) -> int | None:
    """The model's parameters, built on the meta device (nothing allocated; a meta build of smollm2-360m
    still takes seconds, so once per process); None when it cannot be built there."""
    try:
        with torch.device("meta"):
            built = get_workload(model, size, options).build_model()
    except Exception:  # noqa: BLE001 - any failure: no estimate; the cells' own builds say why
        return None
    return sum(p.numel() for p in built.parameters())


def race_groups(cells: list[Cell], most: int) -> list[list[Cell]]:
    """A racing search's groups: each recipe's candidates (bench.race.recipe) side by side, in the order
    its first cell appears. A recipe of more than `most` candidates (the trainers that fit) is cut into
    groups of at most `most`, whole engine groups first-fit in their order (an engine group itself larger
    than `most` cut in order), so a cell still meets its torch DDP twin where it can; such a recipe's
    later groups race the earlier ones' survivors unpaired (bench/worker/racing.py)."""
    recipes: dict[tuple, list[Cell]] = {}
    for cell in cells:
        recipes.setdefault(recipe(cell), []).append(cell)
    out = []
    for members in recipes.values():
        chunks: list[list[Cell]] = []
        for group in engine_groups(members):
            pieces = [group[i:i + most] for i in range(0, len(group), most)]
            for piece in pieces:
                room = next((c for c in chunks if len(c) + len(piece) <= most), None)
                if room is None:
                    chunks.append(list(piece))
                else:
                    room.extend(piece)
        out += chunks
    return out


def plan_groups(cells: list[Cell], config: BenchConfig, device: torch.device) -> list[list[Cell]]:
    """Collective when a process group is up and some group has two cells or more (the same on every rank:
    they have the same plan). The launch's groups: engine groups when run.interleave is on and they fit
    in the ranks' smallest free memory, else cut into chunks that each keep their cells' torch DDP twin
    (paired_chunks: a twin may then appear in several); with a racing search (run.search), recipes
    (race_groups), as many candidates side by side as fit."""
    if not config.run.interleave:
        return [[c] for c in cells]
    if search(config.run.search).races:
        if len(cells) < 2:
            return [cells] if cells else []
        return race_groups(cells, capacity(cells, config, agreed_free_memory(device), device.type))
    groups = engine_groups(cells)
    if all(len(g) < 2 for g in groups):
        return groups
    free = agreed_free_memory(device)
    out = []
    for group in groups:
        out += (paired_chunks(group, capacity(group, config, free, device.type)) if len(group) > 1
                else [group])
    return out
