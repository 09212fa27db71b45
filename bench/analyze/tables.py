"""Per-cell tables from the analysis and the timers, as pure functions of trace_summary.csv and results.csv
(DataFrames in, out): `bench analyze` writes witnesses.csv from them, the report's Why section shows them.

- rank_summary: the whole-window row of every (cell, trace file, rank), with the run's engine and world size.
- breakdown: per (engine, world_size), the mean step split into compute alone / hidden communication /
  exposed communication / memory alone / idle, which add up to the span, with all-reduce share and overlap.
- witnesses: per profiled cell, exposed communication from the timers (less the engine's sync overhead,
  sync_overhead) beside the trace's (less the profiled pass's barrier), and whether their intervals part.
- wait_table: per multi-rank cell, how much of the exposed communication waited for the last rank, and
  for which rank (stragglers.csv).
- seeds_table: per cell, the seeds' table (GPU util, SM efficiency, occupancy, CPU exec, kernels,
  communication, all-reduce share) from the traces.
Definitions: docs/analysis.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analyze.columns import ALL_STEPS, WITNESS_COLUMNS
from bench.analyze.stragglers import persistent_stragglers

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


# What must match for a world-size-1 cell to measure another cell's sync overhead: the engine's work
# outside communication depends on the engine, the gradients (model, dtype, buckets) and how often it syncs.
# The engine's options too: a comm hook's compression (PowerSGD's matmuls) or a compiled graph is work that
# no_sync skips or changes, which a plain cell of the same engine does not measure.
SYNC_KEYS = ("engine", "engine_options", "model", "model_size", "seq_len", "bucket_cap_mb", "precision",
             "comm_dtype", "grad_accum")
SYNC_COLUMNS = ["sync_overhead_ms", "sync_overhead_ms_low", "sync_overhead_ms_high"]


def _step_minus_compute(results: pd.DataFrame) -> pd.DataFrame:
    """results.exposed_comm_ms (p50 step − p50 compute-only) with its 95 % interval; a run without the
    interval columns (older) gets ± (step p90 − p50)."""
    value = results["exposed_comm_ms"]
    spread = results.get("step_time_ms_p90", np.nan) - results.get("step_time_ms_p50", np.nan)
    low = results.get("exposed_comm_ms_ci95_low", pd.Series(np.nan, index=results.index))
    high = results.get("exposed_comm_ms_ci95_high", pd.Series(np.nan, index=results.index))
    return pd.DataFrame({"value": value, "low": low.where(low.notna(), value - spread),
                         "high": high.where(high.notna(), value + spread)}, index=results.index)


def sync_overhead(results: pd.DataFrame) -> pd.DataFrame:
    """Per results row: what no_sync skips besides communication, from the world-size-1 cell of the same
    SYNC_KEYS and per-rank batch (at world size 1, the cell itself), else the one of the nearest per-rank
    batch (the larger on a tie), named in `sync_overhead_from`. Columns SYNC_COLUMNS, sync_overhead_from."""
    diff = _step_minus_compute(results)
    keys = [k for k in SYNC_KEYS if k in results.columns]
    key = pd.Series([tuple(map(str, r)) for r in results[keys].itertuples(index=False)], index=results.index)
    batch = results.get("per_rank_batch", pd.Series(np.nan, index=results.index)).astype(float)
    ones = results.index[(results["world_size"] == 1) & diff["value"].notna()]
    out = pd.DataFrame(np.nan, index=results.index, columns=SYNC_COLUMNS)
    out["sync_overhead_from"] = pd.Series(pd.NA, index=results.index, dtype="string")
    for i in results.index:
        candidates = [j for j in ones if key[j] == key[i]]
        if not candidates:
            continue
        gap = {j: abs(batch[j] - batch[i]) if pd.notna(batch[j] - batch[i]) else 0.0 for j in candidates}
        j = min(candidates, key=lambda j: (gap[j], -batch[j] if pd.notna(batch[j]) else 0.0))
        out.loc[i, SYNC_COLUMNS] = diff.loc[j].to_numpy()
        source = results.at[j, "cell_id"]
        if gap[j] > 0:
            source = f"{source} (per-rank batch {batch[j]:g}, none at {batch[i]:g})"
        out.loc[i, "sync_overhead_from"] = "itself" if j == i else source
    return out


def witnesses(summary: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Per profiled cell: exposed communication per step from the timers and from the trace (WITNESS_COLUMNS).

    timer = (p50 step − p50 compute-only) − sync_overhead, its interval by interval arithmetic on the two
    95 % intervals [e_lo − s_hi, e_hi − s_lo]. trace = median of exposed_transfer_ms (exposed communication
    other than barriers, less its waiting for the last rank: waits.py) over the cell's profiled steps on
    every rank, its interval = [min, max] of them; trace_exposed_wait_ms the median exposed wait beside it.
    `disagree` when the two intervals do not overlap; empty when a side is missing.
    """
    steps = _per_step(summary).dropna(subset=["cell_id"])
    by_cell = steps.groupby("cell_id")
    trace = by_cell["exposed_transfer_ms"].agg(
        trace_exposed_comm_ms="median", trace_exposed_comm_ms_low="min", trace_exposed_comm_ms_high="max")
    trace["trace_exposed_wait_ms"] = by_cell["exposed_wait_ms"].median()
    trace["trace_steps"] = by_cell["exposed_transfer_ms"].count()
    diff, sync = _step_minus_compute(results), sync_overhead(results)
    out = pd.concat([results[["cell_id", "world_size"]], sync], axis=1)
    out["step_minus_compute_only_ms"] = diff["value"]
    out["timer_exposed_comm_ms"] = diff["value"] - sync["sync_overhead_ms"]
    out["timer_exposed_comm_ms_low"] = diff["low"] - sync["sync_overhead_ms_high"]
    out["timer_exposed_comm_ms_high"] = diff["high"] - sync["sync_overhead_ms_low"]
    out = out.merge(trace.reset_index(), on="cell_id", how="inner")
    apart = ((out["trace_exposed_comm_ms_low"] > out["timer_exposed_comm_ms_high"])
             | (out["trace_exposed_comm_ms_high"] < out["timer_exposed_comm_ms_low"]))
    known = out[["timer_exposed_comm_ms_low", "timer_exposed_comm_ms_high", "trace_exposed_comm_ms_low",
                 "trace_exposed_comm_ms_high"]].notna().all(axis=1)
    out["disagree"] = apart.astype("boolean").where(known)
    out["note"] = [_note(r) for r in out.itertuples()]
    return out[list(WITNESS_COLUMNS)].reset_index(drop=True)


def _note(r) -> str | None:
    """Why a cell's witnesses are not compared, or which way they part; None when they agree."""
    if pd.isna(r.timer_exposed_comm_ms_low) or pd.isna(r.timer_exposed_comm_ms_high):
        return ("no timer witness: no world-size-1 cell of the same engine, engine options and gradients "
                "(SYNC_KEYS) measures what no_sync skips besides communication")
    if pd.isna(r.trace_exposed_comm_ms):
        return "no trace witness: no profiled step whose collectives were all matched across ranks"
    if r.disagree:
        above = r.timer_exposed_comm_ms_low > r.trace_exposed_comm_ms_high
        gap = (r.timer_exposed_comm_ms_low - r.trace_exposed_comm_ms_high if above
               else r.trace_exposed_comm_ms_low - r.timer_exposed_comm_ms_high)
        return (f"the {'timers' if above else 'trace'} {gap:.2f} ms above the "
                f"{'trace' if above else 'timers'} beyond both intervals")
    return None


WAIT_TABLE_COLUMNS = ["cell_id", "ranks", "steps", "exposed_comm_ms", "exposed_wait_ms",
                      "exposed_transfer_ms", "wait_share_pct", "waited_for_rank", "steps_last", "persistent",
                      "late_by_ms_p50"]


def wait_table(summary: pd.DataFrame, stragglers: pd.DataFrame) -> pd.DataFrame:
    """Per cell of two or more ranks: the mean per profiled step and rank of exposed communication other
    than barriers and of its two parts, exposed waiting and exposed transfer (waits.py);
    wait_share_pct = Σ exposed wait / Σ exposed communication × 100; and the rank the others waited for
    (stragglers.persistent_stragglers: last in most steps; `persistent` when in more than half of them and
    chance cannot explain it). Cells whose collectives were not all matched across ranks have empty parts."""
    steps = _per_step(summary).dropna(subset=["cell_id"])
    ranks = steps.groupby("cell_id")["rank"].nunique()
    steps = steps[steps["cell_id"].map(ranks) >= 2]
    if steps.empty:
        return pd.DataFrame(columns=WAIT_TABLE_COLUMNS)
    g = steps.groupby("cell_id")
    out = g[["exposed_comm_excl_barrier_ms", "exposed_wait_ms", "exposed_transfer_ms"]].mean()
    out = out.rename(columns={"exposed_comm_excl_barrier_ms": "exposed_comm_ms"})
    out.insert(0, "steps", g["step"].nunique())
    out.insert(0, "ranks", ranks)
    total = g["exposed_comm_excl_barrier_ms"].sum()
    out["wait_share_pct"] = (100 * g["exposed_wait_ms"].sum(min_count=1) / total).where(total > 0)
    who = persistent_stragglers(stragglers).set_index("cell_id") if len(stragglers) else pd.DataFrame()
    for ours, theirs in (("waited_for_rank", "straggler_rank"), ("steps_last", "steps_last"),
                         ("persistent", "persistent"), ("late_by_ms_p50", "late_by_ms_p50")):
        out[ours] = who[theirs].reindex(out.index) if theirs in who else np.nan
    out = out.reset_index()
    out["waited_for_rank"] = out["waited_for_rank"].astype("Int64")
    return out[WAIT_TABLE_COLUMNS]


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
