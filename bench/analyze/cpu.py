"""One window's breakdown on a CPU (gloo) trace (definitions: docs/analysis.md, "CPU (gloo)").

There are no kernels. gloo runs each collective on a background thread and records it there
(`gloo:all_reduce`, `gloo:barrier`, …): communication = the union of those intervals. compute = the main
thread's operator time outside the host side of communication: c10d's collective ops (the issue, and for a
blocking call its wait) are removed; the engines' waits (ddp_core.wait, torch's reducer waiting for its
buckets) record no operator, so their idle time is outside compute by construction, while the operators
inside them (copying reduced buckets back) are compute. Every interval is clipped to the window.
"""

from __future__ import annotations

from bench.analyze import classify as C
from bench.analyze import intervals as iv
from bench.analyze.comms import collectives, window_bytes_busbw
from bench.analyze.gpu import US_PER_MS, _barrier_columns, _pct
from bench.analyze.steps import Window, main_thread
from bench.analyze.trace import Trace


class CpuView:
    """A CPU trace's events, classified once; `window(w)` measures one window."""

    def __init__(self, trace: Trace):
        self.trace = trace
        main = main_thread(trace)
        ops = C.cat_mask(trace, C.HOST_OP_CATS) & ~C.name_mask(trace, C.PROFILER_STEP)
        main_ops = ops & (trace.tid_id == main)
        host_side = main_ops & C.name_mask(trace, C.COLLECTIVE_HOST_OP)
        sets = lambda m: iv.union(trace.ts[m], trace.end[m])
        self.compute = iv.subtract(sets(main_ops), sets(host_side))
        coll = C.name_mask(trace, C.HOST_COLLECTIVE) & ~ops
        self.comm = sets(coll)
        barrier = coll & C.name_mask(trace, C.HOST_BARRIER)
        self.barrier, self.comm_excl_barrier = sets(barrier), sets(coll & ~barrier)
        self.allreduce = sets(coll & C.name_mask(trace, C.HOST_ALLREDUCE))
        self.allgather = sets(coll & C.name_mask(trace, C.HOST_ALLGATHER))
        self.reduce_scatter = sets(coll & C.name_mask(trace, C.HOST_REDUCE_SCATTER))
        # reduce-scatters issued but run under another collective's name (gloo: as all-reduces)
        self.reduce_scatter_hidden = bool((ops & C.name_mask(trace, C.REDUCE_SCATTER_ISSUE_OP)).any()) and \
            not len(self.reduce_scatter)
        # TensorBoard's CPU Exec: operator time not under communication
        self.exec = iv.subtract(sets(ops), self.comm)
        self.colls = collectives(trace)

    def window(self, w: Window) -> dict:
        """The summary columns for one window; GPU-only columns are absent (empty in the CSV)."""
        length = w.hi - w.lo
        row: dict = {"cpu_exec_pct": _pct(iv.length(iv.clip(self.exec, w.lo, w.hi)), length)}
        compute, comm = iv.clip(self.compute, w.lo, w.hi), iv.clip(self.comm, w.lo, w.hi)
        busy = iv.merge(compute, comm)
        if not len(busy):
            return row
        span = float(busy[-1, 1] - busy[0, 0])
        comm_len, compute_len = iv.length(comm), iv.length(compute)
        overlap = iv.length(iv.intersect(comm, compute))
        allreduce = iv.length(iv.clip(self.allreduce, w.lo, w.hi))
        row.update(
            span_ms=span / US_PER_MS, busy_ms=iv.length(busy) / US_PER_MS, compute_ms=compute_len / US_PER_MS,
            comm_ms=comm_len / US_PER_MS, idle_ms=(span - iv.length(busy)) / US_PER_MS,
            overlap_ms=overlap / US_PER_MS, overlap_pct=_pct(overlap, comm_len),
            exposed_comm_ms=(comm_len - overlap) / US_PER_MS, allreduce_ms=allreduce / US_PER_MS,
            # no kernels on a CPU: the device's work is its operators plus its collectives
            allreduce_share_of_kernel_pct=_pct(allreduce, compute_len + comm_len),
            allgather_ms=iv.length(iv.clip(self.allgather, w.lo, w.hi)) / US_PER_MS,
            reduce_scatter_ms=None if self.reduce_scatter_hidden
            else iv.length(iv.clip(self.reduce_scatter, w.lo, w.hi)) / US_PER_MS,
        )
        row.update(_barrier_columns(iv.clip(self.barrier, w.lo, w.hi),
                                    iv.clip(self.comm_excl_barrier, w.lo, w.hi), compute))
        row["comm_bytes"], row["comm_busbw_gbps"] = window_bytes_busbw(self.colls, w.lo, w.hi, row["comm_ms"])
        return row
