"""The physics terms' parameters from a run's own traces (`bench analyze`'s tables), not from defaults.

    interference γ = Σ_classes (overlapped_ms − overlapped_alone_ms) / Σ overlap_ms
        kernel_classes.csv: per kernel class, the compute kernels that ran under communication (and had a
        same-name twin that ran alone), their time, and the time their alone twins' medians give; the
        difference is what communication beside them cost. trace_summary.csv's `all` rows: overlap_ms =
        |communication ∩ compute|, the overlapped communication the term multiplies (physics.py). Summed
        over the trace files (ranks) of the configuration's cells that communicate, the base cell's first;
        below 0 (overlapped twins faster: shape noise) is 0.
    host_ms = median over profiled steps and ranks of launch_stats.csv's host_busy_ms of the base cell
        (the training thread's step window outside the calls that wait for the GPU): the floor a step cannot
        go below. A CPU run has none: its host is its compute, already in the step.

Each falls back to its documented default (physics.py) with a note saying why: no traces analysed, no
overlapped kernel with a lone twin, no launch statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.project.inputs import InputError
from bench.project.physics import DEFAULT_INTERFERENCE

ALL_STEPS = "all"  # trace_summary / launch_stats' whole-window row (bench.analyze.columns.ALL_STEPS)


@dataclass(frozen=True)
class TraceEvidence:
    """The tables of `bench analyze` the physics terms read; None where the run folder has none."""

    kernel_classes: pd.DataFrame | None
    trace_summary: pd.DataFrame | None
    launch_stats: pd.DataFrame | None


def _table(run_dir: Path, name: str, columns: tuple[str, ...]) -> pd.DataFrame | None:
    path = Path(run_dir) / name
    if not path.is_file():
        return None
    try:
        df = pd.read_csv(path, dtype={"cell_id": str, "step": str, "trace_file": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from exc
    return df if all(c in df.columns for c in columns) else None


def read_evidence(run_dir: Path) -> TraceEvidence:
    """The run's tables; a table written before a column existed counts as absent (no evidence)."""
    return TraceEvidence(
        _table(run_dir, run_folder.KERNEL_CLASSES, ("cell_id", "trace_file", "overlapped_ms",
                                                     "overlapped_alone_ms")),
        _table(run_dir, run_folder.TRACE_SUMMARY, ("cell_id", "trace_file", "step", "overlap_ms")),
        _table(run_dir, run_folder.LAUNCH_STATS, ("cell_id", "step", "host_busy_ms")))


# The least overlapped communication (ms, over a cell's trace files) a γ is measured from. γ divides by it:
# a compiled CPU cell whose gloo calls overlapped 0.013 ms of compute gave γ = 2.6 from 0.03 ms of kernel
# difference, noise, where the public GPU traces overlap 2.4-158 ms. Below it the next cell, or the default.
MIN_OVERLAP_MS = 1.0


def interference_of(evidence: TraceEvidence, cell_ids: list[str]) -> tuple[float, str]:
    """(γ, source words) from the first cell of `cell_ids` whose traces show overlapped kernels with lone
    twins (module docstring); the default and why when none does."""
    k, s = evidence.kernel_classes, evidence.trace_summary
    if k is None or s is None:
        why = "default (no kernel_classes.csv or trace_summary.csv with overlap columns)"
        return DEFAULT_INTERFERENCE, why
    for cell in cell_ids:
        mine = k[k["cell_id"] == cell]
        overlapped = float(mine["overlapped_ms"].fillna(0).sum())
        alone = float(mine["overlapped_alone_ms"].fillna(0).sum())
        rows = s[(s["cell_id"] == cell) & (s["step"] == ALL_STEPS)]
        rows = rows[rows["trace_file"].isin(mine["trace_file"])]
        overlap = float(rows["overlap_ms"].fillna(0).sum())
        if overlapped > 0 and overlap >= MIN_OVERLAP_MS:
            gamma = max(0.0, (overlapped - alone) / overlap)
            return gamma, (f"traces of {cell}: overlapped kernels {overlapped:.3f} ms vs {alone:.3f} ms "
                           f"alone, over {overlap:.3f} ms of overlapped communication")
    return DEFAULT_INTERFERENCE, (f"default (no trace with at least {MIN_OVERLAP_MS:g} ms of communication "
                                  "overlapping compute that also ran alone)")


def host_ms_of(evidence: TraceEvidence, cell_id: str, device: str) -> tuple[float, str]:
    """(host_ms, source words) for the base cell (module docstring); 0 and why when not measured."""
    if device == "cpu":
        return 0.0, "none (CPU run: the host is the compute, already in the step)"
    launch = evidence.launch_stats
    if launch is None:
        return 0.0, "none (no launch_stats.csv with host_busy_ms)"
    steps = launch[(launch["cell_id"] == cell_id) & (launch["step"] != ALL_STEPS)]["host_busy_ms"].dropna()
    if steps.empty:
        return 0.0, f"none (no profiled step of {cell_id} in launch_stats.csv)"
    return float(steps.median()), f"launch_stats host_busy_ms of {cell_id} (median of {len(steps)} steps)"
