"""Reports from results/<run-id>/ folders: one run (`build_report`), several (compare), trace viewers.

Analysis functions take and return pandas DataFrames (tables.py, run_ledger.py, compare.py with
comparability.py and compare_shift.py, findings.py, slices.py); the plots/ package draws them and render.py
writes HTML and Markdown; run_page.py and compare_page.py assemble the pages from those; commands.py holds
the `report`, `compare` and `tensorboard` commands. Nothing here imports torch.distributed.
"""

from __future__ import annotations

from pathlib import Path


def build_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Tables, plots, index.html and summary.md for `run_dir`; returns the index.html path."""
    from bench.report.run_page import write_run_page  # pandas/matplotlib only when a report is made

    return write_run_page(Path(run_dir), None if out_dir is None else Path(out_dir))


__all__ = ["build_report"]
