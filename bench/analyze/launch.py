"""Kernel launch statistics and launch-bound steps (docs/analysis.md, "launch_stats.csv").

Per launched GPU event, HolisticTraceAnalysis's get_cuda_kernel_launch_stats: the runtime call that launched
it (cudaLaunchKernel, cudaLaunchKernelExC, cudaMemcpyAsync, cudaMemsetAsync; HIP's equivalents too, which
HTA does not list) joined by `correlation`; cpu_duration = the call's duration, gpu_duration = the event's,
launch_delay = event start − call end, clipped at 0. Summarised per step (events launched in it) and for
`all` (HTA's filtered trace), with the share of short kernels and whether the step was launch-bound: for at
least LAUNCH_BOUND_HOST_WAIT_PCT of the step's host window, its compute stream had run everything it had been
given and waited for the host's next launch (idle.py's host wait, clipped to the window) — the host, not
the GPU, set the pace.
"""

from __future__ import annotations

import numpy as np

from bench.analyze import classify as C
from bench.analyze import intervals as iv
from bench.analyze.gpu import GpuView
from bench.analyze.idle import stream_gaps
from bench.analyze.steps import Window, main_thread

LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync",  # HTA's list
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",  # ROCm's
    "hipMemcpyAsync", "hipMemsetAsync",
})
# Runtime calls in which the host thread waits for the GPU: the synchronisations by name, and any call whose
# own GPU event (same correlation) finished before the call returned (a copy to pageable memory, `.item()`,
# is synchronous whatever its name). Time in them is the GPU's pace, not host work; the rest of the
# training thread's step window is its host time (host_busy_ms: Python, the dispatcher, launches, DDP's
# hooks, waiting for data), the floor a step cannot go below however fast the GPU (bench project).
BLOCKING_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
})
SHORT_KERNEL_US = 10.0            # "short": a GPU event under 10 µs (a launch costs several µs of host time)
LAUNCH_BOUND_HOST_WAIT_PCT = 50.0  # launch-bound: host wait on the compute stream ≥ half the step


def host_busy_us(view: GpuView, w: Window) -> float:
    """The training thread's time in window w outside the calls that wait for the GPU (BLOCKING_CALLS and
    the calls whose GPU event ended before they returned, each clipped to the window), less what its
    launch calls took beyond their name's median (a launch blocks when the GPU's queue is full: the GPU's
    pace, not host work)."""
    trace = view.trace
    on_thread = trace.tid_id == main_thread(trace)
    named = np.fromiter((n in BLOCKING_CALLS for n in trace.names), dtype=bool, count=len(trace.names))
    blocking = (named[trace.name_id] if len(named) else np.zeros(len(trace), dtype=bool)) & on_thread
    calls = np.flatnonzero(C.cat_mask(trace, C.RUNTIME_CATS) & on_thread & ~np.isnan(trace.correlation))
    if len(calls) and len(view.rows):
        gpu_corr = trace.correlation[view.rows]
        order = np.argsort(gpu_corr, kind="stable")
        gpu_corr, gpu_end = gpu_corr[order], view.end[order]
        pos = np.clip(np.searchsorted(gpu_corr, trace.correlation[calls]), 0, len(gpu_corr) - 1)
        waited = (gpu_corr[pos] == trace.correlation[calls]) & (gpu_end[pos] <= trace.end[calls])
        blocking[calls[waited]] = True
    rows = np.flatnonzero(blocking)
    blocked = iv.length(iv.clip(iv.union(trace.ts[rows], trace.end[rows]), w.lo, w.hi)) if len(rows) else 0.0
    launch = np.fromiter((n in LAUNCH_CALLS for n in trace.names), dtype=bool, count=len(trace.names))
    launches = np.flatnonzero(launch[trace.name_id] & on_thread & ~blocking) if len(launch) else []
    queued = 0.0
    for name in np.unique(trace.name_id[launches]) if len(launches) else []:
        mine = launches[trace.name_id[launches] == name]
        inside = mine[(trace.ts[mine] >= w.lo) & (trace.end[mine] <= w.hi)]
        queued += float(np.clip(trace.dur[inside] - np.median(trace.dur[mine]), 0, None).sum())
    return max(0.0, (w.hi - w.lo) - blocked - queued)


def launch_events(view: GpuView) -> dict[str, np.ndarray]:
    """Per GPU event launched by a LAUNCH_CALLS call (in view's order, a subset): its index in the view,
    cpu_duration, gpu_duration and launch_delay in µs (HTA rounds ns traces inward, as the breakdown)."""
    trace = view.trace
    names = np.fromiter((n in LAUNCH_CALLS for n in trace.names), dtype=bool, count=len(trace.names))
    calls = np.flatnonzero(names[trace.name_id] & ~np.isnan(trace.correlation)) if len(names) else []
    gpu = np.flatnonzero(~view.is_sync)
    if not len(calls) or not len(gpu):
        return {k: np.empty(0) for k in ("index", "cpu_us", "gpu_us", "delay_us")}
    corr = trace.correlation[calls]
    order = np.argsort(corr, kind="stable")
    corr, calls = corr[order], calls[order]
    want = trace.correlation[view.rows[gpu]]
    pos = np.clip(np.searchsorted(corr, want), 0, len(corr) - 1)
    found = corr[pos] == want
    gpu, call = gpu[found], calls[pos[found]]
    start, end = trace.ts[call], trace.end[call]
    if view.rounded:
        start, end = np.ceil(start), np.floor(end)
    return {"index": gpu, "cpu_us": end - start, "gpu_us": view.bend[gpu] - view.bts[gpu],
            "delay_us": np.maximum(view.bts[gpu] - end, 0.0)}


def _quantiles(values: np.ndarray, prefix: str) -> dict:
    if not len(values):
        return {}
    p50, p90 = np.percentile(values, [50, 90])
    return {f"{prefix}_p50": float(p50), f"{prefix}_p90": float(p90), f"{prefix}_max": float(values.max())}


def launch_rows(view: GpuView, steps: list[Window], windows: list[Window]) -> list[dict]:
    """launch_stats rows (without the file's identity columns): one per window that launched GPU work."""
    ev = launch_events(view)
    gaps = stream_gaps(view, steps)
    tids = view.trace.tid_id[view.rows]  # a GPU event's tid is its stream
    out = []
    for w in windows:
        sel = view.selected(w) & ~view.is_sync
        if not sel.any():
            continue
        mine = sel[ev["index"].astype(int)]
        delay, cpu, gpu_us = ev["delay_us"][mine], ev["cpu_us"][mine], ev["gpu_us"][mine]
        length = w.hi - w.lo
        ts, end = view.bts[sel], view.bend[sel]
        # the compute stream: the most compute-kernel time among the window's events (a communication
        # stream waits for the host by design: its kernels are launched when a bucket is ready)
        weight = np.where(view.cls[sel] == C.COMPUTE, end - ts, 0.0)
        busiest, host_wait_us = None, None  # no compute kernel in the window: no compute stream, no flag
        if weight.sum() > 0:
            main = int(np.bincount(tids[sel], weights=weight).argmax())
            busiest = view.trace.threads[main][1]
            # host wait on it, clipped to the window: the share of the step the GPU waited for a launch
            g = gaps[(gaps["tid"] == main) & gaps["host"]]
            inside = np.minimum(g["to_us"], w.hi) - np.maximum(g["from_us"], w.lo)
            host_wait_us = float(np.clip(inside, 0, None).sum())
        row = {"step": w.step, "launches": int(mine.sum()),
               **_quantiles(delay, "launch_delay_us"), **_quantiles(cpu, "cpu_duration_us"),
               **_quantiles(gpu_us, "gpu_duration_us"),
               "short_kernels_pct": 100.0 * float((gpu_us < SHORT_KERNEL_US).mean()) if len(gpu_us) else None,
               "window_ms": length / 1e3, "compute_stream": busiest,
               "host_us_per_launch": length / int(mine.sum()) if mine.any() else None,
               "gpu_busy_pct": 100.0 * iv.length(iv.union(ts, end)) / length if length > 0 else None,
               "host_wait_pct": 100.0 * host_wait_us / length if length > 0 and host_wait_us is not None
               else None}
        row["host_busy_ms"] = host_busy_us(view, w) / 1e3
        row["launch_bound"] = (row["host_wait_pct"] >= LAUNCH_BOUND_HOST_WAIT_PCT
                               if row["host_wait_pct"] is not None else None)
        out.append(row)
    return out
