"""What a cell measures on every rank: timed windows, reductions over ranks, the parity check, the
all-reduce probe, peak memory and the work (tokens, FLOPs) of a step. Each function is collective where it
says so: every rank calls it, in the same order.
"""

from __future__ import annotations

import re
import resource
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from bench import engines
from bench.peaks import peak_flops_per_s
from bench.schema import MiB
from bench.worker.trainer import Trainer, sync_device


class Stopwatch:
    """Sums the wall time spent inside its `with` blocks (the launcher's overhead figure needs it)."""

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t0


def timed_rounds(steps: list[Callable[[], object]], n: int, device: torch.device) -> list[list[list[float]]]:
    """Collective. n rounds; in each round every step function runs once, the first one rotating by one
    each round (so slow moments of the machine land on all of them alike), each step after a barrier and
    a device sync and timed alone: CUDA events on GPU, perf_counter on CPU. No sync inside a step.

    Returns, per step function, its milliseconds per rank and round (ranks × rounds), gathered on every
    rank; the step time of a round is the maximum over ranks (metrics.step_times_over_ranks).
    """
    k, cuda = len(steps), device.type == "cuda"
    local: list[list] = [[None] * n for _ in steps]
    for r in range(n):
        for j in range(k):
            e = (r + j) % k
            dist.barrier()  # ranks start each step together: a step's time is its own, not a straggler's
            sync_device(device)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                steps[e]()
                end.record()
                local[e][r] = (start, end)
            else:
                t0 = time.perf_counter()
                steps[e]()
                local[e][r] = (time.perf_counter() - t0) * 1e3
    if cuda:
        torch.cuda.synchronize(device)
        local = [[start.elapsed_time(end) for start, end in row] for row in local]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return [[per_rank[e] for per_rank in gathered] for e in range(k)]


def mean_over_ranks(value: float, device: torch.device) -> float:
    """Collective. The mean of a float over ranks."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def max_over_ranks(value: float, device: torch.device) -> float:
    """Collective. The maximum of a float over ranks."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def params_identical(model: torch.nn.Module, device: torch.device) -> bool:
    """Collective. Every rank's parameters equal rank 0's, bit for bit (one broadcast per dtype)."""
    ok = True
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in model.parameters():
        by_dtype.setdefault(p.dtype, []).append(p.detach().reshape(-1))
    for tensors in by_dtype.values():
        mine = torch.cat(tensors)
        ref = mine.clone()
        dist.broadcast(ref, 0)
        ok = ok and torch.equal(mine, ref)
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def allreduce_probe(trainer: Trainer, iters: int) -> tuple[int, float | None, int]:
    """Collective. Time all-reduces of the engine's largest bucket in the comm dtype.

    Returns (message bytes, seconds per all-reduce as the slowest rank saw it or None, number of buckets).
    """
    cell, device = trainer.cell, trainer.device
    sizes = engines.bucket_sizes_bytes(cell.engine, trainer.model, cell.bucket_cap_mb)
    dtype = engines.COMM_TORCH_DTYPES[cell.comm_dtype] or torch.float32
    numel = max(1, max(sizes) // 4)  # gradients are fp32: bytes / 4 elements
    buf = torch.ones(numel, dtype=dtype, device=device)
    nbytes = numel * buf.element_size()
    if iters == 0:
        return nbytes, None, len(sizes)
    for _ in range(2):  # warm-up: first collectives set up connections and buffers
        dist.all_reduce(buf)
    dist.barrier()
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync_device(device)
    seconds = max_over_ranks((time.perf_counter() - t0) / iters, device)
    return nbytes, seconds, len(sizes)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator statistics, or the process's peak RSS (Linux VmHWM)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux (or not allowed): peak_memory_mb reports the peak since the process started


def peak_memory_mb(device: torch.device) -> float:
    """Collective. The peak since `reset_peak_memory`, in MiB, the maximum over ranks."""
    if device.type == "cuda":
        local = torch.cuda.max_memory_allocated(device) / MiB
    else:
        try:
            status = Path("/proc/self/status").read_text()
            local = int(re.search(r"VmHWM:\s+(\d+)\s+kB", status).group(1)) * 1024 / MiB
        except (OSError, AttributeError):
            local = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MiB  # Linux: KiB
    return max_over_ranks(local, device)


def work_per_step(trainer: Trainer, steps: list[list[torch.Tensor]]) -> tuple[float | None, float | None]:
    """Collective. (tokens, model FLOPs) per optimizer step summed over ranks, averaged over `steps`
    (each a list of micro-batch index tensors); None when the workload does not say. Never timed."""
    device, workload = trainer.device, trainer.workload
    tokens, flops = 0.0, 0.0
    for micro in steps:
        for idx in micro:
            batch = trainer.dataset.batch(idx)
            t = workload.tokens_in_batch(batch)
            f = workload.train_flops_per_sample(batch)
            tokens = None if t is None or tokens is None else tokens + t
            flops = None if f is None or flops is None else flops + f * len(idx)
    out = []
    ws = dist.get_world_size()
    for value in (tokens, flops):
        known = max_over_ranks(0.0 if value is None else 1.0, device) > 0
        out.append(mean_over_ranks(value or 0.0, device) * ws / len(steps) if known else None)
    return out[0], out[1]


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense peak FLOP/s for `precision` (bench.peaks); None on CPU or for an unknown GPU."""
    if device.type != "cuda":
        return None
    return peak_flops_per_s(torch.cuda.get_device_name(device), precision)
