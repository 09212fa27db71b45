"""Idle-time breakdown per stream (HolisticTraceAnalysis's get_idle_time_breakdown; docs/analysis.md,
"idle_breakdown.csv").

On each stream, the GPU events (kernels, memcpy, memset; not CUPTI's sync records) of the `all` window
(HTA's filtered trace) in start order; the gap before each event is idle time on that stream, of one kind:
- host wait: the event's launch started after the previous event on the stream had ended (the queue was
  empty: the host had not yet asked for the next one);
- kernel wait: otherwise, when the gap is shorter than KERNEL_WAIT_US (launch overhead between kernels);
- other: the rest (e.g. a kernel waiting on an event from another stream).
A gap goes to the step that launched the event after it, so a step's rows add up, over steps, to the `all`
row less the gaps before events launched outside every step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analyze.columns import ALL_STEPS
from bench.analyze.gpu import US_PER_MS, GpuView
from bench.analyze.steps import Window

KERNEL_WAIT_US = 30.0  # HTA's default consecutive_kernel_delay (in the trace's unit, µs)


def step_of(launch: np.ndarray, steps: list[Window]) -> np.ndarray:
    """Per GPU event, the index of the step whose host range [lo, hi) holds its launch; -1 for none."""
    out = np.full(len(launch), -1)
    if not steps:
        return out
    lo = np.array([s.lo for s in steps])
    hi = np.array([s.hi for s in steps])
    pos = np.searchsorted(lo, launch, side="right") - 1  # NaN launches sort last; caught by the test below
    ok = (pos >= 0) & ~np.isnan(launch)
    ok[ok] = launch[ok] < hi[pos[ok]]
    out[ok] = pos[ok]
    return out


def stream_gaps(view: GpuView, steps: list[Window]) -> pd.DataFrame:
    """One row per idle gap: stream (and its thread id), step index (-1: none), gap µs, its ends (µs), and
    the host_wait / kernel_wait flags."""
    sel = view.selected(Window(ALL_STEPS, steps[0].lo, max(s.hi for s in steps)) if steps
                         else Window(ALL_STEPS, -np.inf, np.inf)) & ~view.is_sync
    tids = view.trace.tid_id[view.rows][sel]
    ts, end, launch = view.bts[sel], view.bend[sel], view.launch[sel]  # ns traces: rounded as HTA does
    order = np.lexsort((ts, tids))  # by stream, then start (HTA: sort_values("ts") within the stream)
    tids, ts, end, launch = tids[order], ts[order], end[order], launch[order]
    step = step_of(launch, steps)
    has_prev = np.zeros(len(ts), dtype=bool)
    has_prev[1:] = tids[1:] == tids[:-1]
    prev_end = np.full(len(ts), np.nan)
    prev_end[1:] = end[:-1]
    gap = ts - prev_end
    host = has_prev & (launch > prev_end)  # NaN launch (no runtime call): never host wait, as in HTA
    kernel = has_prev & ~host & (gap < KERNEL_WAIT_US)
    streams = np.array([view.trace.threads[t][1] for t in range(len(view.trace.threads))], dtype=object)
    keep = has_prev
    return pd.DataFrame({"stream": streams[tids][keep], "tid": tids[keep], "step": step[keep],
                         "gap_us": gap[keep], "from_us": prev_end[keep], "to_us": ts[keep],
                         "host": host[keep], "kernel": kernel[keep]})


def idle_rows(view: GpuView, steps: list[Window]) -> list[dict]:
    """idle_breakdown rows (without the file's identity columns): per stream, each step and `all`."""
    gaps = stream_gaps(view, steps)
    if gaps.empty:
        return []
    gaps["host_wait_ms"] = gaps["gap_us"].where(gaps["host"], 0.0) / US_PER_MS
    gaps["kernel_wait_ms"] = gaps["gap_us"].where(gaps["kernel"], 0.0) / US_PER_MS
    gaps["other_wait_ms"] = gaps["gap_us"].where(~gaps["host"] & ~gaps["kernel"], 0.0) / US_PER_MS
    gaps["idle_ms"] = gaps["gap_us"] / US_PER_MS
    parts = ["idle_ms", "host_wait_ms", "kernel_wait_ms", "other_wait_ms"]
    names = np.array([s.step for s in steps] + [None], dtype=object)
    per_step = gaps[gaps["step"] >= 0].groupby(["step", "stream"], sort=True)[parts].sum().reset_index()
    per_step["step"] = names[per_step["step"].to_numpy()]
    whole = gaps.groupby("stream", sort=True)[parts].sum().reset_index()
    whole.insert(0, "step", ALL_STEPS)
    out = pd.concat([per_step, whole], ignore_index=True)
    out["host_wait_pct"] = (100 * out["host_wait_ms"] / out["idle_ms"]).where(out["idle_ms"] > 0)
    return out.to_dict("records")
