"""Analyse trace files into the run folder's tables (TABLES: file name → columns).

One file: load → device → windows (each ProfilerStep, then `all`) → the device's view measures each window
→ rows. Many files: each one on its own, in a pool of worker processes (one file per process at a time,
so a process holds one trace; what comes back is rows); a file that fails gives one error line and the
others go on. GPU traces also get the idle-time breakdown and the launch statistics (idle.py, launch.py).
What compares ranks is computed last, from every file's rows: each collective aligned across the ranks of
its job (waits.py: collective_wait.csv, the wait and transfer columns of trace_summary.csv, and
rank_timeline.csv), then the stragglers (stragglers.py).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.analyze import waits
from bench.analyze.collectives import cpu_collectives, gpu_collectives
from bench.analyze.columns import (
    ALL_STEPS,
    BUCKET_TIMELINE_COLUMNS,
    COLLECTIVE_WAIT_COLUMNS,
    IDLE_BREAKDOWN_COLUMNS,
    KERNEL_CLASS_COLUMNS,
    LAUNCH_STATS_COLUMNS,
    RANK_TIMELINE_COLUMNS,
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
from bench.config import usable_cpus
from bench.lifetime import die_with_parent

SUMMARY_FILE, TIMELINE_FILE = run_folder.TRACE_SUMMARY, run_folder.BUCKET_TIMELINE
IDLE_FILE, LAUNCH_FILE = run_folder.IDLE_BREAKDOWN, run_folder.LAUNCH_STATS
STRAGGLERS_FILE = run_folder.STRAGGLERS
CLASSES_FILE = run_folder.KERNEL_CLASSES
WAIT_FILE, RANK_TIMELINE_FILE = run_folder.COLLECTIVE_WAIT, run_folder.RANK_TIMELINE
# per-file inputs of the across-files analyses, never written: each rank's collective instances and its
# steps' windows and compute (collectives.py), and the instances aligned across ranks (waits.align)
COLLECTIVES, SEGMENTS, ALIGNED = "collectives", "segments", "aligned"
INSTANCE_COLUMNS = ("cell_id", "trace_file", "rank", "host", "world_size", "step", "collective",
                    "process_group", "seq", "bytes", "ordinal", "barrier", "start_us", "end_us")
SEGMENT_COLUMNS = ("trace_file", "step", "kind", "start_us", "end_us")


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
    trace: object              # bench.analyze.trace.Trace
    device: str                # cuda | rocm | cpu
    steps: list                # its ProfilerStep windows
    windows: list              # the steps, then `all`
    view: object               # GpuView or CpuView
    ident: dict                # cell_id, trace_file, rank: the first columns of every row

    @cached_property
    def collectives(self) -> tuple[list[dict], list[dict]]:
        """(instances, segments) of the file's collectives (bench/analyze/collectives.py)."""
        windows = self.steps or self.windows[-1:]
        if self.device == "cpu":
            return cpu_collectives(self.trace, self.view, windows)
        return gpu_collectives(self.trace, self.view, windows)


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


def _instances(t: OneTrace) -> list[dict]:
    host = t.trace.meta.get("host_name")
    size = (t.trace.meta.get("distributedInfo") or {}).get("world_size")
    return [{**t.ident, "host": host if isinstance(host, str) and host else None,
             "world_size": size if isinstance(size, int) else None, **row} for row in t.collectives[0]]


def _segments(t: OneTrace) -> list[dict]:
    return [{"trace_file": t.ident["trace_file"], **row} for row in t.collectives[1]]


# The analyses, registered: file name → (its columns, its rows). PER_FILE reads one trace file at a time;
# ACROSS_FILES compares files (ranks of a job) from the per-file tables, in this order (a later one may read
# an earlier one, or replace a per-file table: trace_summary gets its wait columns there). A new analysis
# is its module and one line here (its columns in columns.py, its file name in bench/run_folder/layout.py).
# Names outside TABLES (INTERNAL) feed the others and are not written.
PER_FILE = {
    SUMMARY_FILE: (TRACE_SUMMARY_COLUMNS, _summary),
    TIMELINE_FILE: (BUCKET_TIMELINE_COLUMNS, _timeline),
    IDLE_FILE: (IDLE_BREAKDOWN_COLUMNS, _idle),
    LAUNCH_FILE: (LAUNCH_STATS_COLUMNS, _launch),
    CLASSES_FILE: (KERNEL_CLASS_COLUMNS, _classes),
    COLLECTIVES: (INSTANCE_COLUMNS, _instances),
    SEGMENTS: (SEGMENT_COLUMNS, _segments),
}
ACROSS_FILES = {
    ALIGNED: (None, lambda tables: waits.align(tables[COLLECTIVES])),
    WAIT_FILE: (COLLECTIVE_WAIT_COLUMNS, lambda tables: waits.wait_rows(tables[ALIGNED], tables[SEGMENTS])),
    SUMMARY_FILE: (TRACE_SUMMARY_COLUMNS, lambda tables: waits.with_step_sums(
        tables[SUMMARY_FILE], tables[ALIGNED], tables[SEGMENTS])),
    STRAGGLERS_FILE: (STRAGGLER_COLUMNS, lambda tables: straggler_rows(tables[ALIGNED])),
    RANK_TIMELINE_FILE: (RANK_TIMELINE_COLUMNS, lambda tables: waits.timeline_rows(
        tables[ALIGNED], tables[SEGMENTS], tables[STRAGGLERS_FILE])),
}
INTERNAL = frozenset({COLLECTIVES, SEGMENTS, ALIGNED})
TABLES = {name: columns for name, (columns, _) in (PER_FILE | ACROSS_FILES).items() if name not in INTERNAL}


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


def _analyse_one(job: TraceJob) -> dict[str, pd.DataFrame] | str:
    """A worker's task: the file's per-file tables (columns travel and are held far more compactly than
    rows of dicts: a big GPU trace has thousands of collective instances and hidden-compute segments), or
    its error line."""
    try:
        rows = analyse_trace_tables(job)
    except TraceError as exc:
        return str(exc)
    return {name: _frame(rows[name], columns) for name, (columns, _) in PER_FILE.items()}


def default_workers(n_files: int) -> int:
    """Worker processes for n files: one per usable CPU (config.usable_cpus: the affinity mask, as the
    runner counts them), never more than the files."""
    return max(1, min(usable_cpus(), n_files))


def _per_file(jobs: list[TraceJob], workers: int, progress: Callable[[int, int], None] | None) -> list:
    """Each job's result (rows or error line), in the jobs' order; `progress(done, total)` after each."""
    if workers <= 1 or len(jobs) <= 1:
        out = []
        for job in jobs:
            out.append(_analyse_one(job))
            if progress:
                progress(len(out), len(jobs))
        return out
    # fork: the workers start with this process's modules loaded (no re-import per worker) and only the
    # job and the rows cross the process boundary; each worker holds one trace at a time, and dies with
    # this process (no worker outlives the command, bench/lifetime.py)
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else None)
    results: list = [None] * len(jobs)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=die_with_parent) as pool:
        futures = {pool.submit(_analyse_one, job): i for i, job in enumerate(jobs)}
        for done, future in enumerate(as_completed(futures), start=1):
            results[futures[future]] = future.result()
            if progress:
                progress(done, len(jobs))
    return results


def analyse_tables(jobs: Iterable[TraceJob], workers: int | None = 1, progress: Callable[[int, int], None]
                   | None = None) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Every table of TABLES as a DataFrame (contract columns, in order) and one error line per file that
    could not be analysed. `workers`: processes analysing files side by side (None: default_workers)."""
    jobs = list(jobs)
    parts: dict[str, list[pd.DataFrame]] = {name: [] for name in PER_FILE}
    errors = []
    for one in _per_file(jobs, default_workers(len(jobs)) if workers is None else workers, progress):
        if isinstance(one, str):
            errors.append(one)
            continue
        for name, frame in one.items():
            if len(frame):
                parts[name].append(frame)
    frames = {name: _frame(pd.concat(parts[name], ignore_index=True) if parts[name] else [], columns)
              for name, (columns, _) in PER_FILE.items()}
    for name, (_, across) in ACROSS_FILES.items():
        frames[name] = across(frames)
    return {name: frames[name] for name in TABLES}, errors


def _frame(rows: list[dict] | pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
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
           "analyse_trace_tables", "default_workers"]
