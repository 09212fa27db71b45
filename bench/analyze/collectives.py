"""Each rank's collectives, as one trace file records them: what bench/analyze/waits.py aligns across ranks.

A collective *instance* is one rank's execution of one collective: on a GPU trace a communication kernel
(HTA's class, launched in the step: the breakdown's own events and times), on a CPU trace the backend's own
event on its worker thread (`gloo:all_reduce`, `gloo:barrier`, …). Each carries what identifies the same
collective on the other ranks:

- `process_group` and `seq`: record_param_comms' `Process Group Name` and `Seq` (current torch with NCCL; on
  the kernel's own args or on the record_param_comms around its launch), else empty;
- `collective`: the collective's name, from record_param_comms' `Collective name`, else the backend's host
  event around the launch (`nccl:all_reduce`; `gloo:all_reduce` itself on CPU), else the kernel's name
  (`ncclDevKernel_AllGather_…`), normalised (`allreduce`, `allgather`, `reducescatter`, `alltoall`,
  `broadcast`, `barrier`, …); a GPU barrier is the kernel launched inside `c10d::barrier`;
- `ordinal`: its place among the instances of the same step, process group and collective, in issue order
  (GPU: launch order; CPU: gloo's worker threads start its queue in issue order).

Beside each instance: its bytes (comms.row_bytes: record_param_comms' or record_shapes' sizes). `segments`
gives per step its host window (kind `window`), its compute coarsened for the report's per-rank timeline
(`compute`), and the compute that ran under the step's collectives (`hidden`: compute ∩ the instances'
union), so that exposed waiting and exposed transfer can be measured once the waits are known. Times are µs
on the rank's own clock.
"""

from __future__ import annotations

import re

import numpy as np

from bench.analyze import classify as C
from bench.analyze import intervals as iv
from bench.analyze.comms import row_bytes

# record_param_comms' keys (torch/csrc/profiler/util.h kProcessGroupName, kSeqNum, kCommsName)
PG_ARG, SEQ_ARG, NAME_ARG = "Process Group Name", "Seq", C.COLLECTIVE_NAME_ARG
_KERNEL_COLLECTIVE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)|^(?:nccl|rccl|hccl):?_*([A-Za-z_]+)")
# Segments of compute closer than this share of the step merge in the timeline: a figure a few hundred
# pixels wide cannot show a gap of one pixel, and a GPU step has tens of thousands of kernels.
SEGMENT_GAP_SHARE = 0.005


def normalise(name: str) -> str:
    """A collective's name as one spelling: lower case, no backend prefix, underscores and `_base` dropped
    (`nccl:_all_gather_base` → `allgather`, `c10d::allreduce_` → `allreduce`, `all_to_all` → `alltoall`)."""
    name = name.split(":")[-1].lower().replace("_base", "")
    return name.replace("_", "")


def kernel_collective(name: str) -> str:
    """The collective an NCCL/RCCL kernel's name spells (`ncclDevKernel_AllReduce_Sum_f32_RING_LL` →
    `allreduce`), else the whole name normalised."""
    m = _KERNEL_COLLECTIVE.search(name)
    return normalise(next(g for g in m.groups() if g)) if m else normalise(name)


def _describers(trace) -> dict[int, np.ndarray]:
    """Per host thread, the rows of the events that say which collective a launch belongs to
    (record_param_comms and the backend's `nccl:*`-style annotations), sorted by start."""
    rows = np.flatnonzero(C.host_mask(trace) & (C.name_mask(trace, C.COLLECTIVE_ARGS_EVENT)
                                                | C.name_mask(trace, C.HOST_COLLECTIVE)))
    rows = rows[np.argsort(trace.ts[rows], kind="stable")]
    return {int(t): rows[trace.tid_id[rows] == t] for t in np.unique(trace.tid_id[rows])}


def _around(trace, by_thread: dict[int, np.ndarray], tid: int, t: float) -> list[int]:
    """The describing events on thread `tid` that contain instant t, innermost (latest start) first."""
    rows = by_thread.get(tid)
    if rows is None or np.isnan(t):
        return []
    k = int(np.searchsorted(trace.ts[rows], t, side="right"))
    return [int(r) for r in rows[max(0, k - 8):k][::-1] if trace.end[r] >= t]  # nesting is a few deep


def _identity(trace, rows: list[int], fallback: str) -> dict:
    """collective, process_group, seq and bytes of one instance from the events describing it."""
    out = {"collective": None, "process_group": None, "seq": None, "bytes": None}
    for r in rows:
        a = trace.comm_args.get(r, {})
        if out["collective"] is None and isinstance(a.get(NAME_ARG), str):
            out["collective"] = normalise(a[NAME_ARG])
        if out["process_group"] is None and a.get(PG_ARG) not in (None, ""):
            out["process_group"] = str(a[PG_ARG])
        if out["seq"] is None and isinstance(a.get(SEQ_ARG), int) and a[SEQ_ARG] >= 0:
            out["seq"] = a[SEQ_ARG]
        if out["bytes"] is None:
            out["bytes"] = row_bytes(trace, r)
    if out["collective"] is None:
        named = [trace.name_of(r) for r in rows if C.HOST_COLLECTIVE.match(trace.name_of(r))]
        out["collective"] = normalise(named[0]) if named else fallback
    return out


def _coarse(compute: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """compute ∩ [lo, hi), with gaps shorter than SEGMENT_GAP_SHARE of the window closed."""
    c = iv.clip(compute, lo, hi)
    if len(c) < 2:
        return c
    keep = np.append(True, c[1:, 0] - c[:-1, 1] > SEGMENT_GAP_SHARE * (hi - lo))
    first = np.flatnonzero(keep)
    last = np.append(first[1:] - 1, len(c) - 1)
    return np.column_stack([c[first, 0], c[last, 1]])


def _rows(windows, starts, ends, computes, identities, barrier, order) -> tuple[list[dict], list[dict]]:
    """Instances and segments from per-event arrays: `computes[k]` is window k's compute set; an event
    belongs to the window given by `order` (window index per event, -1: none)."""
    instances, segments = [], []
    counters: dict[tuple, int] = {}
    for k, w in enumerate(windows):
        mine = np.flatnonzero(order == k)
        hidden = iv.intersect(computes[k], iv.union(starts[mine], ends[mine]))
        for kind, pieces in (("window", [(w.lo, w.hi)]), ("compute", _coarse(computes[k], w.lo, w.hi)),
                             ("hidden", hidden)):
            segments += [{"step": w.step, "kind": kind, "start_us": float(a), "end_us": float(b)}
                         for a, b in pieces]
        for i in mine:
            ident = identities[i]
            key = (w.step, ident["process_group"], ident["collective"])
            counters[key] = counters.get(key, -1) + 1
            instances.append({"step": w.step, **ident, "ordinal": counters[key], "barrier": bool(barrier[i]),
                              "start_us": float(starts[i]), "end_us": float(ends[i])})
    return instances, segments


def gpu_collectives(trace, view, windows: list) -> tuple[list[dict], list[dict]]:
    """(instances, segments) of a GPU trace: its communication kernels launched in each of `windows` (the
    steps; a trace without steps: its `all` window, every kernel), in launch order."""
    comm = np.flatnonzero((view.cls == C.COMM) & ~np.isnan(view.launch))
    comm = comm[np.argsort(view.launch[comm], kind="stable")]
    order = np.full(len(comm), -1)
    computes = []
    for k, w in enumerate(windows):
        sel = view.selected(w)
        order[sel[comm] & (order < 0)] = k
        c = sel & (view.cls == C.COMPUTE)
        computes.append(iv.union(view.bts[c], view.bend[c]))
    by_thread = _describers(trace)
    identities = []
    for g in comm:
        row = int(view.rows[g])
        around = _around(trace, by_thread, int(view.launch_tid[g]), float(view.launch_raw[g]))
        ident = _identity(trace, ([row] if row in trace.comm_args else []) + around,
                          kernel_collective(trace.name_of(row)))
        if view.barrier[g]:
            ident["collective"] = "barrier"
        identities.append(ident)
    return _rows(windows, view.bts[comm], view.bend[comm], computes, identities, view.barrier[comm], order)


def cpu_collectives(trace, view, windows: list) -> tuple[list[dict], list[dict]]:
    """(instances, segments) of a CPU trace: the backend's collective events on its worker threads that
    start in each step (every one for a trace without steps: its `all` window), in start order."""
    ops = C.cat_mask(trace, C.HOST_OP_CATS)
    rows = np.flatnonzero(C.name_mask(trace, C.HOST_COLLECTIVE) & ~ops)
    rows = rows[np.argsort(trace.ts[rows], kind="stable")]
    order = np.full(len(rows), -1)
    for k, w in enumerate(windows):
        order[(trace.ts[rows] >= w.lo) & (trace.ts[rows] < w.hi) & (order < 0)] = k
    identities = [{"collective": normalise(trace.name_of(r)), "process_group": None, "seq": None,
                   "bytes": row_bytes(trace, int(r))} for r in rows]
    barrier = C.name_mask(trace, C.HOST_BARRIER)[rows]
    return _rows(windows, trace.ts[rows], trace.end[rows], [view.compute] * len(windows), identities, barrier,
                 order)
