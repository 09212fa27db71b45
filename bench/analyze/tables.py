"""The report's "Why" tables, as pure functions of trace_summary.csv and results.csv (DataFrames in, out).

- rank_summary: the whole-window row of every (cell, trace file, rank), with the run's engine and world size.
- breakdown: per (engine, world_size), the mean step split into compute alone / hidden communication /
  exposed communication / memory alone / idle, which add up to the span, with all-reduce share and overlap.
- two_witnesses: per cell, exposed communication from the timers beside the trace's, and whether they
  disagree by more than their noise.
- seeds_table: per cell, the seeds' table (GPU util, SM efficiency, occupancy, CPU exec, kernels,
  communication, all-reduce share) from the traces.
Definitions: docs/design.md, "bench analyze".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analyze.columns import ALL_STEPS

RUN_KEYS = ("engine", "world_size", "grad_accum", "precision", "bucket_cap_mb")

# seeds_table's columns and the headings of the seeds' TensorBoard table they reproduce.
SEEDS_HEADINGS = {
    "gpu_util_pct": "GPU util %",
    "sm_efficiency_pct": "SM efficiency %",
    "achieved_occupancy_pct": "achieved occupancy %",
    "cpu_exec_pct": "CPU exec % of the step",
    "kernels_pct": "kernels %",
    "communication_pct": "communication %",
    "allreduce_share_of_kernel_pct": "all-reduce % of kernel time",
}


def _with_run(frame: pd.DataFrame, results: pd.DataFrame | None) -> pd.DataFrame:
    """Join the run's configuration keys onto rows by cell_id (left join; rows outside a run keep NaN)."""
    if results is None or "cell_id" not in results:
        return frame
    keys = ["cell_id", *[k for k in RUN_KEYS if k in results.columns]]
    return frame.merge(results[keys].drop_duplicates("cell_id"), on="cell_id", how="left")


def _per_step(summary: pd.DataFrame) -> pd.DataFrame:
    """The profiled-step rows; a file without ProfilerStep marks contributes its whole-window row."""
    steps = summary[summary["step"].astype(str) != ALL_STEPS]
    stepless = ~summary["trace_file"].isin(steps["trace_file"]) & (summary["step"].astype(str) == ALL_STEPS)
    return pd.concat([steps, summary[stepless]], ignore_index=True)


def rank_summary(summary: pd.DataFrame, results: pd.DataFrame | None = None) -> pd.DataFrame:
    """Whole-window rows per (cell, trace file, rank), with n_steps and the run's keys."""
    whole = summary[summary["step"].astype(str) == ALL_STEPS].copy()
    counts = summary[summary["step"].astype(str) != ALL_STEPS].groupby("trace_file").size()
    whole.insert(4, "n_steps", whole["trace_file"].map(counts).fillna(0).astype(int))
    return _with_run(whole, results).sort_values(["cell_id", "rank"], na_position="last", ignore_index=True)


def breakdown(summary: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, world_size): mean ms per step of each part of the span, all-reduce share, overlap %.

    compute_alone = compute − overlap; hidden_comm = overlap; exposed_comm = comm − overlap;
    memory_alone = busy − compute − exposed_comm (GPU only); idle = span − busy. They sum to span_ms.
    overlap_pct is Σ overlap / Σ comm over the rows (not a mean of ratios).
    """
    rows = _with_run(_per_step(summary), results)
    rows = rows.assign(
        compute_alone_ms=rows["compute_ms"] - rows["overlap_ms"],
        hidden_comm_ms=rows["overlap_ms"],
        memory_alone_ms=(rows["busy_ms"] - rows["compute_ms"] - rows["exposed_comm_ms"]).where(
            rows["memory_ms"].notna()),
    )
    parts = ["compute_alone_ms", "hidden_comm_ms", "exposed_comm_ms", "memory_alone_ms", "idle_ms", "span_ms"]
    grouped = rows.groupby(["engine", "world_size"], dropna=False)
    out = grouped[parts].mean()
    out["allreduce_share_pct"] = grouped["allreduce_share_of_kernel_pct"].mean()
    comm = grouped["comm_ms"].sum()
    out["overlap_pct"] = (100 * grouped["overlap_ms"].sum() / comm).where(comm > 0)
    out["n_cells"] = grouped["cell_id"].nunique()
    return out.reset_index()


def two_witnesses(summary: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Per cell: exposed communication per step from the timers and from the trace, and their difference.

    timer = results.exposed_comm_ms (p50 step − p50 compute-only step), noise = half the width of its 95 %
    interval (exposed_comm_ms_ci95_low/high) where the run has one, else step p90 − p50 (older runs).
    trace = median of exposed_comm_ms over the cell's profiled steps on every rank, noise = their range
    (max − min). `disagree` when |trace − timer| > timer noise + trace noise; empty when a side is missing.
    """
    steps = _per_step(summary).dropna(subset=["cell_id"])
    trace = steps.groupby("cell_id")["exposed_comm_ms"].agg(
        trace_exposed_comm_ms="median", trace_noise_ms=lambda s: s.max() - s.min())
    keep = [c for c in ("cell_id", "engine", "world_size", "grad_accum", "exposed_comm_ms",
                        "step_time_ms_p50", "step_time_ms_p90") if c in results.columns]
    out = results[keep].rename(columns={"exposed_comm_ms": "timer_exposed_comm_ms"})
    spread = results["step_time_ms_p90"] - results["step_time_ms_p50"]
    if {"exposed_comm_ms_ci95_low", "exposed_comm_ms_ci95_high"} <= set(results.columns):
        half = (results["exposed_comm_ms_ci95_high"] - results["exposed_comm_ms_ci95_low"]) / 2
        spread = half.where(half.notna(), spread)
    out["timer_noise_ms"] = spread
    out = out.drop(columns=["step_time_ms_p50", "step_time_ms_p90"]).merge(
        trace.reset_index(), on="cell_id", how="inner")
    out["difference_ms"] = out["trace_exposed_comm_ms"] - out["timer_exposed_comm_ms"]
    noise = out["timer_noise_ms"] + out["trace_noise_ms"]
    disagree = out["difference_ms"].abs() > noise
    out["disagree"] = disagree.astype("boolean").where(out["difference_ms"].notna() & noise.notna())
    return out.reset_index(drop=True)


def seeds_table(summary: pd.DataFrame, results: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per cell, the seeds' table from the whole-window rows, averaged over ranks (headings: SEEDS_HEADINGS).

    kernels_pct = compute_ms / span_ms and communication_pct = exposed_comm_ms / span_ms (the GPU span; on a
    CPU trace, operator time and exposed collective time over the CPU span); the others are the summary's.
    """
    whole = summary[summary["step"].astype(str) == ALL_STEPS].copy()
    span = whole["span_ms"].where(whole["span_ms"] > 0)
    whole["kernels_pct"] = 100 * whole["compute_ms"] / span
    whole["communication_pct"] = 100 * whole["exposed_comm_ms"] / span
    cols = list(SEEDS_HEADINGS)
    out = whole.groupby("cell_id", dropna=False)[cols].mean().reset_index()
    out = _with_run(out, results)
    lead = [c for c in ("cell_id", *RUN_KEYS) if c in out.columns]
    return out[lead + cols].replace({np.inf: np.nan})
