"""Reports from results/<run-id>/ folders: one run (`build_report`), several (`compare`), trace viewers.

Analysis functions take and return pandas DataFrames (tables.py, compare.py); plotting (plots.py) and
rendering (render.py) are thin layers on top. Nothing here imports torch.distributed.
"""

from __future__ import annotations

from pathlib import Path


def build_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Tables, plots, index.html and summary.md for `run_dir`; returns the index.html path."""
    from bench.report.build import build_report as _build  # pandas/matplotlib only when a report is made

    return _build(Path(run_dir), None if out_dir is None else Path(out_dir))


__all__ = ["build_report"]
