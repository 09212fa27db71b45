"""Analyse trace files into the trace_summary and bucket_timeline tables.

One file: load → device → windows (each ProfilerStep, then `all`) → the device's view measures each window
→ rows. Many files: each one on its own; a file that fails gives one error line and the others go on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.analyze.columns import (
    ALL_STEPS,
    BUCKET_TIMELINE_COLUMNS,
    KERNEL_CLASS_COLUMNS,
    TRACE_SUMMARY_COLUMNS,
)
from bench.analyze.cpu import CpuView
from bench.analyze.gpu import US_PER_MS, GpuView
from bench.analyze.kernel_classes import cpu_class_times, gpu_class_times
from bench.analyze.load import TraceError, load_trace, trace_rank
from bench.analyze.steps import device_of, profiler_steps, whole_window
from bench.analyze.timeline import bucket_rows


@dataclass(frozen=True)
class TraceJob:
    """A file to analyse and what the run knows about it (empty outside a run)."""

    path: Path
    label: str                 # trace_file as written in the outputs (relative to the run folder when in one)
    cell_id: str | None = None
    engine: str | None = None


def analyse_trace(job: TraceJob) -> tuple[list[dict], list[dict]]:
    """(trace_summary rows, bucket_timeline rows) for one file; TraceError if it cannot be read."""
    summary, timeline, _ = analyse_trace_tables(job)
    return summary, timeline


def analyse_trace_tables(job: TraceJob) -> tuple[list[dict], list[dict], list[dict]]:
    """(trace_summary, bucket_timeline, kernel_classes) rows for one file; TraceError if unreadable."""
    trace = load_trace(job.path)
    if not len(trace):
        raise TraceError(f"{job.path}: no complete ('X') events to analyse")
    device = device_of(trace)
    steps = profiler_steps(trace)
    windows = [*steps, whole_window(trace, steps)]
    view = CpuView(trace) if device == "cpu" else GpuView(trace, len(steps))
    rank = trace_rank(trace)
    ident = {"cell_id": job.cell_id, "trace_file": job.label, "rank": rank}
    summary = [{**ident, "step": w.step, "device": device, **view.window(w),
                "window_ms": (w.hi - w.lo) / US_PER_MS} for w in windows]
    buckets = bucket_rows(trace, steps or windows, device)
    timeline = [{**ident, "engine": job.engine, **row} for row in buckets]
    whole = windows[-1]
    times = (cpu_class_times(trace, whole) if device == "cpu"
             else gpu_class_times(trace, view.rows, view.selected(whole)))
    n_steps = len(steps)
    classes = [{**ident, "device": device, "n_steps": n_steps, "kernel_class": cls, "events": n,
                "time_ms": t / US_PER_MS, "time_per_step_ms": t / US_PER_MS / max(n_steps, 1)}
               for cls, (n, t) in sorted(times.items(), key=lambda kv: -kv[1][1])]
    return summary, timeline, classes


def analyse(jobs: Iterable[TraceJob]) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """trace_summary and bucket_timeline DataFrames (contract columns, in order) and one error line per
    file that could not be analysed."""
    summary, timeline, _, errors = analyse_tables(jobs)
    return summary, timeline, errors


def analyse_tables(jobs: Iterable[TraceJob]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """trace_summary, bucket_timeline and kernel_classes DataFrames (contract columns, in order) and one
    error line per file that could not be analysed."""
    summary, timeline, classes, errors = [], [], [], []
    for job in jobs:
        try:
            s, t, k = analyse_trace_tables(job)
        except TraceError as exc:
            errors.append(str(exc))
            continue
        summary += s
        timeline += t
        classes += k
    return (_frame(summary, TRACE_SUMMARY_COLUMNS), _frame(timeline, BUCKET_TIMELINE_COLUMNS),
            _frame(classes, KERNEL_CLASS_COLUMNS), errors)


def _frame(rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    if "rank" in frame:
        frame["rank"] = frame["rank"].astype("Int64")
    if "bucket" in frame:
        frame["bucket"] = frame["bucket"].astype("Int64")
    if "step" in frame:
        frame["step"] = frame["step"].astype(str) if len(frame) else frame["step"]
    return frame


__all__ = ["ALL_STEPS", "TraceJob", "analyse", "analyse_tables", "analyse_trace", "analyse_trace_tables"]
