"""The measured configurations ranked by throughput at the run's largest measured world size (advice.csv).

Ranking by medians alone would pick a winner by noise: a configuration whose 95 % throughput interval
overlaps the best one's is `tied_with_best`, and the advice names the ties instead of choosing among them.
Throughput's interval is the step-time interval carried over (samples/s = global batch / step, bounds
swapped), as the report's scaling tables carry it (bench.report.tables.scaling_table).
"""

from __future__ import annotations

import pandas as pd

from bench.schema import CONFIG_KEYS

# Always in advice.csv, in this order, even when the run held them at one value: the settings a user picks.
CHOICE_KEYS = ("engine", "bucket_cap_mb", "precision", "comm_dtype", "grad_accum")
MEASURED = ("world_size", "samples_per_s", "samples_per_s_ci95_low", "samples_per_s_ci95_high")
PROJECTED = ("projected_samples_per_s", "projected_efficiency", "dominant_loss")
TAIL = ("peak_mem_mb", "cell_id", "why", "projection_note")


def swept_keys(results: pd.DataFrame) -> list[str]:
    """CHOICE_KEYS, then every other configuration key (bar world size) the ranked rows hold at several
    values."""
    n = largest_world_size(results)
    at_n = ok_rows(results)
    at_n = at_n[at_n["world_size"] == n]
    others = [k for k in CONFIG_KEYS if k not in CHOICE_KEYS and k != "world_size"
              and at_n[k].dropna().astype(str).nunique() > 1]
    return [*CHOICE_KEYS, *others]


def ok_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Cells with a measured throughput (status ok)."""
    return results[(results["status"] == "ok") & results["samples_per_s"].notna()]


def largest_world_size(results: pd.DataFrame) -> int | None:
    ok = ok_rows(results)
    return int(ok["world_size"].max()) if len(ok) else None


def throughput_interval(rows: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(low, high) samples/s from the step-time interval: global batch / step, bounds swapped."""
    nan = pd.Series(float("nan"), index=rows.index)
    if "step_time_ms_ci95_high" not in rows or "step_time_ms_ci95_low" not in rows:
        return nan, nan
    return rows["global_batch"] / rows["step_time_ms_ci95_high"] * 1e3, \
        rows["global_batch"] / rows["step_time_ms_ci95_low"] * 1e3


def rank_configurations(results: pd.DataFrame, memory_gb: float | None = None) -> pd.DataFrame:
    """advice.csv's measured half: one row per ok configuration at the largest measured world size, the
    fittest first. `rank` is 1.. over the admitted rows (empty for one excluded by `memory_gb`, `why` says
    why); `tied_with_best` is true when the row's interval overlaps the best one's."""
    n = largest_world_size(results)
    keys = swept_keys(results)
    columns = ["rank", "tied_with_best", *keys, *MEASURED, *PROJECTED, *TAIL]
    if n is None:
        return pd.DataFrame(columns=columns)
    at_n = ok_rows(results)
    at_n = at_n[at_n["world_size"] == n]
    low, high = throughput_interval(at_n)
    table = at_n[keys + ["world_size", "samples_per_s", "peak_mem_mb", "cell_id"]].assign(
        samples_per_s_ci95_low=low, samples_per_s_ci95_high=high, why="", projection_note="")
    table["world_size"] = table["world_size"].astype(int)
    over = pd.Series(False, index=table.index)
    if memory_gb is not None:
        over = table["peak_mem_mb"] > memory_gb * 1024
        table.loc[over, "why"] = [f"excluded: peak memory {m:,.0f} MiB is over --memory-gb {memory_gb:g} "
                                  f"({memory_gb * 1024:,.0f} MiB)" for m in table.loc[over, "peak_mem_mb"]]
    admitted = table[~over].sort_values("samples_per_s", ascending=False, kind="stable")
    admitted = admitted.assign(rank=range(1, len(admitted) + 1))
    if len(admitted):
        best = admitted.iloc[0]
        # overlap: this row's upper bound reaches the best one's lower bound (no interval: not a tie)
        tied = admitted["samples_per_s_ci95_high"] >= best["samples_per_s_ci95_low"]
        admitted["tied_with_best"] = tied & (admitted["rank"] > 1)
        admitted.loc[admitted.index[0], "tied_with_best"] = False
        admitted["why"] = [_why(r, best) for _, r in admitted.iterrows()]
    excluded = table[over].assign(rank=pd.NA, tied_with_best=False)
    out = pd.concat([admitted, excluded]) if len(excluded) else admitted
    for col in PROJECTED:
        out[col] = float("nan") if col != "dominant_loss" else ""
    out["rank"] = out["rank"].astype("Int64")
    out["tied_with_best"] = out["tied_with_best"].astype(bool)
    return out[columns].reset_index(drop=True)


def _why(r: pd.Series, best: pd.Series) -> str:
    if r["rank"] == 1:
        return "highest median throughput at this world size"
    if pd.isna(r["samples_per_s_ci95_high"]) or pd.isna(best["samples_per_s_ci95_low"]):
        return "no interval recorded: cannot tell whether it is tied"
    if r["tied_with_best"]:
        return "tied: its 95 % interval overlaps the best one's"
    return f"{(1 - r['samples_per_s'] / best['samples_per_s']) * 100:.1f} % below the best, beyond the noise"
