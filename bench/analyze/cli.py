"""`python -m bench analyze PATH [--out DIR] [--workers N]`: trace_summary.csv, bucket_timeline.csv,
idle_breakdown.csv, launch_stats.csv, kernel_classes.csv, collective_wait.csv, stragglers.csv and
rank_timeline.csv (summary.TABLES) from Kineto traces, each file in a worker process of its own, and for a
run folder witnesses.csv (the two witnesses of exposed communication, bench.analyze.tables).

PATH is a run folder (results/<run-id>: its results.csv maps each cell's `trace_dir` to cell_id and
engine), a folder of traces, or one trace file; any `*.json` / `*.json.gz` Chrome trace is accepted. The
outputs go to --out, else to the run folder, else to the current folder. A file that cannot be read gets
one error line and the others are still analysed (exit status 1); bad arguments exit 2 before anything is
written.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import run_folder
from bench.analyze import tables as witness_tables
from bench.analyze.load import find_trace_files
from bench.analyze.summary import (
    SUMMARY_FILE,
    TIMELINE_FILE,
    WAIT_FILE,
    TraceJob,
    analyse_tables,
    default_workers,
)

RESULTS_FILE, WITNESS_FILE = run_folder.RESULTS, run_folder.WITNESSES


class AnalyzeInputError(Exception):
    """PATH or results.csv cannot be used: one line naming the key and the value."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path,
                        help="a results/<run-id>/ folder, a folder of traces, or one trace file")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: the run folder, else the current folder)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes analysing trace files side by side, one file each at a time "
                             "(default: one per usable CPU, at most one per file)")


def run_jobs(run_dir: Path) -> tuple[list[TraceJob], list[str]]:
    """One job per trace file of every cell in results.csv that has a trace_dir, and one error line per
    cell whose trace_dir holds no trace file."""
    try:
        results = run_folder.read_results_csv(run_dir)
    except (OSError, run_folder.RunError) as exc:
        raise AnalyzeInputError(f"{run_dir / RESULTS_FILE}: cannot read: {exc}") from exc
    for column in ("cell_id", "trace_dir"):
        if column not in results.columns:
            raise AnalyzeInputError(f"{run_dir / RESULTS_FILE}: missing column {column!r}")
    jobs, missing = [], []
    for row in results.itertuples(index=False):
        trace_dir = row.trace_dir
        if not isinstance(trace_dir, str) or not trace_dir:
            continue  # a cell that was not profiled (or failed first)
        folder = run_dir / trace_dir
        engine = getattr(row, "engine", None)
        files = find_trace_files(folder) if folder.is_dir() else []
        if not files:
            missing.append(f"{folder}: cell {row.cell_id}: no trace files in its trace_dir")
        for path in files:
            jobs.append(TraceJob(path, str(path.relative_to(run_dir)), row.cell_id,
                                 engine if isinstance(engine, str) else None))
    return jobs, missing


def plan(path: Path, out: Path | None) -> tuple[list[TraceJob], list[str], Path]:
    """The jobs, the error lines found while planning them, and the output folder for PATH;
    AnalyzeInputError when PATH cannot be analysed at all."""
    missing: list[str] = []
    if not path.exists():
        raise AnalyzeInputError(f"path {str(path)!r} does not exist")
    if path.is_dir() and (path / RESULTS_FILE).is_file():
        (jobs, missing), default_out = run_jobs(path), path
        if not jobs:
            raise AnalyzeInputError(f"{path / RESULTS_FILE}: no cell has trace files under its trace_dir")
    elif path.is_dir():
        jobs = [TraceJob(p, str(p.relative_to(path))) for p in find_trace_files(path)]
        default_out = Path.cwd()
        if not jobs:
            raise AnalyzeInputError(f"path {str(path)!r}: no *.json or *.json.gz trace files in it")
    else:
        if not path.name.endswith((".json", ".json.gz")):
            raise AnalyzeInputError(f"path {str(path)!r}: not a *.json or *.json.gz trace file")
        jobs, default_out = [TraceJob(path, path.name)], Path.cwd()
    out = out if out is not None else default_out
    if out.exists() and not out.is_dir():
        raise AnalyzeInputError(f"--out {str(out)!r} exists and is not a folder")
    return jobs, missing, out


class Progress:
    """`bench analyze: k/N trace files, s` on stderr as files finish, at most one line every PROGRESS_S
    (and the last file always), for a folder of many traces; nothing for a single file."""

    PROGRESS_S = 2.0  # a line every 2 s: a thousand files leave a readable log, a stalled one shows

    def __init__(self, total: int, workers: int, t0: float):
        self.total, self.workers, self.t0, self.last = total, workers, t0, t0

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if total > 1 and (now - self.last >= self.PROGRESS_S or done == total):
            self.last = now
            print(f"bench analyze: {done}/{total} trace files, {now - self.t0:.1f} s "
                  f"({self.workers} worker process{'es' if self.workers > 1 else ''})", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    workers = args.workers
    try:
        if workers is not None and workers < 1:
            raise AnalyzeInputError(f"--workers {workers}: must be at least 1")
        jobs, missing, out = plan(args.path, args.out)
    except AnalyzeInputError as exc:
        print(f"bench analyze: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    workers = default_workers(len(jobs)) if workers is None else min(workers, len(jobs))
    tables, errors = analyse_tables(jobs, workers, Progress(len(jobs), workers, t0))
    errors = missing + errors
    for line in errors:
        print(f"bench analyze: {line}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(out / name, index=False)
    if len(tables[WAIT_FILE]):
        print(f"collective waits: {out / WAIT_FILE} ({tables[WAIT_FILE]['job'].nunique()} multi-rank jobs; "
              f"{tables[WAIT_FILE]['clock'].iloc[0]})")
    n_ok = tables[SUMMARY_FILE]["trace_file"].nunique()
    print(f"analysed {n_ok}/{len(jobs)} trace files in {time.perf_counter() - t0:.1f} s")
    print(f"summary: {out / SUMMARY_FILE}")
    print(f"bucket timeline: {out / TIMELINE_FILE}")
    others = [n for n in tables if n not in (SUMMARY_FILE, TIMELINE_FILE, WAIT_FILE)]
    print(f"also: {', '.join(str(out / n) for n in others)}")
    if args.path.is_dir() and (args.path / RESULTS_FILE).is_file():
        # the report reads this file and never recomputes it
        try:
            results = run_folder.load_run(args.path).results
        except run_folder.RunError as exc:  # rows without the timers' columns: no witness to compare
            print(f"witnesses: not written ({exc})")
        else:
            witnesses = witness_tables.witnesses(tables[SUMMARY_FILE], results)
            witnesses.to_csv(out / WITNESS_FILE, index=False)
            n_dis = int(witnesses["disagree"].fillna(False).sum())
            print(f"witnesses: {out / WITNESS_FILE} ({n_dis} of {len(witnesses)} cells disagree)")
    return 1 if errors else 0
