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
overlapped kernel with a lone twin, no launch statistics. σ, the per-rank step-time spread the straggler
draws from, comes from the base cell's own row (step_cv_of). with_evidence attaches all three to a
configuration; physics_of gives a configuration's terms (those, else σ from its row and the defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.project.configuration import Configuration
from bench.project.inputs import InputError
from bench.project.physics import DEFAULT_INTERFERENCE, Physics, expected_max_normal

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


Z90 = 1.2816  # the standard normal's 90th percentile


def step_cv_of(row: pd.Series) -> tuple[float, str]:
    """σ, the per-rank step-time spread (standard deviation / median) the straggler term draws from, and
    where it came from. On more than one rank the median slowest-minus-fastest gap is the expected range
    of n draws, 2·σ·T·E[Z_(n)]: the gap is rank_skew_ms_p50, taken in the compute-only rounds where each
    rank's step is its own work (a timed step ends on every rank with its last collective, so its gap is
    ≈ 0 under NCCL), over those rounds' median compute_only_ms_p50 (else the step's); on one rank,
    (p90 − p50)/z90 over p50; else 0 (nothing measured)."""
    t = row.get("step_time_ms_p50")
    if pd.isna(t) or not t > 0:
        return 0.0, "no step times"
    n = int(row["world_size"])
    skew, compute = row.get("rank_skew_ms_p50"), row.get("compute_only_ms_p50")
    if n > 1 and not pd.isna(skew):
        base = compute if not pd.isna(compute) and compute > 0 else t
        return max(0.0, skew / (2 * base * expected_max_normal(n))), f"rank_skew_ms_p50 of {row['cell_id']}"
    p90 = row.get("step_time_ms_p90")
    if not pd.isna(p90):
        return max(0.0, (p90 - t) / Z90 / t), f"step_time_ms p90/p50 of {row['cell_id']}"
    return 0.0, "no step-time spread"


def physics_of(config: Configuration) -> Physics:
    """The physics terms of a measured configuration: those with_evidence attached, else σ from its base
    cell (step_cv_of), interference at its documented default and no host floor."""
    return config.physics if config.physics is not None else Physics(step_cv=step_cv_of(config.base)[0])


def with_evidence(config: Configuration, evidence: TraceEvidence | None) -> Configuration:
    """The configuration with its physics from the run: σ from its base cell (step_cv_of), γ from the
    traces of its communicating cells (the base cell first), host_ms from the base cell's launch
    statistics (bench/project/evidence.py); physics_source says where each came from."""
    cv, cv_source = step_cv_of(config.base)
    cells = [c for c, n in zip(config.rows["cell_id"], config.rows["world_size"]) if int(n) > 1]
    evidence = evidence or TraceEvidence(None, None, None)
    gamma, gamma_source = interference_of(evidence, cells)
    host, host_source = host_ms_of(evidence, config.base["cell_id"], str(config.base.get("device", "")))
    source = f"σ {cv:.4g}: {cv_source}; γ {gamma:.4g}: {gamma_source}; host {host:.4g} ms: {host_source}"
    return replace(config, physics=Physics(step_cv=cv, interference_factor=gamma, host_ms=host),
                   physics_source=source)
