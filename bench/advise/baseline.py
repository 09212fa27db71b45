"""Each ranked configuration against torch DDP's defaults at the same recipe: the speedup, its 95 % interval,
and the verdict once the rows are corrected for being compared together (Holm).

The baseline is what a user runs before changing anything: torch's DistributedDataParallel with no engine
option (no comm hook, no compile, no static graph, no bucket views), uncompressed gradients, 25 MiB buckets
(torch's default; else the run's nearest on the log scale, the larger on a tie), no accumulation (the
smallest grad_accum the recipe was measured with), at the recipe and at the row's own precision (a
precision changes the numerics: each precision has its own baseline). `--baseline KEY=VALUE,…` replaces
any of these choices; naming `precision` makes one baseline for every row.

speedup_vs_baseline = the row's throughput / the baseline's (= baseline step / row step). Two ways to its
interval, as the run measured them:
- **paired**: the row was stepped side by side with the baseline, round by round (bench/worker/groups.py:
  one group per configuration less engine and engine options, naive joining the group at 25 MiB or else the
  first group of its configuration in the preset's bucket order; row_values.add_speed_vs_torch
  pairs every cell with the group's plain torch cell). Then it is the run's own `speed_vs_torch`: the median
  over rounds of the step ratio, its order-statistic interval and its sign-test p.
- **unpaired**: otherwise the ratio of the two medians, its interval from both cells' intervals
  (`stats.unpaired_ratio_interval`, log-scale quadrature) and the p-value that interval is the dual of.
Holm's correction (`stats.holm`) runs over every row's p; a faster/slower whose test does not survive is
`faster before correction` / `slower before correction` (verdict.py: the one rule every word of the advice
comes from), and each ranked row's `why` ends with its verdict in words.
"""

from __future__ import annotations

import math

import pandas as pd

from bench import stats
from bench.advise import verdict
from bench.advise.rank import UsageError
from bench.schema import DEFAULT_BUCKET_MB, GROUP_KEYS

# the baseline's settings (module docstring); bucket_cap_mb is the nearest measured, grad_accum the smallest
DEFAULTS = {"engine": "torch", "engine_options": "", "comm_dtype": "none", "bucket_cap_mb": DEFAULT_BUCKET_MB}
# what --baseline may set
BASELINE_KEYS = ("engine", "engine_options", "comm_dtype", "bucket_cap_mb", "grad_accum", "per_rank_batch",
                 "precision")
SPEEDUP = ("baseline", "speedup_vs_baseline", "speedup_vs_baseline_ci95_low", "speedup_vs_baseline_ci95_high",
           "speedup_p", "verdict_vs_baseline", "speedup_paired", "baseline_cell_id")


def parse_baseline(text: str | None) -> dict:
    """`--baseline engine=torch,bucket_cap_mb=100` → {key: value} (numbers for the numeric keys);
    UsageError naming the item, or the key given twice."""
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in BASELINE_KEYS:
            raise UsageError(f"--baseline={text!r}: {item!r} is not KEY=VALUE with KEY one of "
                             f"{list(BASELINE_KEYS)}")
        if key in ("bucket_cap_mb", "grad_accum", "per_rank_batch"):
            try:
                value = float(value)
            except ValueError:
                raise UsageError(f"--baseline={text!r}: {key}={value!r} is not a number") from None
        if key in out:
            raise UsageError(f"--baseline={text!r}: {key} is given twice; give each key once")
        out[key] = value
    return out


def _same(values: pd.Series, wanted) -> pd.Series:
    if isinstance(wanted, float):
        return pd.to_numeric(values, errors="coerce") == wanted
    return values.fillna("").astype(str) == str(wanted)


def _equal(a, b) -> bool:
    """Two configuration values alike: both empty, equal numbers (4 and 4.0), or equal text."""
    if pd.isna(a) or pd.isna(b):
        return bool(pd.isna(a) and pd.isna(b))
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _words(spec: dict) -> str:
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in spec.items())


def baselines(ranked: pd.DataFrame, spec: dict) -> dict[str, pd.Series]:
    """precision (or "*" when `spec` names one) → the baseline row among the ranked rows (module
    docstring); a precision without one is absent. UsageError when `spec` matches no ranked row."""
    wanted = {**{k: v for k, v in DEFAULTS.items() if k != "bucket_cap_mb"}, **spec}
    pool = ranked
    for key, value in wanted.items():
        pool = pool[_same(pool[key], value)]
    if spec and pool.empty:
        rest = {k: v for k, v in wanted.items() if k not in spec}
        raise UsageError(f"--baseline={_words(spec)}: no ranked configuration at this recipe has those "
                         f"settings (with {_words(rest)})")
    out = {}
    groups = [("*", pool)] if "precision" in spec else list(pool.groupby("precision", sort=False))
    for precision, rows in groups:
        if "bucket_cap_mb" not in spec and rows["bucket_cap_mb"].notna().any():
            distance = (rows["bucket_cap_mb"] / DEFAULT_BUCKET_MB).map(math.log).abs()
            nearest = distance.min()
            rows = rows[distance == nearest]
            rows = rows[rows["bucket_cap_mb"] == rows["bucket_cap_mb"].max()]  # the larger on a tie
        rows = rows.sort_values(["grad_accum", "rank"], kind="stable")
        out[str(precision)] = rows.iloc[0]
    return out


def naive_group_bucket(row: pd.Series, results: pd.DataFrame, bucket_order: list[float]) -> float | None:
    """The bucket size of the group an engine without buckets (naive) was stepped in (bench/worker/groups.py):
    25 MiB when its configuration has a bucketed cell there, else the first of the preset's bucket sizes
    that it has; None when none."""
    others = results[results["bucket_cap_mb"].notna()]
    mine = others.apply(lambda o: all(_equal(o[k], row[k]) for k in GROUP_KEYS if k != "bucket_cap_mb"),
                        axis=1) if len(others) else pd.Series(dtype=bool)
    held = set(others[mine]["bucket_cap_mb"]) if len(others) else set()
    if DEFAULT_BUCKET_MB in held:
        return DEFAULT_BUCKET_MB
    return next((b for b in bucket_order if b in held), min(held) if held else None)


def stepped_together(row: pd.Series, base: pd.Series, results: pd.DataFrame,
                     bucket_order: list[float]) -> bool:
    """True when `row`'s speed_vs_torch is against `base`: both interleaved in one worker group, whose plain
    torch cell `base` is (module docstring)."""
    cells = results.set_index("cell_id")
    r, b = cells.loc[row["cell_id"]], cells.loc[base["cell_id"]]
    if row["cell_id"] == base["cell_id"] or pd.isna(r.get("speed_vs_torch")):
        return False
    if not (_true(r.get("interleaved")) and _true(b.get("interleaved"))):
        return False
    for key in GROUP_KEYS:
        if key == "bucket_cap_mb" and pd.isna(r[key]):
            if naive_group_bucket(r, results, bucket_order) != b[key]:
                return False
        elif not _equal(r[key], b[key]):
            return False
    return True


def _true(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0")


def speedups(ranked: pd.DataFrame, results: pd.DataFrame, spec: dict,
             bucket_order: list[float]) -> pd.DataFrame:
    """`ranked` with SPEEDUP's columns: per ranked row its baseline (baselines()), the speedup, its 95 %
    interval, its p and the Holm-corrected verdict; empty where the row has no baseline."""
    out = ranked.copy()
    for column in SPEEDUP:
        out[column] = pd.Series([float("nan")] * len(out), index=out.index, dtype=object)
    out["baseline"] = False
    if not ranked["rank"].notna().any():
        return out
    chosen = baselines(ranked[ranked["rank"].notna()], spec)
    cells = results.set_index("cell_id")
    for i, row in out[out["rank"].notna()].iterrows():
        base = chosen.get("*", chosen.get(str(row["precision"])))
        if base is None:
            continue
        out.loc[i, "baseline_cell_id"] = base["cell_id"]
        if row["cell_id"] == base["cell_id"]:
            out.loc[i, ["baseline", "speedup_vs_baseline"]] = [True, 1.0]
            continue
        r, b = cells.loc[row["cell_id"]], cells.loc[base["cell_id"]]
        paired = stepped_together(row, base, results, bucket_order)
        if paired:
            ratio, low, high, p = (r["speed_vs_torch"], r["speed_vs_torch_ci95_low"],
                                   r["speed_vs_torch_ci95_high"], r.get("speed_vs_torch_p"))
        else:
            ratio = b["step_time_ms_p50"] / r["step_time_ms_p50"]
            low, high = stats.unpaired_ratio_interval(
                b["step_time_ms_p50"], b["step_time_ms_ci95_low"], b["step_time_ms_ci95_high"],
                r["step_time_ms_p50"], r["step_time_ms_ci95_low"], r["step_time_ms_ci95_high"])
            p = stats.unpaired_ratio_p(ratio, low, high)
        out.loc[i, ["speedup_vs_baseline", "speedup_vs_baseline_ci95_low", "speedup_vs_baseline_ci95_high",
                    "speedup_p", "speedup_paired"]] = [
            float(ratio), _number(low), _number(high), _number(p), paired]
    for column in ("speedup_vs_baseline", "speedup_vs_baseline_ci95_low", "speedup_vs_baseline_ci95_high",
                   "speedup_p"):
        out[column] = pd.to_numeric(out[column], errors="coerce")
    out["verdict_vs_baseline"] = verdict.corrected_verdicts(out)
    family = verdict.comparisons(out)
    for i, row in out[out["rank"].notna() & out["baseline_cell_id"].notna()].iterrows():
        against = "the baseline itself" if row["baseline"] else \
            f"against the baseline: {verdict.speedup_words(row)}, {verdict.words(row, family)}"
        out.loc[i, "why"] = f"{row['why']}; {against}" if row["why"] else against
    return out


def _number(value) -> float:
    return float("nan") if value is None or pd.isna(value) else float(value)
