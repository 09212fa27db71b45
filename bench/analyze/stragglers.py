"""Stragglers from the traces (docs/design.md, "bench analyze", stragglers.csv), from bucket_timeline rows.

Ranks' clocks are never compared raw. Within a step every rank runs the same last gradient all-reduce, and
an all-reduce ends on every rank at the same moment (within its last hop's latency): that end is the
common reference. Each rank's `join_ms` = its part of that all-reduce began − it ended (≤ 0; on GPU the
NCCL kernel's start, when the rank's stream had finished the backward work before it; on CPU gloo's
worker event). The rank that joined last is the one whose backward finished last: the others waited for it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analyze.columns import STRAGGLER_COLUMNS


def _group(timeline: pd.DataFrame) -> pd.Series:
    """The job a trace file belongs to: its cell, else (outside a run) its folder."""
    folder = timeline["trace_file"].astype(str).str.rsplit("/", n=1).str[0].where(
        timeline["trace_file"].astype(str).str.contains("/"), ".")
    return timeline["cell_id"].where(timeline["cell_id"].notna(), folder).astype(str)


def straggler_rows(timeline: pd.DataFrame) -> pd.DataFrame:
    """stragglers.csv: one row per (cell, step) seen by at least two ranks with the same number of buckets."""
    if timeline.empty:
        return pd.DataFrame(columns=list(STRAGGLER_COLUMNS))
    t = timeline.assign(group=_group(timeline), n=1)
    t = t[t["rank"].notna() & (t["step"].astype(str) != "")]
    per = t.groupby(["group", "step", "rank"], sort=True).agg(
        cell_id=("cell_id", "first"), buckets=("n", "sum"), last=("bucket", "max"))
    last = t.merge(per.reset_index()[["group", "step", "rank", "last", "buckets"]],
                   on=["group", "step", "rank"])
    last = last[last["bucket"] == last["last"]]
    last = last.assign(join_ms=last["comm_start_ms"] - last["comm_end_ms"])
    rows = []
    for (group, step), g in last.groupby(["group", "step"], sort=True):  # one iteration per step, not event
        ok = len(g) >= 2 and g["buckets"].nunique() == 1 and g["join_ms"].notna().all()
        row = {"cell_id": g["cell_id"].iloc[0], "job": group, "step": step, "ranks": len(g)}
        if ok:
            order = g.sort_values("join_ms", ascending=False)
            joins = order["join_ms"].to_numpy()
            row.update(straggler_rank=int(order["rank"].iloc[0]), late_by_ms=float(joins[0] - joins[1]),
                       spread_ms=float(joins[0] - joins[-1]))
        rows.append(row)
    out = pd.DataFrame(rows, columns=list(STRAGGLER_COLUMNS))
    out["straggler_rank"] = out["straggler_rank"].astype("Int64")
    return out


MIN_STEPS = 2  # measured steps before a rank can be named a persistent straggler


def persistent_stragglers(stragglers: pd.DataFrame) -> pd.DataFrame:
    """Per job: the rank last in most measured steps, how many, and the median late_by_ms of those steps;
    `persistent` when it was last in more than half of them and at least MIN_STEPS were measured (a rank
    that is merely last at random, as one of two ranks is, does not get named; nor is one step evidence:
    `make bench` on CPU profiles one step per cell)."""
    s = stragglers.dropna(subset=["straggler_rank"])
    rows = []
    for job, g in s.groupby("job", sort=True):
        counts = g["straggler_rank"].value_counts()
        rank, k = int(counts.index[0]), int(counts.iloc[0])
        late = g["late_by_ms"][g["straggler_rank"] == rank]
        rows.append({"cell_id": g["cell_id"].iloc[0], "job": job, "straggler_rank": rank, "steps_last": k,
                     "steps": len(g), "late_by_ms_p50": float(np.median(late)),
                     "persistent": k > len(g) / 2 and len(g) >= MIN_STEPS})
    return pd.DataFrame(rows, columns=["cell_id", "job", "straggler_rank", "steps_last", "steps",
                                       "late_by_ms_p50", "persistent"])
