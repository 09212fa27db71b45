"""A launch effect in a comparison of two runs: the throughput ratio common to every cell of the pair
(`launch_shift`), each cell judged against it (`judge_cells`, Holm's correction over the pair's cells) or,
with too few cells for a shift, against no difference (`ratio_p_value`); and how large a shift the runs' own
between-launch spread allows (`launch_spread_pct`)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd

from bench import stats


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
