"""Analyse trace files into the trace_summary and bucket_timeline tables.

One file: load → device → windows (each ProfilerStep, then `all`) → the device's view measures each window
→ rows. Many files: each one on its own; a file that fails gives one error line and the others go on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.analyze.columns import ALL_STEPS, BUCKET_TIMELINE_COLUMNS, TRACE_SUMMARY_COLUMNS
from bench.analyze.cpu import CpuView
from bench.analyze.gpu import GpuView
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
    trace = load_trace(job.path)
    if not len(trace):
        raise TraceError(f"{job.path}: no complete ('X') events to analyse")
    device = device_of(trace)
    steps = profiler_steps(trace)
    windows = [*steps, whole_window(trace, steps)]
    view = CpuView(trace) if device == "cpu" else GpuView(trace, len(steps))
    rank = trace_rank(trace)
    ident = {"cell_id": job.cell_id, "trace_file": job.label, "rank": rank}
    summary = [{**ident, "step": w.step, "device": device, **view.window(w)} for w in windows]
    buckets = bucket_rows(trace, steps or windows, device)
    timeline = [{**ident, "engine": job.engine, **row} for row in buckets]
    return summary, timeline


def analyse(jobs: Iterable[TraceJob]) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """trace_summary and bucket_timeline DataFrames (contract columns, in order) and one error line per
    file that could not be analysed."""
    summary, timeline, errors = [], [], []
    for job in jobs:
        try:
            s, t = analyse_trace(job)
        except TraceError as exc:
            errors.append(str(exc))
            continue
        summary += s
        timeline += t
    return _frame(summary, TRACE_SUMMARY_COLUMNS), _frame(timeline, BUCKET_TIMELINE_COLUMNS), errors


def _frame(rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    if "rank" in frame:
        frame["rank"] = frame["rank"].astype("Int64")
    if "bucket" in frame:
        frame["bucket"] = frame["bucket"].astype("Int64")
    frame["step"] = frame["step"].astype(str) if len(frame) else frame["step"]
    return frame


__all__ = ["ALL_STEPS", "TraceJob", "analyse", "analyse_trace"]
