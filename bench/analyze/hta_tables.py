"""The report's per-cell summaries of idle_breakdown.csv, launch_stats.csv and stragglers.csv (pure functions,
DataFrames in and out; definitions: docs/analysis.md).

Each averages the profiled-step rows (not `all`), so a cell's figure is "per step", like the breakdown.
"""

from __future__ import annotations

import pandas as pd

from bench.analyze.columns import ALL_STEPS
from bench.analyze.stragglers import persistent_stragglers


def _steps(frame: pd.DataFrame) -> pd.DataFrame:
    """Step rows; a file without ProfilerStep marks contributes its `all` row."""
    step = frame["step"].astype(str)
    stepless = ~frame["trace_file"].isin(frame.loc[step != ALL_STEPS, "trace_file"])
    return frame[(step != ALL_STEPS) | stepless]


def idle_table(idle: pd.DataFrame) -> pd.DataFrame:
    """Per cell: ms per step (mean over steps and ranks) each stream category waited, summed over streams."""
    parts = ["idle_ms", "host_wait_ms", "kernel_wait_ms", "other_wait_ms"]
    rows = _steps(idle.dropna(subset=["cell_id"]))
    per_step = rows.groupby(["cell_id", "trace_file", "step"])[parts].sum()
    out = per_step.groupby("cell_id")[parts].mean()
    out["host_wait_pct"] = (100 * out["host_wait_ms"] / out["idle_ms"]).where(out["idle_ms"] > 0)
    return out.reset_index()


def launch_table(launch: pd.DataFrame) -> pd.DataFrame:
    """Per cell: launches per step, the median step's launch delay, short kernels, host time per launch,
    GPU busy and host wait (means over steps and ranks), and how many steps were launch-bound."""
    rows = _steps(launch.dropna(subset=["cell_id"]))
    g = rows.groupby("cell_id")
    out = g[["launches", "short_kernels_pct", "host_us_per_launch", "gpu_busy_pct", "host_wait_pct"]].mean()
    out.insert(1, "launch_delay_us_p50", g["launch_delay_us_p50"].median())
    bound = rows["launch_bound"].astype("boolean").fillna(False).astype(bool)
    out["launch_bound_steps"] = bound.groupby(rows["cell_id"]).sum().astype(int)
    out["steps"] = g.size()
    return out.reset_index()


# A cell is host-bound when its GPU computes less than this share of the profiled step: the GPU presets'
# sizing target (docs/gpu-node.md "Sizing"). Below it the step's length is the host's enqueueing of
# kernels, and a comparison of engines there measures their host overhead, not their communication.
HOST_BOUND_BUSY_PCT = 70.0


def host_bound_cells(launch: pd.DataFrame) -> pd.DataFrame:
    """Per profiled cell of launch_stats.csv (GPU traces): gpu_busy_pct (mean over its steps and ranks, as
    launch_table) and host_bound (below HOST_BOUND_BUSY_PCT). The one definition the report and the
    advice read: a verdict between host-bound cells is about host overhead."""
    table = launch_table(launch)[["cell_id", "gpu_busy_pct"]] if len(launch) else pd.DataFrame(
        columns=["cell_id", "gpu_busy_pct"])
    return table.assign(host_bound=table["gpu_busy_pct"] < HOST_BOUND_BUSY_PCT)


def straggler_table(stragglers: pd.DataFrame, results: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per job: the rank last in most steps (persistent when more than half), beside the timers' view from
    results.csv (slowest_rank, rank_skew_ms_p50) where the run has it."""
    out = persistent_stragglers(stragglers)
    if results is not None and len(out):
        keep = [c for c in ("cell_id", "slowest_rank", "rank_skew_ms_p50") if c in results.columns]
        if "cell_id" in keep and len(keep) > 1:
            out = out.merge(results[keep].drop_duplicates("cell_id"), on="cell_id", how="left")
    return out
