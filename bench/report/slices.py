"""The slice of a run a figure or a sentence speaks of: every setting it does not examine held at one value.

A run sweeps many settings; a plot of throughput against world size, or the sentence "at 2 ranks overlap
is fastest", must compare like with like. Each unexamined setting is held at its most common value (ties
broken by PREFERRED), in the order of SLICE_KEYS, each among the rows the earlier ones left. The plots,
the findings and the compare page all take their slice from here, so they always describe the same cells.
"""

from __future__ import annotations

import pandas as pd

from bench.report.tables import key_text
from bench.schema import CONFIG_KEYS, DEFAULT_BUCKET_MB, PRECISIONS

# An unexamined setting is held at its most common value; ties go to the first of these that is present,
# then to the largest bucket, the smallest number or the first name.
PREFERRED = {
    "scaling": ("strong",),
    "precision": PRECISIONS,
    "comm_dtype": ("none",),
    "grad_accum": ("1",),
    "bucket_cap_mb": (key_text(DEFAULT_BUCKET_MB),),
    # every engine option at its default: plain engines (fsdp2, whose id always names its reshard setting,
    # and the option cells are in the tables and the memory trade-off section, not in these figures)
    "engine_options": ("",),
}
# Held in this order, each among the rows the earlier ones left. `_batch` is the batch a configuration keeps
# across world sizes and accumulation factors (see `with_batch`).
SLICE_KEYS = (
    "scaling",
    "model",
    "model_size",
    "precision",
    "comm_dtype",
    "grad_accum",
    "bucket_cap_mb",
    "engine_options",
    "_batch",
)
# Every configuration key is examined by every figure (engine, world size), folded into `_batch`, or held.
_ACCOUNTED_FOR = set(SLICE_KEYS) - {"_batch"} | {"engine", "world_size", "per_rank_batch", "global_batch"}
assert _ACCOUNTED_FOR == set(CONFIG_KEYS), "a new bench.schema.CONFIG_KEYS key: hold it in SLICE_KEYS"


def order_key(text: str):
    """Sort key for key texts: numbers by value, then names."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def with_batch(t: pd.DataFrame, scaling: str | None = None) -> pd.DataFrame:
    """`t` plus `_batch`: strong scaling keeps global batch ÷ grad_accum, weak the per-rank batch."""
    t = t.copy()
    rule = t["scaling"] if "scaling" in t else pd.Series(scaling or "strong", index=t.index)
    accum = t["grad_accum"].astype(float)
    per_rank = t["per_rank_batch"] if "per_rank_batch" in t else t["global_batch"] / (t["world_size"] * accum)
    t["_batch"] = (t["global_batch"] / accum).where(rule == "strong", per_rank)
    return t


def rows_at(t: pd.DataFrame, held: dict[str, str]) -> pd.DataFrame:
    """The rows of `t` at the `held` values (setting → key text); an empty value, as naive's bucket, matches
    any."""
    keep = pd.Series(True, index=t.index)
    for key, value in held.items():
        if key in t:
            keep &= t[key].isna() | (t[key].map(key_text) == value)
    return t[keep]


def held_values(t: pd.DataFrame, examined: tuple[str, ...]) -> dict[str, str]:
    """setting → the value (as key text) it is held at, for each setting the figure does not examine."""
    held: dict[str, str] = {}
    for key in SLICE_KEYS:
        values = t[key].dropna().map(key_text) if key in t and key not in examined else []
        if not len(values):
            continue
        counts = values.value_counts()
        tied = sorted(counts[counts == counts.max()].index, key=order_key)
        preferred = [p for p in PREFERRED.get(key, ()) if p in tied]
        held[key] = preferred[0] if preferred else tied[-1] if key == "bucket_cap_mb" else tied[0]
        t = rows_at(t, {key: held[key]})
    return held


def main_slice(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of `df` in the run's reference slice (naive's bucket-less cells included): the like-for-like
    set that the headline sentences and the compare plots use, the same one the report's plots hold."""
    if not len(df):
        return df
    t = with_batch(df)
    return rows_at(t, held_values(t, examined=())).drop(columns="_batch")
