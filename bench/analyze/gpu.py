"""One window's breakdown on a GPU trace (definitions: docs/analysis.md, "GPU (cuda, rocm)").

Breakdown (HolisticTraceAnalysis's definitions): the window's GPU activity is every kernel, memcpy and
memset *launched* from inside it (the runtime call with the same `correlation` started in the window). The
`all` row follows HTA's `_filter_irrelevant_gpu_kernels` with include_last_profiler_step: every GPU event
launched up to the last step's end (no lower bound), or, with fewer than two steps, every GPU event.
An event whose launch is not in the trace belongs to no window: it ran for a step the profiler did not
record (the window opens while the GPU still runs the previous step's kernels); the `all` row counts
them in `unlaunched_kernels` / `unlaunched_ms` instead. Only a trace with no correlated launch at all
(GPU events alone) places its events by their own start. span = first to last of the window's events;
busy = their union; compute / comm / memory = the unions of each class; idle = span − busy; overlap =
|comm ∩ compute|; overlap_pct = overlap / comm; exposed_comm = comm − overlap.

Utilisation (the TensorBoard plugin's definitions, gpu_metrics_parser.py): kernels clipped to the host
window by time, divided by the window: gpu_util = |∪ kernels| / window; sm_efficiency = ∫ min(Σ blocks per
SM of the running kernels, 1) dt / window; achieved_occupancy = mean of `est. achieved occupancy %`
weighted by each kernel's time in the window.
"""

from __future__ import annotations

import numpy as np

from bench.analyze import classify as C
from bench.analyze import intervals as iv
from bench.analyze.columns import ALL_STEPS
from bench.analyze.comms import collectives, window_bytes_busbw
from bench.analyze.steps import Window
from bench.analyze.trace import Trace

US_PER_MS = 1e3


def _pct(num: float, den: float) -> float | None:
    return 100.0 * num / den if den > 0 else None


def _barrier_columns(barrier: np.ndarray, comm_excl_barrier: np.ndarray, compute: np.ndarray) -> dict:
    """barrier_ms = |barrier|; exposed_comm_excl_barrier_ms = |communication other than barriers ∖ compute|
    (the trace's witness of exposed communication: the profiled pass's per-step barrier is not the
    training step's communication)."""
    return {"barrier_ms": iv.length(barrier) / US_PER_MS,
            "exposed_comm_excl_barrier_ms": iv.length(iv.subtract(comm_excl_barrier, compute)) / US_PER_MS}


class GpuView:
    """A GPU trace's events, classified once; `window(w)` measures one window."""

    def __init__(self, trace: Trace, n_steps: int):
        self.trace, self.n_steps = trace, n_steps  # n_steps: the trace's ProfilerSteps (the `all` rule)
        gpu = np.flatnonzero(C.cat_mask(trace, C.GPU_CATS) | self._stream_syncs(trace))
        self.rows = gpu  # trace rows of the GPU events: idle.py, launch.py and kernel_classes.py read them
        self.ts, self.end = trace.ts[gpu], trace.end[gpu]  # as recorded: the utilisation columns
        self.cls = C.gpu_classes(trace, gpu)
        self.is_sync = C.cat_mask(trace, frozenset({C.SYNC_CAT}))[gpu]
        self.is_kernel = C.cat_mask(trace, frozenset({"kernel"}))[gpu]
        self.allreduce = (self.cls == C.COMM) & C.name_mask(trace, C.ALLREDUCE_KERNEL)[gpu]
        self.allgather = (self.cls == C.COMM) & C.name_mask(trace, C.ALLGATHER_KERNEL)[gpu]
        self.reduce_scatter = (self.cls == C.COMM) & C.name_mask(trace, C.REDUCE_SCATTER_KERNEL)[gpu]
        self.blocks_per_sm = trace.blocks_per_sm[gpu]
        self.occupancy = trace.occupancy[gpu]
        self.launch, self.launch_tid = self._launch_times(trace, gpu)
        self.launch_raw = self.launch  # as recorded (the host events it is compared with are not rounded)
        self.barrier = (self.cls == C.COMM) & self._in_barrier(trace, self.launch, self.launch_tid)
        # ns-resolution traces (fractional µs): HTA rounds every event inward to whole µs, start up and end
        # down (hta/common/trace_parser.py round_down_time_stamps; Kineto's ns timestamps made neighbouring
        # events overlap, pytorch/pytorch#122425). The breakdown does the same; an event that rounds to less
        # than nothing (shorter than a µs) becomes an instant at its rounded end, where HTA gives it a
        # negative length: the span is HTA's, its busy time differs by that fraction of a µs.
        self.rounded = bool(np.any(trace.ts != np.floor(trace.ts)))
        if self.rounded:
            self.bend = np.floor(self.end)
            self.bts = np.minimum(np.ceil(self.ts), self.bend)
            self.launch = np.ceil(self.launch)
        else:
            self.bts, self.bend = self.ts, self.end
        self.host = self._host_roles(trace)
        self.colls = collectives(trace)

    @staticmethod
    def _stream_syncs(trace: Trace) -> np.ndarray:
        """CUPTI synchronisation records drawn on a stream (tid = the stream, not -1): GPU events to HTA."""
        sync = C.cat_mask(trace, frozenset({C.SYNC_CAT}))
        if not sync.any():
            return sync
        on_stream = np.array([str(tid) != "-1" for _, tid in trace.threads], dtype=bool)
        return sync & on_stream[trace.tid_id]

    @staticmethod
    def _launch_times(trace: Trace, gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each GPU event's launch: the start of the runtime call with its correlation id, and that call's
        thread (-1 where none); NaN where that call is not in the trace. A trace with no correlated runtime
        call at all: each event's own start."""
        runtime = np.flatnonzero(C.cat_mask(trace, C.RUNTIME_CATS) & ~np.isnan(trace.correlation))
        tid = np.full(len(gpu), -1, dtype=np.int64)
        if not len(runtime):
            return trace.ts[gpu].copy(), tid
        launch = np.full(len(gpu), np.nan)
        corr = trace.correlation[runtime]
        order = np.argsort(corr, kind="stable")
        corr, start, thread = corr[order], trace.ts[runtime][order], trace.tid_id[runtime][order]
        want = trace.correlation[gpu]
        pos = np.clip(np.searchsorted(corr, want), 0, len(corr) - 1)
        found = corr[pos] == want
        launch[found], tid[found] = start[pos[found]], thread[pos[found]]
        return launch, tid

    @staticmethod
    def _in_barrier(trace: Trace, launch: np.ndarray, launch_tid: np.ndarray) -> np.ndarray:
        """Whether each GPU event was launched inside a `c10d::barrier` op on the launching thread (NCCL's
        barrier is a one-element all-reduce kernel; only its issue says it is a barrier)."""
        ops = np.flatnonzero(C.cat_mask(trace, C.HOST_OP_CATS) & C.name_mask(trace, C.BARRIER_ISSUE_OP))
        inside = np.zeros(len(launch), dtype=bool)
        for i in ops:
            inside |= ((launch_tid == trace.tid_id[i]) & (launch >= trace.ts[i]) & (launch < trace.end[i]))
        return inside

    def selected(self, w: Window) -> np.ndarray:
        """The GPU events the window launched (see the module docstring for the `all` row)."""
        lo, hi = (np.ceil(w.lo), np.floor(w.hi)) if self.rounded else (w.lo, w.hi)
        if w.step != ALL_STEPS:  # HTA's iteration of a host event: step.ts <= ts < step.ts + step.dur
            return (self.launch >= lo) & (self.launch < hi)
        if self.n_steps < 2:
            return np.ones(len(self.launch), dtype=bool)
        return self.launch <= hi  # NaN (not launched in the trace) compares False

    def _host_roles(self, trace: Trace) -> dict[str, np.ndarray]:
        """Interval sets for the CPU-exec breakdown (TensorBoard's overview categories)."""
        ops = C.cat_mask(trace, C.HOST_OP_CATS) & ~C.name_mask(trace, C.PROFILER_STEP)
        host_comm = C.host_mask(trace) & C.name_mask(trace, C.HOST_COLLECTIVE)
        dataloader = ops & C.name_mask(trace, C.DATALOADER)
        runtime = C.cat_mask(trace, C.RUNTIME_CATS)
        sets = lambda m: iv.union(trace.ts[m], trace.end[m])
        busy_gpu = iv.union(self.ts[~self.is_sync], self.end[~self.is_sync])
        return {
            "ops": sets(ops),
            # everything ranked above "CPU Exec": GPU work, communication, runtime calls, data loading
            "above": iv.merge(busy_gpu, sets(host_comm), sets(runtime), sets(dataloader)),
        }

    def window(self, w: Window) -> dict:
        """The summary columns for one window (ms and %; None where not measurable)."""
        row: dict = {}
        sel = self.selected(w)
        if w.step == ALL_STEPS:
            gone = np.isnan(self.launch)
            row.update(unlaunched_kernels=int(gone.sum()),
                       unlaunched_ms=iv.length(iv.union(self.bts[gone], self.bend[gone])) / US_PER_MS)
        if sel.any():
            ts, end, cls = self.bts[sel], self.bend[sel], self.cls[sel]
            busy = iv.union(ts, end)
            compute = iv.union(ts[cls == C.COMPUTE], end[cls == C.COMPUTE])
            comm = iv.union(ts[cls == C.COMM], end[cls == C.COMM])
            memory = iv.union(ts[cls == C.MEMORY], end[cls == C.MEMORY])
            span = float(end.max() - ts.min())
            overlap = iv.length(iv.intersect(comm, compute))
            comm_len = iv.length(comm)
            ar, bar = self.allreduce[sel], self.barrier[sel]
            ag, rs = self.allgather[sel], self.reduce_scatter[sel]
            comm_excl_barrier = iv.union(ts[(cls == C.COMM) & ~bar], end[(cls == C.COMM) & ~bar])
            row.update(_barrier_columns(iv.union(ts[bar], end[bar]), comm_excl_barrier, compute))
            kernel_time = float((end - ts)[self.is_kernel[sel]].sum())
            row.update(
                span_ms=span / US_PER_MS, busy_ms=iv.length(busy) / US_PER_MS,
                compute_ms=iv.length(compute) / US_PER_MS, comm_ms=comm_len / US_PER_MS,
                memory_ms=iv.length(memory) / US_PER_MS, idle_ms=(span - iv.length(busy)) / US_PER_MS,
                overlap_ms=overlap / US_PER_MS, overlap_pct=_pct(overlap, comm_len),
                exposed_comm_ms=(comm_len - overlap) / US_PER_MS,
                allreduce_ms=iv.length(iv.union(ts[ar], end[ar])) / US_PER_MS,
                allreduce_share_of_kernel_pct=_pct(float((end - ts)[ar].sum()), kernel_time),
                allgather_ms=iv.length(iv.union(ts[ag], end[ag])) / US_PER_MS,
                reduce_scatter_ms=iv.length(iv.union(ts[rs], end[rs])) / US_PER_MS,
            )
            row["comm_bytes"], row["comm_busbw_gbps"] = window_bytes_busbw(
                self.colls, w.lo, w.hi, row["comm_ms"])
        row.update(self._utilisation(w))
        return row

    def _utilisation(self, w: Window) -> dict:
        """gpu_util, sm_efficiency, achieved_occupancy and cpu_exec over the host window, by time."""
        length = w.hi - w.lo
        if length <= 0:
            return {}
        out = {"cpu_exec_pct": _pct(iv.length(iv.clip(
            iv.subtract(self.host["ops"], self.host["above"]), w.lo, w.hi)), length)}
        k = self.is_kernel
        if not k.any():
            return out
        s, e = np.maximum(self.ts[k], w.lo), np.minimum(self.end[k], w.hi)
        inside = e > s
        if not inside.any():
            return out
        s, e = s[inside], e[inside]
        out["gpu_util_pct"] = _pct(iv.length(iv.union(s, e)), length)
        bps = self.blocks_per_sm[k][inside]
        ok = bps > 0  # the plugin skips non-positive values (a known Kineto glitch)
        if ok.any():
            out["sm_efficiency_pct"] = _pct(iv.weighted_time(s[ok], e[ok], bps[ok], cap=1.0), length)
        occ = self.occupancy[k][inside]
        ok = occ >= 0
        if ok.any():
            out["achieved_occupancy_pct"] = float((occ[ok] * (e[ok] - s[ok])).sum() / (e[ok] - s[ok]).sum())
        return out

