"""The one rule every word of the advice comes from: a row's verdict against its baseline.

advice.csv's `verdict_vs_baseline`, its `why`, the answer's sentences (answer.py), the choice of what the
answer names (choice.py) and the report's first screen all read the verdict from here, so none of them can
say what the row's interval does not. From the speedup's 95 % interval [low, high] and whether its test
survives Holm's correction over the recipe's comparisons (`stats.holm` on `speedup_p`):

- `faster` / `slower`: the interval lies wholly above / below 1 and the test survives the correction;
- `faster before correction` / `slower before correction`: the interval excludes 1 but the test does not
  survive the correction (within noise over the whole family of comparisons: never a reason to change);
- `within noise`: the interval holds 1;
- "" for the baseline itself and for a row without an interval or without a baseline.

A configuration whose interval lies below 1 (`slower`, `slower before correction`) is never called the best
or a contender for it; only `faster` is a reason to change anything.
"""

from __future__ import annotations

import pandas as pd

from bench import stats

FASTER, SLOWER, WITHIN = "faster", "slower", "within noise"
UNCORRECTED = " before correction"
FASTER_UNCORRECTED, SLOWER_UNCORRECTED = FASTER + UNCORRECTED, SLOWER + UNCORRECTED
VERDICTS = (FASTER, SLOWER, WITHIN, FASTER_UNCORRECTED, SLOWER_UNCORRECTED)


def verdict(low: float, high: float, survives: bool | None) -> str:
    """The rule (module docstring) for one interval; `survives`: its test survived Holm's correction."""
    raw = stats.verdict(low, high) if pd.notna(low) and pd.notna(high) else None
    if raw is None:
        return ""
    if raw == WITHIN or survives:
        return raw
    return raw + UNCORRECTED


def corrected_verdicts(table: pd.DataFrame) -> pd.Series:
    """verdict() per row, Holm's correction over the rows whose interval excludes 1 and that have a p
    (`speedup_p`); "" for the baseline and for rows without an interval or a baseline."""
    low = pd.to_numeric(table["speedup_vs_baseline_ci95_low"], errors="coerce")
    high = pd.to_numeric(table["speedup_vs_baseline_ci95_high"], errors="coerce")
    raw = [stats.verdict(lo, hi) if pd.notna(lo) and pd.notna(hi) else None for lo, hi in zip(low, high)]
    p = pd.to_numeric(table["speedup_p"], errors="coerce")
    survives = stats.holm([float(x) if pd.notna(x) and v else None for x, v in zip(p, raw)])
    return pd.Series([verdict(lo, hi, bool(s)) for lo, hi, s in zip(low, high, survives)], index=table.index,
                     dtype=object)


def below_one(row: pd.Series) -> bool:
    """The row's speedup interval lies wholly below 1: measured slower, whatever the correction says."""
    return str(row.get("verdict_vs_baseline") or "") in (SLOWER, SLOWER_UNCORRECTED)


def comparisons(table: pd.DataFrame) -> int:
    """How many comparisons Holm's correction ran over (rows with an interval and a p)."""
    return int((pd.to_numeric(table["speedup_p"], errors="coerce").notna()
                & table["verdict_vs_baseline"].fillna("").astype(str).ne("")).sum())


def words(row: pd.Series, family: int) -> str:
    """The verdict in words, for `why` and the answer: 'faster beyond the noise after Holm's correction over
    12 comparisons', 'slower before correction (Holm's correction over 12 comparisons does not keep it)', …
    ("within noise" and "beyond the noise" only where the interval holds 1, or excludes it and the test
    survives the correction: no reader of a single phrase is misled)."""
    v = str(row.get("verdict_vs_baseline") or "")
    holm = f"Holm's correction over {family} comparison{'s' if family != 1 else ''}"
    if v in (FASTER, SLOWER):
        return f"{v} beyond the noise after {holm}"
    if v in (FASTER_UNCORRECTED, SLOWER_UNCORRECTED):
        return f"{v} ({holm} does not keep it)"
    if v == WITHIN:
        return "within noise (its interval holds 1)"
    return "no interval: cannot tell"


def speedup_words(row: pd.Series) -> str:
    """'1.18× [1.12, 1.24]' (the interval's bounds as written in advice.csv, to 2 decimals)."""
    s = f"{row['speedup_vs_baseline']:.2f}×"
    if pd.notna(row["speedup_vs_baseline_ci95_low"]) and pd.notna(row["speedup_vs_baseline_ci95_high"]):
        s += f" [{row['speedup_vs_baseline_ci95_low']:.2f}, {row['speedup_vs_baseline_ci95_high']:.2f}]"
    return s
