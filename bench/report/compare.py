"""Comparing runs (e.g. H100 vs A100): functions from loaded runs to DataFrames.

Cells are joined on `bench.schema.CONFIG_KEYS`; the first run is the baseline every other run is set
against. Throughput ratio = other / baseline (> 1: the other run is faster).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from bench import stats
from bench.analyze import diff
from bench.analyze.api import AnalyzeInputError, run_jobs
from bench.analyze.summary import CLASSES_FILE, SUMMARY_FILE, analyse_tables
from bench.report import tables
from bench.report.environment import gpu_summary, machine_facts
from bench.run_folder import Run
from bench.schema import CONFIG_KEYS

# Software whose version changes timings by itself: comparing hardware across them needs a warning.
SOFTWARE_FIELDS = ("torch", "cuda", "cudnn", "nccl", "driver")


def mixed_devices(runs: list[Run]) -> str:
    """Why these runs must not be compared (CPU with GPU), or '' when they share a device kind."""
    devices = {r.name: r.device for r in runs}
    if len(set(devices.values())) <= 1:
        return ""
    listing = ", ".join(f"{name} is {dev}" for name, dev in devices.items())
    return (
        f"refusing to compare runs on different devices ({listing}): CPU processes over gloo and GPUs over "
        f"NCCL measure different things, and docs/design.md keeps CPU numbers out of GPU comparisons. "
        f"Pass --allow-mixed-devices to compare them anyway."
    )


# What a user chose when making a run, in the words of `nothing_in_common`: (label, how to read it off a run).
_RUN_SHAPE = (
    ("preset", lambda r: [str(r.config.get("description") or r.env.get("command") or "?")]),
    ("model", lambda r: sorted({f"{m}/{s}" if s else m for m, s in zip(r.results["model"],
                                                                       r.results["model_size"])})),
    ("engines", lambda r: sorted(set(r.results["engine"]))),
    ("world sizes", lambda r: [str(n) for n in tables.world_sizes(r.results)]),
    ("precisions", lambda r: sorted(set(r.results["precision"]))),
    ("global batches", lambda r: [f"{b:g}" for b in sorted(set(r.results["global_batch"].dropna()))]),
)


def nothing_in_common(runs: list[Run]) -> str:
    """Why nothing can be compared — a run shares no configuration (bench.schema.CONFIG_KEYS) with the
    baseline — and how the two differ; '' when every run shares at least one."""
    labels = run_labels(runs)
    base = set(tables.config_key(runs[0].results, CONFIG_KEYS))
    for label, run in zip(labels[1:], runs[1:]):
        if base & set(tables.config_key(run.results, CONFIG_KEYS)):
            continue
        differs = [f"{what}: {', '.join(get(runs[0]))} vs {', '.join(get(run))}"
                   for what, get in _RUN_SHAPE if get(runs[0]) != get(run)]
        return (f"{labels[0]} and {label} have no configuration in common (cells are matched on "
                f"{', '.join(CONFIG_KEYS)}), so nothing can be compared. They differ in "
                + ("; ".join(differs) or "how their cells are configured") + ".")
    return ""


def env_differences(runs: list[Run]) -> pd.DataFrame:
    """One row per environment field, one column per run, and whether the runs differ on it."""
    fields = {
        "device": lambda r: r.device,
        "GPU": lambda r: gpu_summary(r.env),
        "GPU count": lambda r: r.env.get("gpu_count"),
        "driver": lambda r: r.env.get("driver"),
        "cuda": lambda r: r.env.get("cuda"),
        "cudnn": lambda r: r.env.get("cudnn"),
        "nccl": lambda r: r.env.get("nccl"),
        "torch": lambda r: r.env.get("torch"),
        "backend": lambda r: r.env.get("backend"),
        "python": lambda r: r.env.get("python"),
        "cpu": lambda r: r.env.get("cpu_model"),
        "topology": lambda r: r.env.get("topology"),
        "hostname": lambda r: r.env.get("hostname"),
        "git sha": lambda r: r.env.get("git_sha"),
    }
    per_run = [{name: get(r) for name, get in fields.items()} for r in runs]
    for values, r in zip(per_run, runs):
        values.update({field: value for field, value, _ in machine_facts(r.env)})
    # every variable set in some run's env_vars (one set in one run only differs too)
    for var in sorted({k for r in runs for k in (r.env.get("env_vars") or {})}):
        for values, r in zip(per_run, runs):
            values[var] = (r.env.get("env_vars") or {}).get(var)
    labels = run_labels(runs)
    rows = []
    for name in per_run[0]:
        values = ["" if v[name] is None else str(v[name]) for v in per_run]
        rows.append({"field": name, **dict(zip(labels, values)), "differs": len(set(values)) > 1})
    return pd.DataFrame(rows)


# Fields that differ between any two runs and say nothing about the machine
_NOT_MACHINE = ("hostname", "git sha")


def difference_list(diff: pd.DataFrame) -> list[str]:
    """The short list for the summary: 'field: a vs b' for each machine fact or variable that differs
    (multi-line values such as the topology are named, not quoted)."""
    value_cols = [c for c in diff.columns if c not in ("field", "differs")]
    out = []
    for _, r in diff[diff["differs"] & ~diff["field"].isin(_NOT_MACHINE)].iterrows():
        values = [r[c] or "unset" for c in value_cols]
        if any("\n" in v or len(v) > 80 for v in values):
            out.append(f"{r['field']}: differs (see the table)")
        else:
            out.append(f"{r['field']}: " + " vs ".join(values))
    return out


def software_warning(diff: pd.DataFrame) -> str:
    """A warning naming the software versions that differ ('' when they all match)."""
    differing = diff[diff["field"].isin(SOFTWARE_FIELDS) & diff["differs"]]
    if not len(differing):
        return ""
    value_cols = [c for c in diff.columns if c not in ("field", "differs")]
    parts = [
        f"{r['field']} " + " vs ".join(r[c] or "none" for c in value_cols) for _, r in differing.iterrows()
    ]
    return (
        "Software versions differ (" + "; ".join(parts) + "): part of every difference below may come "
        "from the software, not the hardware."
    )


def search_warning(runs: list[Run]) -> str:
    """A warning when the runs searched differently (run.search: grid, race, race-all-sizes), '' else: a
    race stops the slower configurations early (their rows partial, not compared) and measures only the
    survivors fully, so the cells the runs share and their precision differ by design."""
    searches = [str(r.config.get("run", {}).get("search", "grid")) for r in runs]
    if len(set(searches)) < 2:
        return ""
    return (f"The runs searched differently (run.search {' vs '.join(searches)}): a race measures only its "
            f"survivors fully and stops the rest early (raced_out, left out here), so the configurations "
            f"compared are those both measured fully; compare runs of one search for a like-for-like view.")


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


def ratio_p_value(ratio: pd.Series, low: pd.Series, high: pd.Series) -> pd.Series:
    """Two-sided p-value of throughput ratio = 1 from its 95 % interval, on the log scale where the two
    sides' errors add: se = (ln(high) − ln(low)) / (2 · 1.96), z = ln(ratio) / se, p = 2·(1 − Φ(|z|)). A side
    whose interval used Student's t (a few launches) is wider than 1.96 standard errors, so its se is over-
    rather than under-stated and p errs high. NaN without an interval."""
    se = (np.log(high) - np.log(low)) / (2 * stats.Z95)
    z = (np.log(ratio) / se).abs()
    normal = statistics.NormalDist()
    return z.map(lambda v: 2 * (1 - normal.cdf(v)) if pd.notna(v) else float("nan"))


# Fewer cells than this on both sides: no common shift is estimated, each cell is tested against 1.
MIN_SHIFT_CELLS = 4


def _log_se(low, high) -> np.ndarray:
    """The standard error on the log scale read off a 95 % interval: (ln high − ln low) / (2 · 1.96)."""
    return (np.log(np.asarray(high, dtype=float)) - np.log(np.asarray(low, dtype=float))) / (2 * stats.Z95)


def launch_shift(ratio, low, high) -> tuple[float, float, float, int]:
    """The throughput ratio common to every cell of a pair (a launch effect: machine state, clocks, a
    neighbour shift all cells of a launch alike): (shift, its 95 % low, high, cells it came from), NaNs
    with fewer than MIN_SHIFT_CELLS cells that have a ratio and an interval.

    Rule, on the log scale (x_i = ln ratio_i, se_i from its interval as in `ratio_p_value`, n cells):
    shift = exp(median x_i). Its standard error is that of a median, √(π/2) · σ / √n, with σ the larger of
    the cells' spread (1.4826 · MAD of x_i, robust to the few cells that truly differ) and the median se_i
    (so a spread that happens to be tight at small n cannot claim more than the cells' own precision); the
    interval is shift · exp(± t_{0.975, n−1} · se) (Student's t for the σ estimated from n cells)."""
    x = np.log(np.asarray(ratio, dtype=float))
    se = _log_se(low, high)
    ok = np.isfinite(x) & np.isfinite(se) & (se > 0)
    n = int(ok.sum())
    if n < MIN_SHIFT_CELLS:
        return float("nan"), float("nan"), float("nan"), n
    x, se = x[ok], se[ok]
    centre = float(np.median(x))
    sigma = max(1.4826 * float(np.median(np.abs(x - centre))), float(np.median(se)))
    half = stats.t_quantile(1 - (1 - stats.CONFIDENCE) / 2, n - 1) * np.sqrt(np.pi / 2) * sigma / np.sqrt(n)
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half), n


def judge_cells(ratio: pd.Series, low: pd.Series, high: pd.Series) -> pd.DataFrame:
    """Each cell of a pair judged against the shift common to all (`launch_shift`): the columns
    launch_shift_x, launch_shift_ci95_low_x / _high_x, launch_shift_cells (same on every row),
    ratio_vs_shift_x = ratio / shift with its 95 % interval (ratio_vs_shift_ci95_low_x / _high_x: the cell's
    own log half-widths and the shift's in quadrature), p_vs_shift (two-sided, z = ln(ratio / shift) /
    √(se_cell² + se_shift²), se_shift = the shift's log half-width / 1.96; x_i is one of the cells the median
    came from, so the two errors correlate positively and the variance is over- rather than understated),
    verdict_vs_shift (that interval on one side of 1: the cell differs from the rest of the run), and the
    headline verdict_holm: Holm's correction over the pair's p_vs_shift. Without a shift (fewer than
    MIN_SHIFT_CELLS cells) the shift columns are empty and verdict_holm corrects today's per-cell test
    against 1 (p_b_vs_a, verdict_b_vs_a)."""
    ratio, low, high = (pd.to_numeric(pd.Series(v), errors="coerce") for v in (ratio, low, high))
    index = ratio.index
    shift, s_low, s_high, cells = launch_shift(ratio, low, high)
    out = pd.DataFrame({"launch_shift_x": shift, "launch_shift_ci95_low_x": s_low,
                        "launch_shift_ci95_high_x": s_high, "launch_shift_cells": cells}, index=index)
    if math.isfinite(shift):
        h = math.log(s_high / shift)  # the shift's log half-width (symmetric)
        rel = ratio / shift
        out["ratio_vs_shift_x"] = rel
        out["ratio_vs_shift_ci95_low_x"] = rel * np.exp(-np.sqrt(np.log(ratio / low) ** 2 + h ** 2))
        out["ratio_vs_shift_ci95_high_x"] = rel * np.exp(np.sqrt(np.log(high / ratio) ** 2 + h ** 2))
        se = np.sqrt(_log_se(low, high) ** 2 + (h / stats.Z95) ** 2)
        z = pd.Series(np.abs(np.log(rel.to_numpy(dtype=float))) / se, index=index)
        normal = statistics.NormalDist()
        out["p_vs_shift"] = z.map(lambda v: 2 * (1 - normal.cdf(v)) if pd.notna(v) else float("nan"))
        verdicts = [stats.verdict(lo, hi) if pd.notna(lo) and pd.notna(hi) else ""
                    for lo, hi in zip(out["ratio_vs_shift_ci95_low_x"], out["ratio_vs_shift_ci95_high_x"])]
        p = out["p_vs_shift"]
        out["verdict_vs_shift"] = verdicts
    else:
        for col in ("ratio_vs_shift_x", "ratio_vs_shift_ci95_low_x", "ratio_vs_shift_ci95_high_x",
                    "p_vs_shift"):
            out[col] = float("nan")
        verdicts = [stats.verdict(lo, hi) if pd.notna(lo) and pd.notna(hi) else ""
                    for lo, hi in zip(low, high)]
        p = ratio_p_value(ratio, low, high)
        out["verdict_vs_shift"] = ""
    rejected = stats.holm([None if pd.isna(v) else float(v) for v in p])
    out["verdict_holm"] = [v if not v or v == "within noise" or kept else "within noise"
                           for v, kept in zip(verdicts, rejected)]
    return out


def launch_shifts(joined: pd.DataFrame) -> pd.DataFrame:
    """Per other run (run_b): its common shift against the baseline (launch_shift_x, its interval, the
    cells it came from; NaN where too few cells), from `judge_cells`' columns."""
    cols = ["launch_shift_x", "launch_shift_ci95_low_x", "launch_shift_ci95_high_x", "launch_shift_cells"]
    return joined.groupby("run_b", sort=False)[cols].first()


def launch_spread_pct(launches_a: float, cv_a: float, launches_b: float, cv_b: float) -> float | None:
    """The 95 % half-width (%) of a shift common to all cells that the runs' own between-launch spread gives:
    each run's cells share its launches, so its launch effect averages over them as cv / √launches; the two
    runs are independent: 1.96 · √(cv_a² / L_a + cv_b² / L_b). None unless both ran ≥ 2 launches with a cv."""
    values = (launches_a, cv_a, launches_b, cv_b)
    if any(v is None or pd.isna(v) for v in values) or min(launches_a, launches_b) < 2:
        return None
    return stats.Z95 * math.sqrt(cv_a ** 2 / launches_a + cv_b ** 2 / launches_b)


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


# --- traces: why B differs from A (bench/analyze/diff.py) ------------------------------------------------
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
