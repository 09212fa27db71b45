"""`bench analyze` as a function: `run(path, out)` plans the trace files of a run folder, a folder or one
file, analyses them (bench/analyze/summary.py), writes the tables and, for a run folder, the two witnesses of
exposed communication, and returns what it found as an `Analysis`. The command (cli.py) prints it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.analyze import tables as witness_tables
from bench.analyze.load import find_trace_files
from bench.analyze.summary import (
    SUMMARY_FILE,
    TABLES,
    TIMELINE_FILE,
    WAIT_FILE,
    TraceJob,
    analyse_tables,
    default_workers,
)
from bench.worker import hangs  # the hang records' owner writes them in the ranks and reads them back


class AnalyzeInputError(Exception):
    """PATH or results.csv cannot be used: one line naming the key and the value."""


class NoTraces(AnalyzeInputError):
    """A run folder none of whose cells has a trace file: nothing to analyse (profiling was off, or no
    profiled cell got to its profiled pass)."""


@dataclass
class Analysis:
    """The tables of one `bench analyze` (file name → rows), where they went, and what could not be read."""

    tables: dict[str, pd.DataFrame]
    out: Path
    files: int                                        # trace files planned
    errors: list[str] = field(default_factory=list)   # one line per file or cell that could not be analysed
    witnesses: pd.DataFrame | None = None             # a run folder's two witnesses (witnesses.csv)
    witnesses_note: str = ""                          # why there are none, for a run folder
    seconds: float = 0.0                              # the analysis's wall time
    stuck: pd.DataFrame | None = None                 # a run folder's hung ranks (hangs.csv), if any

    @property
    def stuck_lines(self) -> list[str]:
        if self.stuck is None or not len(self.stuck):
            return []
        return [f"hangs: {self.out / hangs.HANGS_FILE}", *hangs.lines(self.stuck)]

    @property
    def analysed(self) -> int:
        """Trace files that gave rows."""
        return int(self.tables[SUMMARY_FILE]["trace_file"].nunique()) if self.tables else 0

    def lines(self) -> list[str]:
        """What `bench analyze` prints (its errors go to stderr, one line each, before these)."""
        if not self.tables:  # a run folder with hung ranks and no traces: where they were stuck
            return [f"no trace files to analyse; {len(self.stuck)} hung rank(s) read", *self.stuck_lines]
        return self.stuck_lines + self.trace_lines()

    def trace_lines(self) -> list[str]:
        out = self.out
        waits = self.tables[WAIT_FILE]
        lines = [f"collective waits: {out / WAIT_FILE} ({waits['job'].nunique()} multi-rank jobs; "
                 f"{waits['clock'].iloc[0]})"] if len(waits) else []
        lines += [f"analysed {self.analysed}/{self.files} trace files in {self.seconds:.1f} s",
                  f"summary: {out / SUMMARY_FILE}", f"bucket timeline: {out / TIMELINE_FILE}"]
        others = [n for n in self.tables if n not in (SUMMARY_FILE, TIMELINE_FILE, WAIT_FILE)]
        lines.append(f"also: {', '.join(str(out / n) for n in others)}")
        if self.witnesses is not None:
            n_dis = int(self.witnesses["disagree"].fillna(False).sum())
            lines.append(f"witnesses: {out / run_folder.WITNESSES} ({n_dis} of {len(self.witnesses)} cells "
                         f"disagree)")
        elif self.witnesses_note:
            lines.append(f"witnesses: not written ({self.witnesses_note})")
        return lines


def run_jobs(run_dir: Path) -> tuple[list[TraceJob], list[str]]:
    """One job per trace file of every cell in results.csv that has a trace_dir, and one error line per
    cell whose trace_dir holds no trace file."""
    try:
        results = run_folder.read_results_csv(run_dir)
    except (OSError, run_folder.RunError) as exc:
        raise AnalyzeInputError(f"{run_dir / run_folder.RESULTS}: cannot read: {exc}") from exc
    for column in ("cell_id", "trace_dir"):
        if column not in results.columns:
            raise AnalyzeInputError(f"{run_dir / run_folder.RESULTS}: missing column {column!r}")
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


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and (path / run_folder.RESULTS).is_file()


def plan(path: Path, out: Path | None) -> tuple[list[TraceJob], list[str], Path]:
    """The jobs, the error lines found while planning them, and the output folder for PATH;
    AnalyzeInputError when PATH cannot be analysed at all."""
    missing: list[str] = []
    if not path.exists():
        raise AnalyzeInputError(f"path {str(path)!r} does not exist")
    if is_run_folder(path):
        (jobs, missing), default_out = run_jobs(path), path
        if not jobs:
            raise NoTraces(f"{path / run_folder.RESULTS}: no cell has trace files under its trace_dir")
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
    # a file; another command's part of a run folder, or analyze's own of another run than PATH; a user's
    problem = run_folder.out_problem(out, "analyze", path, FILES)
    if problem:
        raise AnalyzeInputError(problem)
    return jobs, missing, out


def run(path: Path | str, out: Path | str | None = None, workers: int | None = None,
        progress: Callable[[int, int], None] | None = None) -> Analysis:
    """Analyse the traces of PATH (a run folder, a folder of traces or one trace file) into `out` (default:
    the run folder, else the current folder): every table of summary.TABLES and, for a run folder, the
    witnesses; `workers` processes side by side, one file each (None: one per usable CPU, at most one per
    file), `progress(done, total)` after each file. AnalyzeInputError (nothing written) when PATH cannot be
    analysed at all; a file that cannot be read is one line of `errors` and the others are still analysed."""
    if workers is not None and workers < 1:
        raise AnalyzeInputError(f"--workers {workers}: must be at least 1")
    path = Path(path)
    stuck = hangs.read(path) if is_run_folder(path) else None
    try:
        jobs, missing, out = plan(path, None if out is None else Path(out))
    except NoTraces:
        if stuck is None or not len(stuck):
            raise
        return write_stuck_only(path, None if out is None else Path(out), stuck)
    t0 = time.perf_counter()
    workers = default_workers(len(jobs)) if workers is None else min(workers, len(jobs))
    tables, errors = analyse_tables(jobs, workers, progress)
    analysis = Analysis(tables=tables, out=out, files=len(jobs), errors=missing + errors, stuck=stuck)
    if not analysis.analysed:  # tables of headers only would read as an analysis that found nothing
        more = " …" if len(errors) > 3 else ""
        raise AnalyzeInputError(f"none of the {len(jobs)} trace file(s) of path {str(path)!r} could be read "
                                f"(nothing written): {'; '.join(errors[:3])}{more}")
    with run_folder.writing(out, "analyze", path, FILES) as stage:  # only analyze's own files replaced
        for name, frame in tables.items():
            frame.to_csv(stage / name, index=False)
        if stuck is not None and len(stuck):
            stuck.to_csv(stage / hangs.HANGS_FILE, index=False)
        if is_run_folder(path):
            # the report reads this file and never recomputes it
            try:
                results = run_folder.load_run(path).results
            except run_folder.RunError as exc:  # rows without the timers' columns: no witness to compare
                analysis.witnesses_note = str(exc)
            else:
                analysis.witnesses = witness_tables.witnesses(tables[SUMMARY_FILE], results)
                analysis.witnesses.to_csv(stage / run_folder.WITNESSES, index=False)
    analysis.seconds = time.perf_counter() - t0
    return analysis


def write_stuck_only(path: Path, out: Path | None, stuck: pd.DataFrame) -> Analysis:
    """A run folder with no traces but with hung ranks (a launch that timed out before its profiled pass):
    hangs.csv alone, into `out` (default: the run folder)."""
    out = out if out is not None else path
    problem = run_folder.out_problem(out, "analyze", path, FILES)
    if problem:
        raise AnalyzeInputError(problem)
    with run_folder.writing(out, "analyze", path, FILES) as stage:
        stuck.to_csv(stage / hangs.HANGS_FILE, index=False)
    return Analysis(tables={}, out=out, files=0, stuck=stuck)


# what `bench analyze` writes into its folder: its tables, the witnesses and where hung ranks were stuck
FILES = (*TABLES, run_folder.WITNESSES, hangs.HANGS_FILE)
