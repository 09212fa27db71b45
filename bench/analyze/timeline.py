"""The bucket timeline: per profiled step, each gradient all-reduce's ready time, execution and bytes.

Times are ms from the start of the step's last backward (the synchronised micro-step): the bench worker's
`backward` label; for a foreign trace without it, the autograd engine's first backward operator of the step
(and the backward then ends with its last one). Issues are the engines' labels (`ddp_core.allreduce.*`)
when present, else c10d's all-reduce ops (torch DDP's reducer), in issue order: that order is `bucket`.
Execution: on GPU the collective kernels launched from inside the issue (matched by correlation id); on
CPU gloo's `*:all_reduce` events on its worker threads, matched first-in first-out (gloo runs its queue in
order), each to the first one that starts after the issue.
"""

from __future__ import annotations

import numpy as np

from bench.analyze import classify as C
from bench.analyze.comms import row_bytes
from bench.analyze.steps import Window
from bench.analyze.trace import Trace

US_PER_MS = 1e3


def _backward(trace: Trace, labels: np.ndarray, autograd: np.ndarray,
              w: Window) -> tuple[float, float] | None:
    """(start, end) µs of the step's last `backward` label, else of its autograd operators; None if none."""
    for rows in (labels, autograd):
        inside = rows[(trace.ts[rows] >= w.lo) & (trace.ts[rows] <= w.hi)]
        if len(inside) and rows is labels:
            last = inside[np.argmax(trace.ts[inside])]
            return float(trace.ts[last]), float(trace.end[last])
        if len(inside):
            return float(trace.ts[inside].min()), float(trace.end[inside].max())
    return None


def bucket_rows(trace: Trace, windows: list[Window], device: str) -> list[dict]:
    """bucket_timeline rows (without cell_id, trace_file, rank, engine) for every window."""
    annotations = C.cat_mask(trace, frozenset({C.ANNOTATION_CAT}))
    ops = C.cat_mask(trace, C.HOST_OP_CATS)
    labels = np.flatnonzero(annotations & C.name_mask(trace, C.BACKWARD_LABEL))
    autograd = np.flatnonzero(ops & C.name_mask(trace, C.AUTOGRAD_BACKWARD_OP))
    engine_issues = np.flatnonzero(annotations & C.name_mask(trace, C.DDP_CORE_ALLREDUCE))
    torch_issues = np.flatnonzero(ops & C.name_mask(trace, C.ALLREDUCE_ISSUE_OP))
    sized = _Nested(trace, np.array(sorted(trace.comm_args), dtype=np.int64))
    execution = _GpuExecution(trace) if device != "cpu" else _GlooExecution(trace)
    rows = []
    for w in windows:
        bwd = _backward(trace, labels, autograd, w)
        if bwd is None:
            continue
        issues = np.array([], dtype=np.int64)
        for candidates in (engine_issues, torch_issues):  # the engines' labels, else c10d's ops
            issues = candidates[(trace.ts[candidates] >= bwd[0]) & (trace.ts[candidates] <= bwd[1])]
            if len(issues):
                break
        issues = issues[np.argsort(trace.ts[issues], kind="stable")]
        rel = lambda t, t0=bwd[0]: (t - t0) / US_PER_MS if t is not None else None
        for k, i in enumerate(issues):
            start, end = execution.of(i)
            nbytes = next((b for r in sized.within(i) if (b := row_bytes(trace, int(r))) is not None), None)
            if nbytes is None:
                nbytes = execution.bytes_of(i)
            rows.append({"step": w.step, "bucket": k, "bytes": nbytes, "ready_ms": rel(float(trace.ts[i])),
                         "comm_start_ms": rel(start), "comm_end_ms": rel(end),
                         "backward_ms": (bwd[1] - bwd[0]) / US_PER_MS})
    return rows


class _Nested:
    """Events among `rows` that start inside a given event, on its thread (binary search on start time)."""

    def __init__(self, trace: Trace, rows: np.ndarray):
        self.trace = trace
        self.rows = rows[np.argsort(trace.ts[rows], kind="stable")]
        self.starts = trace.ts[self.rows]

    def within(self, i: int) -> np.ndarray:
        t = self.trace
        lo = np.searchsorted(self.starts, t.ts[i], side="left")
        hi = np.searchsorted(self.starts, t.end[i], side="right")
        found = self.rows[lo:hi]
        return found[t.tid_id[found] == t.tid_id[i]]


class _GpuExecution:
    """Collective kernels launched by runtime calls nested in an issue on the same thread."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.runtime = _Nested(trace, np.flatnonzero(C.cat_mask(trace, C.RUNTIME_CATS)
                                                     & ~np.isnan(trace.correlation)))
        gpu = np.flatnonzero(C.cat_mask(trace, C.GPU_CATS) & ~np.isnan(trace.correlation))
        comm = gpu[C.gpu_classes(trace, gpu) == C.COMM]
        self.by_corr: dict[float, list[int]] = {}
        for g in comm:
            self.by_corr.setdefault(float(trace.correlation[g]), []).append(int(g))

    def of(self, i: int) -> tuple[float | None, float | None]:
        t = self.trace
        kernels = [g for r in self.runtime.within(i) for g in self.by_corr.get(float(t.correlation[r]), [])]
        if not kernels:
            return None, None
        return float(t.ts[kernels].min()), float(t.end[kernels].max())

    def bytes_of(self, i: int) -> float | None:
        return None


class _GlooExecution:
    """gloo's all-reduce events on its worker threads, handed out first-in first-out."""

    def __init__(self, trace: Trace):
        self.trace = trace
        rows = np.flatnonzero(C.cat_mask(trace, frozenset({C.ANNOTATION_CAT}))
                              & C.name_mask(trace, C.HOST_ALLREDUCE))
        self.rows = rows[np.argsort(trace.ts[rows], kind="stable")]
        self.used = np.zeros(len(self.rows), dtype=bool)
        self.matched: dict[int, int] = {}

    def of(self, i: int) -> tuple[float | None, float | None]:
        t = self.trace
        free = np.flatnonzero(~self.used & (t.ts[self.rows] >= t.ts[i]))
        if not len(free):
            return None, None
        j = free[0]
        self.used[j] = True
        self.matched[i] = int(self.rows[j])
        r = self.rows[j]
        return float(t.ts[r]), float(t.end[r])

    def bytes_of(self, i: int) -> float | None:
        r = self.matched.get(i)
        return row_bytes(self.trace, r) if r is not None else None
