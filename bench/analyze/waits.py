"""Why a collective is slow: each rank's time in it split into waiting for the last rank and moving bytes,
by aligning the same collective across the ranks' traces (docs/analysis.md, "collective_wait.csv").

A collective cannot complete anywhere before every rank of the group has joined it. So for one collective,
on a common clock, with s_r and e_r rank r's start and end and L = max_r s_r the last rank's start:

    joined_r   = clip(L − s_r, 0, e_r − s_r)      rank r waited for the last rank to join
    transfer_r = (e_r − s_r) − joined_r           the rest: the data moving once everyone was there
    wait_r     = |[s_r, s_r + joined_r] ∖ ∪ earlier [s, s + joined] of rank r|    the wait counted once

A late rank is late to every collective it has in flight: rank r's second all-reduce, issued while the first
still waits, waits for the same late rank, so joined_r counts that lateness again (a 5 ms straggler read
5.03 ms at the step's first all-reduce and 6.00 ms at its second). wait_r keeps only what this collective
adds to rank r's waiting (its instances taken in start order: issue order), so a rank's waits add up to the
union of its waiting, as trace_summary's wait_ms.

Matching: by (process group, Seq) where every instance of the job carries them, else by (step, process
group, collective, ordinal) (collectives.py): gloo's traces carry no Seq (torch 2.13), and c10d requires every
rank to issue a group's collectives in the same order, so the k-th of a step is the same collective.
Clocks: the ranks of one host share a clock; the traces of
different hosts (or whose host is not named) are put on the reference rank's host clock by an offset
estimated from the collectives themselves: an all-reduce, all-gather, reduce-scatter, all-to-all or barrier
ends on every rank within its last hop's latency, so the offset is the median over those of (end on this
host − end on the reference host), kept inside the bounds causality sets (no rank can end a collective
before the last rank started it). A job whose traces name no common clock and have no such collective is
not aligned (empty waits).

A job of one rank (world size 1) waits for nobody: its collectives are all transfer; a lone rank's trace of a
larger job is not compared with anything (empty). Per rank and step (trace_summary.csv)
the collectives other than barriers give unions, as the rest of that file: wait_ms = |∪ waits|,
transfer_ms = |∪ transfers ∖ ∪ waits| (two collectives in flight at once wait for the same late rank once),
and their parts not hidden behind compute, exposed_wait_ms and exposed_transfer_ms, which add up to
exposed_comm_excl_barrier_ms.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analyze import intervals as iv
from bench.analyze.columns import ALL_STEPS, COLLECTIVE_WAIT_COLUMNS, RANK_TIMELINE_COLUMNS

US_PER_MS = 1e3
# Collectives that end at about the same instant on every rank: every rank receives from every other
# (nccl-tests' all-reduce, all-gather, reduce-scatter, all-to-all; a barrier). Not broadcast, reduce or
# send/recv, whose root or sender may finish first.
ENDS_TOGETHER = frozenset({"allreduce", "allgather", "reducescatter", "alltoall", "barrier"})
# Collectives whose message is the same on every rank (all-gather counted by its output, reduce-scatter by
# its input, as comms.row_bytes and nccl-tests count them); all-to-all and send/recv may differ by rank.
SAME_BYTES = frozenset({"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "barrier"})
SUM_COLUMNS = ("wait_ms", "transfer_ms", "exposed_wait_ms", "exposed_transfer_ms")


def job_of(frame: pd.DataFrame) -> pd.Series:
    """The job a trace file belongs to: its cell, else (outside a run) its folder."""
    files = frame["trace_file"].astype(str)
    folder = files.str.rsplit("/", n=1).str[0].where(files.str.contains("/"), ".")
    return frame["cell_id"].where(frame["cell_id"].notna(), folder).astype(str)


def _keys(g: pd.DataFrame) -> pd.Series:
    """The identity of each instance across ranks: (process group, Seq, collective) when every instance has
    a Seq (torch's ProcessGroupNCCL numbers collectives and point-to-point calls apart: a Seq alone may
    repeat in a group),
    else (step, process group, collective, ordinal). A collective that moves the same bytes on every rank
    (SAME_BYTES) but whose ranks recorded different sizes is not one collective (a trace that lost events,
    as the public sampled traces did): each of its instances is left alone, unmatched."""
    pg = g["process_group"].fillna("").astype(str)
    if g["seq"].notna().all():
        key = pg + "#" + g["seq"].astype("int64").astype(str) + "#" + g["collective"].astype(str)
    else:
        key = (g["step"].astype(str) + "|" + pg + "|" + g["collective"].astype(str) + "|"
               + g["ordinal"].astype(str))
    sizes = g["bytes"].where(g["collective"].isin(SAME_BYTES)).groupby(key).transform("nunique")
    return key.where(sizes <= 1, key + "|rank" + g["rank"].astype(str))


def clock_offsets(g: pd.DataFrame) -> tuple[dict[int, float], str]:
    """Per rank the offset (µs) to subtract from its times to put it on the reference rank's clock, and a
    sentence saying how; a rank without an estimate is left out (its waits stay empty)."""
    hosts = g.groupby("rank")["host"].first()
    named = hosts.notna().all()
    if named and hosts.nunique() == 1:
        return {int(r): 0.0 for r in hosts.index}, f"one host ({hosts.iloc[0]}): a shared clock"
    clock = hosts.where(hosts.notna(), "rank " + hosts.index.astype(str)) if not named else hosts
    ref = clock.loc[hosts.index.min()]
    t = g[g["collective"].isin(ENDS_TOGETHER)].assign(clock=g["rank"].map(clock))
    ends = t.groupby(["key", "clock"]).agg(end=("end_us", "median"), first_end=("end_us", "min"),
                                           last_start=("start_us", "max")).reset_index()
    base = ends[ends["clock"] == ref].set_index("key")
    offsets, used = {ref: 0.0}, 0
    for c, h in ends[ends["clock"] != ref].groupby("clock"):
        h = h.merge(base, left_on="key", right_index=True, suffixes=("", "_ref"))
        if not len(h):
            continue
        estimate = float(np.median(h["end"] - h["end_ref"]))
        # causality: aligned, each end comes after the other side's last start
        low = float((h["last_start"] - h["first_end_ref"]).max())
        high = float((h["first_end"] - h["last_start_ref"]).min())
        offsets[c] = min(max(estimate, low), high) if low <= high else estimate
        used = max(used, len(h))
    how = ("hosts not named in the traces: each rank's clock" if not named else "each host's clock")
    text = (f"{how} put on rank {hosts.index.min()}'s by the median of up to {used} collective ends "
            "(all-reduce, all-gather, reduce-scatter, all-to-all, barrier)")
    return {int(r): offsets[clock.loc[r]] for r in hosts.index if clock.loc[r] in offsets}, text


def align(instances: pd.DataFrame) -> pd.DataFrame:
    """Every instance with its joined, wait (counted once) and transfer (µs, its own clock), the job it
    belongs to and how many of its ranks the files hold (`job_ranks`), its key and the key's step
    (`key_step`: the lowest rank's; ranks may number their steps apart when Seq matches them), its clock
    offset and the key's last rank and
    number of ranks. A job of one rank (its trace says world size 1) waits for nobody: wait 0, all of it
    transfer; one rank's trace of a larger job says nothing about waiting (empty). In a job of two or more
    ranks, an instance seen on one rank only (ranks = 1) keeps an empty wait."""
    cols = ["job", "job_ranks", "key", "key_step", "offset_us", "clock", "last_start", "last_rank", "ranks",
            "joined_us", "wait_us", "transfer_us"]
    t = instances[instances["rank"].notna()]
    if t.empty:
        return t.assign(**{c: [] for c in cols})
    t = t.assign(job=job_of(t))
    out = []
    for _, g in t.groupby("job", sort=True):
        g = g.assign(key=_keys(g), job_ranks=g["rank"].nunique())
        if g["job_ranks"].iloc[0] == 1:
            alone = bool((g["world_size"] == 1).all())
            offsets = {int(g["rank"].iloc[0]): 0.0}
            clock = "one rank" if alone else "one rank of a larger job: nothing to compare it with"
        else:
            alone = False
            offsets, clock = clock_offsets(g)
        g = g.assign(offset_us=g["rank"].map(offsets), clock=clock)
        aligned = g["start_us"] - g["offset_us"]
        g = g.assign(last_start=aligned.groupby(g["key"]).transform("max"),
                     ranks=g.groupby("key")["rank"].transform("nunique"),
                     key_step=g["key"].map(g.sort_values("rank").groupby("key")["step"].first()))
        g["last_rank"] = g["key"].map(g.loc[aligned.groupby(g["key"]).idxmax().dropna(), ["key", "rank"]]
                                      .set_index("key")["rank"])
        length = g["end_us"] - g["start_us"]
        matched = (g["job_ranks"] >= 2) & (g["ranks"] >= 2) | alone
        joined = np.clip(g["last_start"] - aligned, 0, length).where(matched)
        g = g.assign(joined_us=joined, transfer_us=length - joined)
        out.append(g.assign(wait_us=counted_once(g)))
    return pd.concat(out, ignore_index=True)


def counted_once(g: pd.DataFrame) -> pd.Series:
    """Per instance, the part of its waiting [start, start + joined] that no earlier instance of its rank
    (trace file) already waited: taken in start order, every earlier interval starts no later, so what they
    cover from this start on is [start, the latest end so far). Unmatched instances (joined empty) stay
    empty and cover nothing."""
    out = pd.Series(np.nan, index=g.index)
    for _, f in g[g["joined_us"].notna()].groupby("trace_file", sort=False):
        f = f.sort_values("start_us", kind="stable")
        ends = (f["start_us"] + f["joined_us"]).to_numpy(float)
        covered = np.maximum.accumulate(np.concatenate([[-np.inf], ends[:-1]]))
        out[f.index] = np.clip(ends - np.maximum(f["start_us"].to_numpy(float), covered), 0, None)
    return out


def multi_rank(aligned: pd.DataFrame) -> pd.DataFrame:
    """The instances of jobs of two or more ranks (collective_wait.csv, stragglers and the timeline's)."""
    return aligned[aligned["job_ranks"] >= 2] if len(aligned) else aligned


def _origins(aligned: pd.DataFrame, segments: pd.DataFrame) -> pd.Series:
    """Per (job, step): the earliest aligned start of the step's host window over the ranks (µs)."""
    offsets = aligned.groupby("trace_file")[["offset_us", "job"]].first()
    w = segments[segments["kind"] == "window"].join(offsets, on="trace_file", how="inner")
    return (w["start_us"] - w["offset_us"]).groupby([w["job"], w["step"].astype(str)]).min()


def wait_rows(aligned: pd.DataFrame, segments: pd.DataFrame) -> pd.DataFrame:
    """collective_wait.csv: one row per instance of a multi-rank job (COLLECTIVE_WAIT_COLUMNS)."""
    aligned = multi_rank(aligned)
    if aligned.empty:
        return pd.DataFrame(columns=list(COLLECTIVE_WAIT_COLUMNS))
    origin = _origins(aligned, segments)
    key = pd.MultiIndex.from_arrays([aligned["job"], aligned["step"].astype(str)])
    start = aligned["start_us"] - aligned["offset_us"] - origin.reindex(key).to_numpy()
    out = aligned.assign(start_ms=start / US_PER_MS, joined_ms=aligned["joined_us"] / US_PER_MS,
                         wait_ms=aligned["wait_us"] / US_PER_MS,
                         transfer_ms=aligned["transfer_us"] / US_PER_MS,
                         clock_offset_ms=aligned["offset_us"] / US_PER_MS)
    out = out[list(COLLECTIVE_WAIT_COLUMNS)].reset_index(drop=True)
    for c in ("rank", "last_rank", "seq", "ordinal", "ranks"):
        out[c] = out[c].astype("Int64")
    return out


def step_sums(aligned: pd.DataFrame, segments: pd.DataFrame) -> pd.DataFrame:
    """Per (trace_file, step), and per trace_file as step `all`, the SUM_COLUMNS of its collectives other than
    barriers (unions, see the module docstring; the compute under them: `hidden` segments); empty where one
    of them has no wait (not matched)."""
    rows = []
    work = aligned[~aligned["barrier"].astype(bool)] if len(aligned) else aligned
    cover = segments[segments["kind"] == "hidden"]
    hidden = {key: iv.union(g["start_us"].to_numpy(float), g["end_us"].to_numpy(float))
              for key, g in cover.groupby([cover["trace_file"], cover["step"].astype(str)], sort=False)}
    for (trace_file, step), g in work.groupby(["trace_file", work["step"].astype(str)], sort=False):
        rows.append({"trace_file": trace_file, "step": step,
                     **_sums(g, hidden.get((trace_file, step), iv.EMPTY))})
    for trace_file, g in work.groupby("trace_file", sort=False):
        mine = [h for (f, _), h in hidden.items() if f == trace_file]
        rows.append({"trace_file": trace_file, "step": ALL_STEPS, **_sums(g, iv.merge(*mine))})
    return pd.DataFrame(rows, columns=["trace_file", "step", *SUM_COLUMNS])


def _sums(g: pd.DataFrame, hidden: np.ndarray) -> dict:
    if g["joined_us"].isna().any():
        return {}
    s, e, w = g["start_us"].to_numpy(float), g["end_us"].to_numpy(float), g["joined_us"].to_numpy(float)
    waiting = iv.union(s, s + w)
    moving = iv.subtract(iv.union(s + w, e), waiting)
    return {"wait_ms": iv.length(waiting) / US_PER_MS, "transfer_ms": iv.length(moving) / US_PER_MS,
            "exposed_wait_ms": iv.length(iv.subtract(waiting, hidden)) / US_PER_MS,
            "exposed_transfer_ms": iv.length(iv.subtract(moving, hidden)) / US_PER_MS}


def with_step_sums(summary: pd.DataFrame, aligned: pd.DataFrame, segments: pd.DataFrame) -> pd.DataFrame:
    """trace_summary with SUM_COLUMNS filled in from the aligned collectives (a single-rank job's: wait 0)."""
    sums = step_sums(aligned, segments)
    out = summary.drop(columns=[c for c in SUM_COLUMNS if c in summary.columns])
    out = out.merge(sums, on=["trace_file", "step"], how="left")
    return out[list(summary.columns)]


def timeline_rows(aligned: pd.DataFrame, segments: pd.DataFrame, stragglers: pd.DataFrame) -> pd.DataFrame:
    """rank_timeline.csv: for one step per job (the one whose late_by_ms is the median of its steps: a
    typical step, not the worst), each rank's host window, compute, and each collective's wait and
    transfer (barriers left out), on the aligned clock, ms from the step's earliest start."""
    aligned = multi_rank(aligned)
    if aligned.empty:
        return pd.DataFrame(columns=list(RANK_TIMELINE_COLUMNS))
    chosen = {}
    for job, s in stragglers.dropna(subset=["late_by_ms"]).groupby("job"):
        ordered = s.sort_values(["late_by_ms", "step"])
        chosen[job] = str(ordered["step"].iloc[len(ordered) // 2])
    origin = _origins(aligned, segments)
    files = aligned.groupby("trace_file")[["job", "cell_id", "rank", "offset_us"]].first()
    seg = segments[segments["kind"].isin(["window", "compute"])].join(files, on="trace_file", how="inner")
    seg = seg[seg["step"].astype(str) == seg["job"].map(chosen)]
    coll = aligned[~aligned["barrier"].astype(bool) & aligned["joined_us"].notna()]
    coll = coll[coll["step"].astype(str) == coll["job"].map(chosen)]
    joined = coll["start_us"] + coll["joined_us"]  # drawn whole: overlapping bars show one wait once
    parts = [seg.assign(s=seg["start_us"], e=seg["end_us"]),
             coll.assign(kind="wait", s=coll["start_us"], e=joined),
             coll.assign(kind="transfer", s=joined, e=coll["end_us"])]
    t = pd.concat([p[["cell_id", "job", "rank", "step", "kind", "s", "e", "offset_us"]] for p in parts],
                  ignore_index=True)
    t = t[t["e"] > t["s"]] if len(t) else t
    base = origin.reindex(pd.MultiIndex.from_arrays([t["job"], t["step"].astype(str)])).to_numpy()
    t = t.assign(start_ms=(t["s"] - t["offset_us"] - base) / US_PER_MS,
                 end_ms=(t["e"] - t["offset_us"] - base) / US_PER_MS, step=t["step"].astype(str))
    out = t[list(RANK_TIMELINE_COLUMNS)].sort_values(["job", "rank", "start_ms"], ignore_index=True)
    out["rank"] = out["rank"].astype("Int64")
    return out
