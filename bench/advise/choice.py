"""Which configuration the answer names: advice.csv's `answer_role`, decided from the verdicts against the
baseline (verdict.py, the one rule), never from which of several tied medians happens to be highest (two
runs of a preset must not flip the headline between tied choices).

The answer speaks of one precision (api.answer_precision: `--precision`, else the one a GPU user trains in;
the other precisions' rows stay in advice.csv against their own baselines). At that precision:
- some configurations are `faster` than the baseline (Holm-corrected): of the best-ranked of them and those
  whose throughput interval overlaps it (`tied`), the simplest is `use` (`simplicity`);
- none is: the baseline is `keep` (a user changes nothing without a reason), or `unclear` when some other
  configuration whose interval reaches above 1 has no interval or one wider than ±UNSTABLE_HALF_WIDTH_PCT
  (a re-measurement could still find it faster). Its `contender` is the best-ranked other whose interval
  does not lie below 1; when every other one does, the best-ranked other (the answer calls it slower,
  never the best);
- there is no baseline at that precision: rank 1 of it is `best`, its ties `tied`; the answer then says
  what was measured, never "Use" (there is nothing beside it to be faster than).
"""
from __future__ import annotations

import math

import pandas as pd

from bench import engines, stats
from bench.advise import verdict

NAMED = ("use", "keep", "unclear", "best")  # the roles of the row the answer is about (one per answer)
# the settings whose change from the baseline counts one each (and each engine option word: changes())
CHANGE_KEYS = ("engine", "bucket_cap_mb", "comm_dtype", "grad_accum")


def options(row: pd.Series) -> list[str]:
    """The row's engine option words (empty: plain)."""
    value = row.get("engine_options")
    return value.split() if isinstance(value, str) else []


def changes(row: pd.Series, base: pd.Series) -> int:
    """How many settings `row` changes from `base` (simplicity's first criterion)."""
    return sum(1 for k in CHANGE_KEYS if not _equal(row[k], base[k])) + len(options(row))


def _equal(a, b) -> bool:
    if pd.isna(a) or pd.isna(b):
        return bool(pd.isna(a) and pd.isna(b))
    return str(a) == str(b)


def simplicity(row: pd.Series, base: pd.Series) -> tuple:
    """The sort key of simplicity, smaller first; a fixed order with no measured number in it: fewest
    settings changed from the baseline (engine, bucket size, gradient dtype, accumulation split, each engine
    option); then torch's own DDP before another engine, engines in the registry's order; fewer engine
    options; the bucket size nearer the baseline's (log scale); uncompressed gradients before compressed;
    less accumulation; last the cell id."""
    order = engines.names()
    engine = order.index(row["engine"]) if row["engine"] in order else len(order)
    bucket = row["bucket_cap_mb"]
    distance = math.inf if pd.isna(bucket) or pd.isna(base["bucket_cap_mb"]) else abs(
        math.log(float(bucket) / float(base["bucket_cap_mb"])))
    return (changes(row, base), row["engine"] != engines.reference().name, engine, len(options(row)),
            distance, row["comm_dtype"] != "none", int(row["grad_accum"]), str(row["cell_id"]))


def wide(row: pd.Series) -> bool:
    """The row's speedup interval is missing or wider than ±UNSTABLE_HALF_WIDTH_PCT of the speedup: the
    measurement cannot tell it from the baseline."""
    low, high = row["speedup_vs_baseline_ci95_low"], row["speedup_vs_baseline_ci95_high"]
    if pd.isna(low) or pd.isna(high):
        return True
    return stats.half_width_pct(row["speedup_vs_baseline"], low, high) > stats.UNSTABLE_HALF_WIDTH_PCT


def could_be_faster(row: pd.Series) -> bool:
    """A row the answer may still hold out as a reason to re-measure: its interval does not lie below 1."""
    return not verdict.below_one(row)


def answer_roles(table: pd.DataFrame, precision: str) -> pd.Series:
    """advice.csv's `answer_role` per row (module docstring) at `precision`: "" for rows the answer does
    not name."""
    roles = pd.Series("", index=table.index, dtype=object)
    ranked = table[table["rank"].notna()].sort_values("rank")
    here = ranked[ranked["precision"] == precision]
    if here.empty:
        return roles
    base = here[here["baseline"].astype(bool)]
    if base.empty:
        roles[here.index[0]] = "best"
        roles[here[here["tied_with_best"].astype(bool)].index] = "tied"
        return roles
    base = base.iloc[0]
    others = here[~here["baseline"].astype(bool)]
    winners = others[others["verdict_vs_baseline"] == verdict.FASTER]
    if len(winners):
        top = winners.iloc[0]
        tied = winners[(winners["samples_per_s_ci95_high"] >= top["samples_per_s_ci95_low"])
                       | (winners["cell_id"] == top["cell_id"])]
        chosen = min(tied.index, key=lambda i: simplicity(tied.loc[i], base))
        roles[tied.index] = "tied"
        roles[chosen] = "use"
        return roles
    open_ = others[[could_be_faster(r) for _, r in others.iterrows()]]
    roles[base.name] = "unclear" if any(wide(r) for _, r in open_.iterrows()) else "keep"
    if len(open_):
        roles[open_.index[0]] = "contender"
    elif len(others):
        roles[others.index[0]] = "contender"
    return roles
