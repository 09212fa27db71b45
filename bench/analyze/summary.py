"""Analyse trace files into the run folder's tables (TABLES: file name → columns).

One file: load → device → windows (each ProfilerStep, then `all`) → the device's view measures each window
→ rows. Many files: each one on its own; a file that fails gives one error line and the others go on.
GPU traces also get the idle-time breakdown and the launch statistics (idle.py, launch.py); stragglers
compare ranks, so they are computed last, from all files' bucket_timeline rows (stragglers.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.analyze.columns import (
    ALL_STEPS,
    BUCKET_TIMELINE_COLUMNS,
    IDLE_BREAKDOWN_COLUMNS,
    KERNEL_CLASS_COLUMNS,
    LAUNCH_STATS_COLUMNS,
    STRAGGLER_COLUMNS,
    TRACE_SUMMARY_COLUMNS,
)
from bench.analyze.cpu import CpuView
from bench.analyze.gpu import US_PER_MS, GpuView
from bench.analyze.idle import idle_rows
from bench.analyze.kernel_classes import (
    cpu_class_times,
    cpu_overlap_times,
    gpu_class_times,
    gpu_overlap_times,
)
from bench.analyze.launch import launch_rows
from bench.analyze.load import TraceError, load_trace, trace_rank
from bench.analyze.steps import device_of, profiler_steps, whole_window
from bench.analyze.stragglers import straggler_rows
from bench.analyze.timeline import bucket_rows

SUMMARY_FILE, TIMELINE_FILE = run_folder.TRACE_SUMMARY, run_folder.BUCKET_TIMELINE
IDLE_FILE, LAUNCH_FILE = run_folder.IDLE_BREAKDOWN, run_folder.LAUNCH_STATS
STRAGGLERS_FILE = run_folder.STRAGGLERS
CLASSES_FILE = run_folder.KERNEL_CLASSES


@dataclass(frozen=True)
class TraceJob:
    """A file to analyse and what the run knows about it (empty outside a run)."""

    path: Path
    label: str                 # trace_file as written in the outputs (relative to the run folder when in one)
    cell_id: str | None = None
    engine: str | None = None


@dataclass(frozen=True)
class OneTrace:
    """One loaded trace file, measured once, as every per-file analysis reads it."""

    job: TraceJob
    trace: object              # bench.analyze.load.Trace
    device: str                # cuda | rocm | cpu
    steps: list                # its ProfilerStep windows
    windows: list              # the steps, then `all`
    view: object               # GpuView or CpuView
    ident: dict                # cell_id, trace_file, rank: the first columns of every row


def _summary(t: OneTrace) -> list[dict]:
    return [{**t.ident, "step": w.step, "device": t.device, **t.view.window(w),
             "window_ms": (w.hi - w.lo) / US_PER_MS} for w in t.windows]


def _timeline(t: OneTrace) -> list[dict]:
    return [{**t.ident, "engine": t.job.engine, **row}
            for row in bucket_rows(t.trace, t.steps or t.windows, t.device)]


def _idle(t: OneTrace) -> list[dict]:
    return [] if t.device == "cpu" else [{**t.ident, **row} for row in idle_rows(t.view, t.steps)]


def _launch(t: OneTrace) -> list[dict]:
    if t.device == "cpu":  # no kernels, no launches on a CPU trace
        return []
    return [{**t.ident, **row} for row in launch_rows(t.view, t.steps, t.windows)]


def _classes(t: OneTrace) -> list[dict]:
    whole, n_steps = t.windows[-1], len(t.steps)
    if t.device == "cpu":
        times, overlap = cpu_class_times(t.trace, whole), cpu_overlap_times(t.trace, whole)
    else:
        selected = t.view.selected(whole)
        times = gpu_class_times(t.trace, t.view.rows, selected)
        overlap = gpu_overlap_times(t.trace, t.view, selected)
    rows = []
    for cls, (n, ms) in sorted(times.items(), key=lambda kv: -kv[1][1]):
        k, over, alone = overlap.get(cls, (0, 0.0, 0.0))
        rows.append({**t.ident, "device": t.device, "n_steps": n_steps, "kernel_class": cls, "events": n,
                     "time_ms": ms / US_PER_MS, "time_per_step_ms": ms / US_PER_MS / max(n_steps, 1),
                     "overlapped_events": k, "overlapped_ms": over / US_PER_MS,
                     "overlapped_alone_ms": alone / US_PER_MS})
    return rows


# The analyses, registered: file name → (its columns, its rows). PER_FILE reads one trace file at a time;
# ACROSS_FILES compares files (ranks of a job) from the per-file tables. A new analysis is its module and
# one line here (its columns in columns.py, its file name in bench/run_folder.py).
PER_FILE = {
    SUMMARY_FILE: (TRACE_SUMMARY_COLUMNS, _summary),
    TIMELINE_FILE: (BUCKET_TIMELINE_COLUMNS, _timeline),
    IDLE_FILE: (IDLE_BREAKDOWN_COLUMNS, _idle),
    LAUNCH_FILE: (LAUNCH_STATS_COLUMNS, _launch),
    CLASSES_FILE: (KERNEL_CLASS_COLUMNS, _classes),
}
ACROSS_FILES = {
    STRAGGLERS_FILE: (STRAGGLER_COLUMNS, lambda tables: straggler_rows(tables[TIMELINE_FILE])),
}
TABLES = {name: columns for name, (columns, _) in (PER_FILE | ACROSS_FILES).items()}


def analyse_trace(job: TraceJob) -> tuple[list[dict], list[dict]]:
    """(trace_summary rows, bucket_timeline rows) for one file; TraceError if it cannot be read."""
    tables = analyse_trace_tables(job)
    return tables[SUMMARY_FILE], tables[TIMELINE_FILE]


def analyse_trace_tables(job: TraceJob) -> dict[str, list[dict]]:
    """Every per-file table's rows for one file; TraceError if it cannot be read."""
    trace = load_trace(job.path)
    if not len(trace):
        raise TraceError(f"{job.path}: no complete ('X') events to analyse")
    device = device_of(trace)
    steps = profiler_steps(trace)
    windows = [*steps, whole_window(trace, steps)]
    view = CpuView(trace) if device == "cpu" else GpuView(trace, len(steps))
    ident = {"cell_id": job.cell_id, "trace_file": job.label, "rank": trace_rank(trace)}
    one = OneTrace(job, trace, device, steps, windows, view, ident)
    return {name: rows(one) for name, (_, rows) in PER_FILE.items()}


def analyse(jobs: Iterable[TraceJob]) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """trace_summary and bucket_timeline DataFrames (contract columns, in order) and one error line per
    file that could not be analysed."""
    tables, errors = analyse_tables(jobs)
    return tables[SUMMARY_FILE], tables[TIMELINE_FILE], errors


def analyse_tables(jobs: Iterable[TraceJob]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Every table of TABLES as a DataFrame (contract columns, in order) and one error line per file that
    could not be analysed."""
    rows: dict[str, list[dict]] = {name: [] for name in PER_FILE}
    errors = []
    for job in jobs:
        try:
            one = analyse_trace_tables(job)
        except TraceError as exc:
            errors.append(str(exc))
            continue
        for name, part in one.items():
            rows[name] += part
    frames = {name: _frame(rows[name], columns) for name, (columns, _) in PER_FILE.items()}
    for name, (_, across) in ACROSS_FILES.items():
        frames[name] = across(frames)
    return frames, errors


def _frame(rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    if "rank" in frame:
        frame["rank"] = frame["rank"].astype("Int64")
    if "bucket" in frame:
        frame["bucket"] = frame["bucket"].astype("Int64")
    if "step" in frame:
        frame["step"] = frame["step"].astype(str) if len(frame) else frame["step"]
    if "launch_bound" in frame:
        frame["launch_bound"] = frame["launch_bound"].astype("boolean")
    return frame


__all__ = ["ALL_STEPS", "TABLES", "TraceJob", "analyse", "analyse_tables", "analyse_trace",
           "analyse_trace_tables"]
