"""What a cell measures on every rank: timed windows, reductions over ranks, the parity check, the
all-reduce probe, peak memory, the work (tokens, FLOPs) of a step, a step timed phase by phase and fp16's
skipped steps. Each function is collective where it says so: every rank calls it, in the same order.
"""

from __future__ import annotations

import re
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from bench import stats
from bench.peaks import peak_flops_per_s
from bench.schema import WIRE_DTYPES, MiB
from bench.worker.trainer import PhaseClock, Trainer, sync_device


class Stopwatch:
    """Sums the wall time spent inside its `with` blocks (the launcher's overhead figure needs it)."""

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t0


# The rank-0 statistics between a group's rounds (the warm-up test, the stopping rule, a race's looks), summed
# over the process: bench/worker/cell.py charges what a group's rounds added to it to the anatomy's
# `analysis` part, not to `timed` (anatomy.PARTS).
ANALYSIS = Stopwatch()


class StepTimer:
    """Times steps one at a time as the timed rounds do: a barrier and a device sync before each (ranks start
    it together: its time is its own, not a straggler's), then CUDA events around it on GPU (no sync inside
    the step), perf_counter on CPU. `times()` → this rank's milliseconds per step (one sync at the end)."""

    def __init__(self, device: torch.device):
        self.cuda, self.device, self._local = device.type == "cuda", device, []

    def time(self, step: Callable[[], object]) -> None:
        dist.barrier()
        sync_device(self.device)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            self._local.append((start, end))
        else:
            t0 = time.perf_counter()
            step()
            self._local.append((time.perf_counter() - t0) * 1e3)

    def times(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [start.elapsed_time(end) for start, end in self._local]
        return list(self._local)


def gather_times(timers: list[StepTimer]) -> list[list[list[float]]]:
    """Collective. Per timer, its milliseconds per rank and step (ranks × steps), gathered on every rank."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [timer.times() for timer in timers])
    return [[per_rank[e] for per_rank in gathered] for e in range(len(timers))]


@dataclass(frozen=True)
class TimedRounds:
    """A group's timed rounds, whatever decided them (the grid's fixed count, the adaptive rule, a race):
    per trainer its step times per rank (ranks × rounds; an eliminated one's stop at its look), why they
    stopped (stats.stop_reason's word; None for a fixed count), and the trainers a race eliminated (index →
    bench.race.Elimination; empty outside a race)."""

    per_rank: list[list[list[float]]]
    stopped_by: str | None
    eliminated: dict = field(default_factory=dict)


def timed_rounds(steps: list[Callable[[], object]], n: int, device: torch.device) -> list[list[list[float]]]:
    """Collective. n rounds; in each round every step function runs once, in `stats.round_order` (each
    first in turn, every other round in the opposite order, so slow moments of the machine land on all of
    them alike and no step always follows the same one), each timed alone by a StepTimer.

    Returns, per step function, its milliseconds per rank and round (ranks × rounds), gathered on every
    rank; the step time of a round is the maximum over ranks (metrics.step_times_over_ranks).
    """
    timers = [StepTimer(device) for _ in steps]
    for r in range(n):
        for e in stats.round_order(r, len(steps)):
            timers[e].time(steps[e])  # one step per round each: a timer's k-th time is round k's
    return gather_times(timers)


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


def params_identical(params: list[torch.Tensor], device: torch.device) -> bool:
    """Collective. Every rank's parameters equal rank 0's, bit for bit (one broadcast per dtype)."""
    ok = True
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        by_dtype.setdefault(p.dtype, []).append(p.detach().reshape(-1))
    for tensors in by_dtype.values():
        mine = torch.cat(tensors)
        ref = mine.clone()
        dist.broadcast(ref, 0)
        ok = ok and torch.equal(mine, ref)
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


# The all-reduce probe follows nccl-tests (NVIDIA/nccl-tests, src/common.cu, TimeTest and BenchTime):
# untimed warm-up collectives; a barrier; `iters` in-place all-reduces launched back to back between two
# host clock reads, the second after the device has finished (completeColl's stream sync); time per
# all-reduce = elapsed / iters, then averaged over ranks (its default `-a 1`); algbw = S / t with S = count
# × the element size of the dtype sent; busbw = algbw · 2(n−1)/n (src/all_reduce.cu AllReduceGetBw).
# Warm-up: nccl-tests ran 5 (`-w`, default 5) until its commit f2015cb (Aug 2025), which made it 1 per size
# at every size of the sweep plus BenchTime's one untimed synced collective; 5 per size is at least as warm.
PROBE_WARMUP_ITERS = 5
SWEEP_MIN_BYTES = 4 * 1024  # the size sweep's smallest message; sizes double up to the largest bucket
# Sweep points already timed in this process (one launch, so one world size): (world size, dtype, device
# type) → {bytes: seconds}. A launch's cells share them: the fabric, not the cell, sets these times, and
# timing the whole sweep again for every cell would multiply the probe's cost by the cells of a launch.
_SWEEP_TIMES: dict[tuple[int, torch.dtype, str], dict[int, float]] = {}


@dataclass(frozen=True)
class Probe:
    """The all-reduce probe of one cell: the largest bucket as the wire carries it (bytes in `dtype`),
    seconds per all-reduce (None when not timed), the engine's bucket count, and the size sweep
    [(bytes, seconds)] from SWEEP_MIN_BYTES up to and including the largest bucket."""

    nbytes: int
    seconds: float | None
    n_buckets: int
    dtype: torch.dtype
    sweep: list[tuple[int, float]]


def allreduce_seconds(numel: int, dtype: torch.dtype, device: torch.device, iters: int) -> float:
    """Collective. Seconds per in-place all-reduce (SUM) of `numel` elements of `dtype`, timed as nccl-tests
    times it (see above): the mean over ranks of each rank's elapsed time / iters."""
    buf = torch.zeros(numel, dtype=dtype, device=device)  # zeros: sums stay finite however many iterations
    for _ in range(PROBE_WARMUP_ITERS):  # first collectives set up connections, buffers and algorithms
        dist.all_reduce(buf)
    sync_device(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync_device(device)
    return mean_over_ranks((time.perf_counter() - t0) / iters, device)


def gradient_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the trainable parameters (of most of their elements, if they mix dtypes): what an
    uncompressed all-reduce sends."""
    numel: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            numel[p.dtype] = numel.get(p.dtype, 0) + p.numel()
    return max(numel, key=numel.get)


def allreduce_probe(trainer: Trainer, iters: int) -> Probe:
    """Collective. Time all-reduces of the engine's largest bucket in the comm dtype, and the size sweep.

    Nothing is timed at world size 1 (nothing crosses a link) or with iters 0. Sweep points below the
    largest bucket are timed once per launch (`_SWEEP_TIMES`); the largest bucket is timed for every cell.
    """
    cell, device, ws = trainer.cell, trainer.device, dist.get_world_size()
    sizes = trainer.engine.bucket_sizes_bytes(trainer.model, cell.wrap_bucket_mb)
    grads = gradient_dtype(trainer.model)
    wire = WIRE_DTYPES[cell.comm_dtype].torch_dtype
    dtype = getattr(torch, wire) if wire else grads
    numel = max(1, max(sizes) // grads.itemsize)  # bucket sizes are in the gradients' dtype
    nbytes = numel * dtype.itemsize
    if iters == 0 or ws == 1:
        return Probe(nbytes, None, len(sizes), dtype, [])
    seconds = allreduce_seconds(numel, dtype, device, iters)
    timed = _SWEEP_TIMES.setdefault((ws, dtype, device.type), {})
    sweep = []
    size = SWEEP_MIN_BYTES
    while size < nbytes:
        if size not in timed:
            timed[size] = allreduce_seconds(size // dtype.itemsize, dtype, device, iters)
        sweep.append((size, timed[size]))
        size *= 2
    return Probe(nbytes, seconds, len(sizes), dtype, sweep + [(nbytes, seconds)])


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator statistics (allocated and reserved), or the process's peak RSS
    (Linux VmHWM)."""
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


def peak_reserved_mb(device: torch.device) -> float | None:
    """Collective on CUDA. The peak memory torch's caching allocator held since `reset_peak_memory` (its
    blocks, allocated or cached), MiB, max over ranks; None on CPU (no allocator of its own to report)."""
    if device.type != "cuda":
        return None
    return max_over_ranks(torch.cuda.max_memory_reserved(device) / MiB, device)


def device_used_mb(device: torch.device) -> float | None:
    """Collective on CUDA. The device's used memory now (cudaMemGetInfo: total − free), MiB, max over ranks:
    the allocator's reserved memory plus what it does not see (CUDA context, NCCL buffers, cuBLAS
    workspaces) and any other process on the GPU; None on CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return max_over_ranks((total - free) / MiB, device)


def work_per_step(trainer: Trainer, steps: list[list]) -> tuple[float | None, float | None]:
    """Collective. (tokens, model FLOPs) per optimizer step summed over ranks, averaged over `steps`
    (each a list of the micro-batches' staged indices); None when the workload does not say. Never timed."""
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


def phase_pass(trainer: Trainer) -> dict[str, float | None]:
    """One step with device syncs between phases → forward/backward/optimizer ms, and the engine's own
    end-of-backward wait (ddp_core on CPU only: see Engine.sync_wait_ms)."""
    clock = PhaseClock(trainer.device)
    trainer.step(clock)
    return {"forward": clock.ms["forward"], "backward": clock.ms["backward"],
            "sync_wait": trainer.engine.sync_wait_ms(trainer.model, trainer.device),
            "optimizer": clock.ms["opt_step"]}


def skipped_steps(trainer: Trainer) -> int | None:
    """Collective for fp16 cells (every rank's trainer has the same precision): optimizer steps the
    GradScaler skipped so far, the maximum over ranks (under no_sync a rank's local gradients can overflow
    alone); None for other precisions. A device sync."""
    local = trainer.precision.skipped_steps()
    return None if local is None else int(max_over_ranks(local, trainer.device))
