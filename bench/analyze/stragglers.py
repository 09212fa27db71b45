"""Stragglers from the aligned collectives (docs/analysis.md, "stragglers.csv"): per step, the
rank the others waited for (bench/analyze/waits.py aligns each collective across the ranks' traces and puts
them on one clock; raw clocks are never compared).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.analyze import intervals as iv
from bench.analyze.columns import STRAGGLER_COLUMNS
from bench.analyze.waits import US_PER_MS, multi_rank


def _union(pieces: list[tuple[float, float]]) -> np.ndarray:
    starts, ends = np.array(pieces, dtype=float).reshape(-1, 2).T
    return iv.union(starts, ends)


def straggler_rows(aligned: pd.DataFrame) -> pd.DataFrame:
    """stragglers.csv: per (job, step), the rank the others waited for (STRAGGLER_COLUMNS).

    For each matched collective other than a barrier: its last rank and the moment the next-latest rank
    started (the job waited for the last one alone from then on). held_r = |∪ of [next-latest start,
    last start] over the collectives where r was last|; the straggler is the rank with the largest held time,
    late_by_ms = that time, spread_ms = |∪ [earliest start, last start]| over the step's collectives.
    """
    aligned = multi_rank(aligned)
    if aligned.empty:
        return pd.DataFrame(columns=list(STRAGGLER_COLUMNS))
    aligned = aligned.assign(step=aligned["key_step"].astype(str))  # a collective's step: its lowest rank's
    work = aligned[~aligned["barrier"].astype(bool) & (aligned["ranks"] >= 2)]
    work = work.assign(t=work["start_us"] - work["offset_us"])
    by_step = dict(iter(work.groupby(["job", "step"], sort=False)))
    rows = []
    for (job, step), g in aligned.groupby(["job", "step"], sort=True):
        row = {"cell_id": g["cell_id"].iloc[0], "job": job, "step": step, "ranks": g["rank"].nunique()}
        held: dict[int, list] = {}
        spread = []
        for _, k in by_step.get((job, step), work.iloc[:0]).groupby("key"):
            k = k.sort_values("t")
            starts = k["t"].to_numpy()
            held.setdefault(int(k["rank"].iloc[-1]), []).append((starts[-2], starts[-1]))
            spread.append((starts[0], starts[-1]))
        lengths = {r: iv.length(_union(pieces)) for r, pieces in held.items()}
        if lengths and max(lengths.values()) > 0:
            rank = max(lengths, key=lambda r: (lengths[r], -r))
            row.update(straggler_rank=rank, late_by_ms=lengths[rank] / US_PER_MS,
                       spread_ms=iv.length(_union(spread)) / US_PER_MS)
        rows.append(row)
    out = pd.DataFrame(rows, columns=list(STRAGGLER_COLUMNS))
    out["straggler_rank"] = out["straggler_rank"].astype("Int64")
    return out


# Named persistent only when chance cannot explain it: if every rank were equally likely to be last in each
# step, the chance that some rank is last in at least k of n steps is at most r · P(Binomial(n, 1/r) ≥ k)
# (a union bound over the r ranks). With two ranks, last in 2 or 3 of 3 steps happens to someone every time.
PERSISTENT_P = 0.05


def chance_last(k: int, n: int, ranks: int) -> float:
    """The union bound above: the chance that, by luck alone, some one of `ranks` ranks is last in at least
    k of n steps."""
    p = 1.0 / ranks
    tail = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
    return min(1.0, ranks * tail)


def persistent_stragglers(stragglers: pd.DataFrame) -> pd.DataFrame:
    """Per job: the rank last in most measured steps, how many, the median late_by_ms of those steps,
    `chance_p` (chance_last) and `persistent`: last in more than half of the steps and chance_p at most
    PERSISTENT_P (a rank merely last at random, as one of two ranks always is in two of three steps, is not
    named; one step is never evidence)."""
    s = stragglers.dropna(subset=["straggler_rank"])
    rows = []
    for job, g in s.groupby("job", sort=True):
        counts = g["straggler_rank"].value_counts()
        rank, k = int(counts.index[0]), int(counts.iloc[0])
        late = g["late_by_ms"][g["straggler_rank"] == rank]
        chance = chance_last(k, len(g), max(2, int(g["ranks"].max())))
        rows.append({"cell_id": g["cell_id"].iloc[0], "job": job, "straggler_rank": rank, "steps_last": k,
                     "steps": len(g), "late_by_ms_p50": float(np.median(late)), "chance_p": chance,
                     "persistent": k > len(g) / 2 and chance <= PERSISTENT_P})
    return pd.DataFrame(rows, columns=["cell_id", "job", "straggler_rank", "steps_last", "steps",
                                       "late_by_ms_p50", "chance_p", "persistent"])
