"""Why run B differs from run A in its traces (bench/analyze/diff.py): each run's trace tables, read from its
folder when `bench analyze` wrote them or analysed now, and per other run the differences by part of the step
and by kernel class against the baseline."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.analyze import diff
from bench.analyze.api import AnalyzeInputError, run_jobs
from bench.analyze.summary import CLASSES_FILE, SUMMARY_FILE, analyse_tables
from bench.report import tables
from bench.report.compare import run_labels
from bench.run_folder import Run
from bench.schema import CONFIG_KEYS


def trace_tables(run: Run, out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The run's trace_summary.csv and kernel_classes.csv: read from the run folder when `bench analyze`
    wrote both there (with window_ms), else analysed now into out_dir (the run folder is left as it is).
    None when no cell has traces."""
    summary_csv, classes_csv = run.path / SUMMARY_FILE, run.path / CLASSES_FILE
    if summary_csv.is_file() and classes_csv.is_file():
        summary = pd.read_csv(summary_csv, dtype={"cell_id": str, "step": str})
        if "window_ms" in summary:
            return summary, pd.read_csv(classes_csv, dtype={"cell_id": str})
    if "trace_dir" not in run.results or not run.results["trace_dir"].fillna("").astype(str).str.len().any():
        return None
    try:
        jobs, _ = run_jobs(run.path)
    except AnalyzeInputError:
        return None
    tables, _ = analyse_tables(jobs)
    summary, classes = tables[SUMMARY_FILE], tables[CLASSES_FILE]
    if not len(summary):
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    summary.to_csv(out_dir / SUMMARY_FILE, index=False)
    classes.to_csv(out_dir / CLASSES_FILE, index=False)
    return summary, classes


def config_labels(run: Run) -> dict[str, str]:
    """cell_id → its configuration in words (CONFIG_KEYS joined with '|'), the key both runs share."""
    return dict(zip(run.results["cell_id"].astype(str), tables.config_key(run.results, CONFIG_KEYS)))


def trace_diffs(runs: list[Run], out_dir: Path) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """Per other run with traces of a configuration the baseline also traced: (label, part_diff,
    class_diff) against the baseline. Runs without traces are left out."""
    labels = run_labels(runs)
    tables_ = [trace_tables(r, out_dir / "traces" / label) for r, label in zip(runs, labels)]
    if tables_[0] is None:
        return []
    base = diff.profile(*tables_[0], config_labels(runs[0]))
    out = []
    for label, run, t in zip(labels[1:], runs[1:], tables_[1:]):
        if t is None:
            continue
        other = diff.profile(*t, config_labels(run))
        parts = diff.part_diff(base[0], other[0])
        if len(parts):
            out.append((label, parts, diff.class_diff(base[1], other[1])))
    return out
