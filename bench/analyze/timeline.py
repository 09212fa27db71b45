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
from bench.analyze.load import Trace
from bench.analyze.steps import Window

US_PER_MS = 1e3


def _backward(trace: Trace, labels: np.ndarray, autograd: np.ndarray,
              w: Window) -> tuple[float, float] | None:
    """(start, end) µs of the step's last `backward` label, else of its autograd operators; None if none."""
    inside = (trace.ts >= w.lo) & (trace.ts <= w.hi)
    hits = np.flatnonzero(labels & inside)
    if len(hits):
        last = hits[np.argmax(trace.ts[hits])]
        return float(trace.ts[last]), float(trace.end[last])
    hits = np.flatnonzero(autograd & inside)
    if len(hits):
        return float(trace.ts[hits].min()), float(trace.end[hits].max())
    return None


def bucket_rows(trace: Trace, windows: list[Window], device: str) -> list[dict]:
    """bucket_timeline rows (without cell_id, trace_file, rank, engine) for every window."""
    tid = np.array([str(t) for t in trace.tid], dtype=object)
    annotations = trace.cat == C.ANNOTATION_CAT
    ops = C.is_in(trace.cat, C.HOST_OP_CATS)
    labels = annotations & (trace.name == C.BACKWARD_LABEL)
    autograd = ops & np.fromiter((isinstance(n, str) and n.startswith(C.AUTOGRAD_BACKWARD_OP)
                                  for n in trace.name), dtype=bool, count=len(trace))
    engine_issues = annotations & C.matches(trace.name, C.DDP_CORE_ALLREDUCE, annotations)
    torch_issues = ops & C.matches(trace.name, C.ALLREDUCE_ISSUE_OP, ops)
    args_rows = np.array(sorted(trace.comm_args), dtype=np.int64)
    execution = _GpuExecution(trace, tid) if device != "cpu" else _GlooExecution(trace)
    rows = []
    for w in windows:
        bwd = _backward(trace, labels, autograd, w)
        if bwd is None:
            continue
        in_bwd = (trace.ts >= bwd[0]) & (trace.ts <= bwd[1])
        issues = np.flatnonzero(engine_issues & in_bwd)
        if not len(issues):
            issues = np.flatnonzero(torch_issues & in_bwd)
        issues = issues[np.argsort(trace.ts[issues], kind="stable")]
        for k, i in enumerate(issues):
            start, end = execution.of(i)
            nbytes = _issue_bytes(trace, tid, args_rows, i)
            if nbytes is None:
                nbytes = execution.bytes_of(i)
            rel = lambda t, t0=bwd[0]: (t - t0) / US_PER_MS if t is not None else None
            rows.append({"step": w.step, "bucket": k, "bytes": nbytes, "ready_ms": rel(float(trace.ts[i])),
                         "comm_start_ms": rel(start), "comm_end_ms": rel(end),
                         "backward_ms": (bwd[1] - bwd[0]) / US_PER_MS})
    return rows


def _issue_bytes(trace: Trace, tid: np.ndarray, args_rows: np.ndarray, i: int) -> float | None:
    """Bytes from a size-carrying event nested in the issue on its thread (record_param_comms, nccl:*)."""
    if not len(args_rows):
        return None
    nested = args_rows[(trace.ts[args_rows] >= trace.ts[i]) & (trace.ts[args_rows] <= trace.end[i])
                       & (tid[args_rows] == tid[i])]
    for r in nested:
        nbytes = row_bytes(trace, int(r))
        if nbytes is not None:
            return nbytes
    return None


class _GpuExecution:
    """Collective kernels launched by runtime calls nested in an issue on the same thread."""

    def __init__(self, trace: Trace, tid: np.ndarray):
        self.trace, self.tid = trace, tid
        self.runtime = np.flatnonzero(C.is_in(trace.cat, C.RUNTIME_CATS) & ~np.isnan(trace.correlation))
        gpu = np.flatnonzero(C.is_in(trace.cat, C.GPU_CATS) & ~np.isnan(trace.correlation))
        comm = np.array([C.gpu_class(trace.name[g], trace.cat[g]) == C.COMM for g in gpu], dtype=bool)
        self.by_corr: dict[float, list[int]] = {}
        for g in gpu[comm] if len(gpu) else []:
            self.by_corr.setdefault(float(trace.correlation[g]), []).append(int(g))

    def of(self, i: int) -> tuple[float | None, float | None]:
        t = self.trace
        rt = self.runtime[(t.ts[self.runtime] >= t.ts[i]) & (t.ts[self.runtime] <= t.end[i])
                          & (self.tid[self.runtime] == self.tid[i])]
        kernels = [g for r in rt for g in self.by_corr.get(float(t.correlation[r]), [])]
        if not kernels:
            return None, None
        return float(t.ts[kernels].min()), float(t.end[kernels].max())

    def bytes_of(self, i: int) -> float | None:
        return None


class _GlooExecution:
    """gloo's all-reduce events on its worker threads, handed out first-in first-out."""

    def __init__(self, trace: Trace):
        self.trace = trace
        annotations = trace.cat == C.ANNOTATION_CAT
        rows = np.flatnonzero(annotations & C.matches(trace.name, C.HOST_ALLREDUCE, annotations))
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
