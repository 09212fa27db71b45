"""Comparing runs (e.g. H100 vs A100): functions from loaded runs to DataFrames.

Cells are joined on `bench.schema.CONFIG_KEYS`; the first run is the baseline every other run is set
against. Throughput ratio = other / baseline (> 1: the other run is faster). Whether runs can be compared at
all is comparability.py's to say, the shift common to a pair's cells compare_shift.py's, and why their traces
differ compare_traces.py's.
"""

from __future__ import annotations

import pandas as pd

from bench import stats
from bench.report import tables
from bench.report.compare_shift import judge_cells, ratio_p_value
from bench.run_folder import Run
from bench.schema import CONFIG_KEYS


def run_labels(runs: list[Run]) -> list[str]:
    """Run folder names, made unique with their position when two runs share a name."""
    names = [r.name for r in runs]
    return [n if names.count(n) == 1 else f"{n} ({i + 1})" for i, n in enumerate(names)]


def _efficiency_by_cell(run: Run) -> dict[str, float]:
    """cell_id → its scaling efficiency (%) in the run's strong or weak table."""
    out = {}
    for s in ("strong", "weak"):
        table = tables.scaling_table(run.results, s)
        if "efficiency_pct" in table:
            out.update(dict(zip(table["cell_id"], table["efficiency_pct"])))
    return out


def _one_row_per_config(run: Run) -> pd.DataFrame:
    """The run's rows keyed by configuration (`_config`; the last row where one was measured twice), with
    `throughput` (samples/s, empty unless ok) and `efficiency` (%, from the run's own scaling table)."""
    df = run.results
    eff = _efficiency_by_cell(run)
    return df.assign(
        _config=tables.config_key(df, CONFIG_KEYS),
        throughput=tables.throughputs(df).where(df["status"] == "ok"),
        efficiency=[eff.get(c) for c in df["cell_id"]],
    ).drop_duplicates("_config", keep="last").copy()  # one block: the merge below warns on a fragmented frame


def _join_pair(base: pd.DataFrame, other: pd.DataFrame, label_a: str, label_b: str) -> pd.DataFrame:
    """Two runs' rows (`_one_row_per_config`) joined on configuration: each side's numbers, ratio, delta %."""
    merged = base.merge(other, on="_config", how="outer", suffixes=("_a", "_b"), indicator=True)
    out = pd.DataFrame({"run_a": label_a, "run_b": label_b}, index=merged.index)
    for k in CONFIG_KEYS:  # configuration from whichever side has the cell
        out[k] = merged[f"{k}_a"].where(merged["_merge"] != "right_only", merged[f"{k}_b"])
    presence = {"both": "both", "left_only": f"only {label_a}", "right_only": f"only {label_b}"}
    out["presence"] = merged["_merge"].map(presence).astype(str)
    for side in ("a", "b"):
        out[f"status_{side}"] = merged[f"status_{side}"].fillna("")
        out[f"step_time_{side}_ms_p50"] = merged[f"step_time_ms_p50_{side}"].where(
            merged[f"status_{side}"] == "ok"
        )
        out[f"throughput_{side}_samples_per_s"] = pd.to_numeric(merged[f"throughput_{side}"], errors="coerce")
        out[f"efficiency_{side}_pct"] = pd.to_numeric(merged[f"efficiency_{side}"], errors="coerce")
    thr_a, thr_b = out["throughput_a_samples_per_s"], out["throughput_b_samples_per_s"]
    out["throughput_ratio_b_over_a_x"] = tables.ratio(thr_b, thr_a)
    out["throughput_delta_pct"] = tables.delta_pct(thr_b, thr_a)
    low, high = ratio_interval(merged)
    out["throughput_ratio_ci95_low_x"], out["throughput_ratio_ci95_high_x"] = low, high
    out["verdict_b_vs_a"] = [stats.verdict(lo, hi) if pd.notna(lo) and pd.notna(hi) else ""
                             for lo, hi in zip(low, high)]
    out["p_b_vs_a"] = ratio_p_value(out["throughput_ratio_b_over_a_x"], low, high)
    judged = judge_cells(out["throughput_ratio_b_over_a_x"], low, high)
    for col in judged.columns:
        out[col] = judged[col]
    for side in ("a", "b"):  # the precision each side reached (run.target_ci_pct, or its fixed steps)
        p50, lo, hi = (pd.to_numeric(merged.get(f"{c}_{side}"), errors="coerce") for c in (
            "step_time_ms_p50", "step_time_ms_ci95_low", "step_time_ms_ci95_high"))
        out[f"half_width_{side}_pct"] = ((hi - lo) / 2 / p50 * 100).where(merged[f"status_{side}"] == "ok")
        for col in ("launches", "between_launch_cv_pct"):  # what each side knows of between-launch noise
            values = pd.Series(pd.to_numeric(merged.get(f"{col}_{side}", float("nan")), errors="coerce"),
                               index=merged.index)
            out[f"{col}_{side}"] = values.where(merged[f"status_{side}"] == "ok")
    errors = merged[["error_a", "error_b"]].fillna("")
    out["note"] = [_note(r, e, label_a, label_b) for (_, r), (_, e) in zip(out.iterrows(), errors.iterrows())]
    # Reading order: configuration, presence, the comparison itself, then each side's detail.
    first = [*CONFIG_KEYS, "presence", "throughput_ratio_b_over_a_x", "throughput_ratio_ci95_low_x",
             "throughput_ratio_ci95_high_x", "verdict_b_vs_a", "launch_shift_x", "ratio_vs_shift_x",
             "verdict_vs_shift", "verdict_holm", "throughput_delta_pct"]
    return out[["run_a", "run_b", *first, *[c for c in out.columns if c not in first][2:]]]


def ratio_interval(merged: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The 95 % interval of throughput b / a = step a / step b from each side's achieved 95 % interval of
    its median step time (a cell measured to ±1 % and one to ±8 % each bring their own precision): the two
    runs are independent, so `stats.unpaired_ratio_interval` (log-scale quadrature). NaN where a side has
    no interval or is not ok."""
    def col(name, side):
        key = f"{name}_{side}"
        ok = merged.get(f"status_{side}") == "ok"
        values = pd.to_numeric(merged[key], errors="coerce") if key in merged else pd.Series(float("nan"),
                                                                                            index=merged.index)
        return values.where(ok)

    return stats.unpaired_ratio_interval(
        col("step_time_ms_p50", "a"), col("step_time_ms_ci95_low", "a"), col("step_time_ms_ci95_high", "a"),
        col("step_time_ms_p50", "b"), col("step_time_ms_ci95_low", "b"), col("step_time_ms_ci95_high", "b"))


def verdict_counts(joined: pd.DataFrame, column: str = "verdict_holm") -> pd.DataFrame:
    """Per other run: how many cells measured on both sides are faster, slower, within noise, or have no
    interval (an older result file on either side), by `column` (default: after Holm's correction for the
    comparison's cells, against the common shift where there is one; `verdict_vs_shift`: each cell alone
    against the shift; `verdict_b_vs_a`: each cell alone against 1, the shift left in)."""
    both = joined[joined["presence"] == "both"]
    words = both[column].replace("", "no interval")
    return words.groupby(both["run_b"], sort=False).value_counts().unstack(fill_value=0).reset_index()


def join_cells(runs: list[Run]) -> pd.DataFrame:
    """Every configuration of the baseline and each other run, side by side, with ratio and delta %."""
    labels = run_labels(runs)
    base = _one_row_per_config(runs[0])
    others = zip(labels[1:], runs[1:])
    joined = pd.concat(
        [_join_pair(base, _one_row_per_config(r), labels[0], label) for label, r in others], ignore_index=True
    )
    order = ["run_b", "engine", "scaling", "precision", "comm_dtype", "grad_accum", "bucket_cap_mb",
             "global_batch", "world_size"]
    return joined.sort_values(order, kind="stable", na_position="first").reset_index(drop=True)


def _note(r, errors, label_a: str, label_b: str) -> str:
    """Why a row has no ratio: the cell is missing on one side, or a side's status is not ok (with reason)."""
    if r["presence"] != "both":
        return f"measured in {r['presence'][5:]} only"
    parts = [
        f"{label} {r[f'status_{side}']}: {errors[f'error_{side}'] or 'no reason recorded'}"
        for side, label in (("a", label_a), ("b", label_b))
        if r[f"status_{side}"] != "ok"
    ]
    return "no ratio: " + ", ".join(parts) if parts else ""


def throughput_ratios(joined: pd.DataFrame) -> pd.DataFrame:
    """Per other run (run_b): how many cells have a throughput ratio, and its median, min and max."""
    both = joined[(joined["presence"] == "both") & joined["throughput_ratio_b_over_a_x"].notna()]
    by_run = both.groupby("run_b", sort=False)["throughput_ratio_b_over_a_x"]
    return by_run.agg(cells="count", median="median", min="min", max="max").reset_index()


def noise_floor_pct(joined: pd.DataFrame) -> pd.Series:
    """Per other run (run_b): the run-to-run noise floor of this comparison, in %: the median over the cells
    measured on both sides of half their throughput-ratio interval (`ratio_interval`, both runs' step-time
    intervals, which hold their between-launch variance where a run has several launches) relative to the
    ratio. A median difference smaller than this is noise. NaN for a run whose cells have no intervals."""
    both = joined[(joined["presence"] == "both") & joined["throughput_ratio_b_over_a_x"].notna()]
    half = ((both["throughput_ratio_ci95_high_x"] - both["throughput_ratio_ci95_low_x"]) / 2
            / both["throughput_ratio_b_over_a_x"] * 100)
    return half.groupby(both["run_b"], sort=False).median()


def launch_noise(joined: pd.DataFrame) -> pd.DataFrame:
    """Per other run (run_b) and side: the launches per cell (their median) and the median
    between_launch_cv_pct over the cells measured on both sides; launches NaN for result files older than
    run.launches (one launch, between-launch variance unknown)."""
    both = joined[(joined["presence"] == "both") & joined["throughput_ratio_b_over_a_x"].notna()]
    cols = ["launches_a", "between_launch_cv_pct_a", "launches_b", "between_launch_cv_pct_b"]
    return both.groupby("run_b", sort=False)[cols].median()


def one_side_only(joined: pd.DataFrame) -> pd.DataFrame:
    """The configurations that only one run measured."""
    cols = ["run_a", "run_b", "presence", *CONFIG_KEYS]
    return joined.loc[joined["presence"] != "both", cols].reset_index(drop=True)
