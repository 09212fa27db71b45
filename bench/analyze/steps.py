"""Profiler-step windows and the trace's device.

A step is a `ProfilerStep#N` range on the host (torch.profiler's `prof.step()` marks). A trace without
them has one window, `all`, from its first to its last host event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.analyze import classify as C
from bench.analyze.trace import Trace


@dataclass(frozen=True)
class Window:
    """A host time range [lo, hi] in µs; `step` is the ProfilerStep number, or "all"."""

    step: str
    lo: float
    hi: float


def profiler_steps(trace: Trace) -> list[Window]:
    """The ProfilerStep#N ranges, in time order (duplicates of a number on other threads dropped)."""
    hits = np.flatnonzero(C.host_mask(trace) & C.name_mask(trace, C.PROFILER_STEP))
    seen, out = set(), []
    for i in hits[np.argsort(trace.ts[hits], kind="stable")]:
        number = C.PROFILER_STEP.match(trace.name_of(i)).group(1)
        if number not in seen:
            seen.add(number)
            out.append(Window(number, float(trace.ts[i]), float(trace.ts[i] + trace.dur[i])))
    return out


def whole_window(trace: Trace, steps: list[Window]) -> Window:
    """From the first step's start to the last step's end; without steps, the span of the host events."""
    if steps:
        return Window("all", steps[0].lo, max(s.hi for s in steps))
    host = C.host_mask(trace)
    rows = host if host.any() else np.ones(len(trace), dtype=bool)  # a GPU-only file: its own span
    return Window("all", float(trace.ts[rows].min()), float(trace.end[rows].max()))


def main_thread(trace: Trace) -> int | None:
    """The training loop's thread id (index into trace.threads): the one carrying ProfilerStep marks, else
    the one with the most operators."""
    marks = C.host_mask(trace) & C.name_mask(trace, C.PROFILER_STEP)
    pool = trace.tid_id[marks] if marks.any() else trace.tid_id[C.cat_mask(trace, C.HOST_OP_CATS)]
    if not len(pool):
        return None
    return int(np.bincount(pool).argmax())


def device_of(trace: Trace) -> str:
    """cuda, rocm or cpu: GPU activity or GPU runtime calls decide; a trace without them whose process
    group is NCCL/RCCL is a GPU trace recorded without CUPTI (its GPU columns stay empty)."""
    gpu = C.cat_mask(trace, C.GPU_CATS)
    runtime = C.cat_mask(trace, C.RUNTIME_CATS)
    names = set(trace.names[np.unique(trace.name_id[runtime])]) if runtime.any() else set()
    rocm = any(n.startswith("hip") for n in names if isinstance(n, str)) or any(
        k.startswith("hip_") for k in trace.meta) or any(
        isinstance(p, dict) and "maxSharedMemoryPerMultiProcessor" in p
        for p in trace.meta.get("deviceProperties") or [])
    if gpu.any() or runtime.any():
        return "rocm" if rocm else "cuda"
    backend = str((trace.meta.get("distributedInfo") or {}).get("backend", ""))
    if "nccl" in backend or "rccl" in backend:
        return "rocm" if rocm else "cuda"
    return "cpu"
