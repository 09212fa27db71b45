"""Kernel classes (GEMM, attention, elementwise, NCCL, memcpy, …): the one name → class table, and each
trace file's time per class (kernel_classes.csv; definitions: docs/analysis.md, "kernel_classes.csv").

A GPU event's class is the first row of CLASSES whose pattern finds its name (re.search, ignoring case);
memory and communication come first and are HTA's own classes (classify.gpu_class), so that this table
never contradicts trace_summary's memory and communication columns. A CPU (gloo) trace has no kernels:
its main thread's operators are classed by the same table on their aten names, each counted by its
self time, and gloo's collectives (on its worker thread) by their duration.

The patterns come from the kernel names in the public A100/V100 traces (tests/data/traces/hta/) and the
operator names in the suite's CPU traces, plus the library prefixes named beside each row (cuBLAS's
`<arch>_sgemm_*` / `sm90_xmma_*` / `nvjet_*`, CUTLASS's `cutlass_*`, cuDNN's convolution kernels,
FlashAttention's `flash_*`, PyTorch's `at::native::*` kernels).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from bench.analyze import classify as C
from bench.analyze import intervals as iv
from bench.analyze.steps import Window, main_thread
from bench.analyze.trace import Trace

MEMORY, ALLREDUCE, COLLECTIVE, OTHER = "memcpy/memset", "all-reduce", "other collectives", "other"

# (class, pattern). Order matters: convolution before GEMM (cuDNN's implicit_convolve_sgemm), attention
# before reduction (softmax inside a fused attention kernel), optimizer before elementwise (multi-tensor
# Adam is elementwise work the user knows as the optimizer).
_TABLE = (
    # FlashAttention (flash_fwd/bwd), xformers/cutlass fmha, PyTorch's SDPA kernels and aten ops
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product"),
    # cuDNN (implicit_convolve_sgemm, winograd, *_fprop/dgrad/wgrad), aten::convolution / mkldnn on CPU
    ("convolution", r"conv|winograd|implicit_gemm|fprop|dgrad|wgrad"),
    # cuBLAS (ampere_/volta_sgemm_*, sm90_xmma_gemm_*, nvjet_* on Hopper, its splitKreduce and cublasLt
    # epilogue kernels, gemv*/gemmk1), CUTLASS; aten's matrix products on CPU. Not fbgemm_gpu::*: FBGEMM is
    # a library name, its kernels there are permutes and embedding lookups.
    ("GEMM", r"(?<!fb)gemm|gemv|cutlass|cublas|xmma|nvjet|splitKreduce|epilogue::impl|"
             r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|dot|_addmm_activation)$"),
    ("normalization", r"(layer|batch|group|rms|instance)_?norm|GammaBeta|bn_(fw|bw)|welford"),
    # fbgemm's split embedding kernels (the traces' recommendation model), aten embedding / index_select
    ("embedding", r"embedding|index_select|indexSelect"),
    ("optimizer", r"multi_tensor_apply|adam|_foreach_|fused_sgd"),
    ("reduction", r"reduce|softmax|cross_entropy|nll_loss|^aten::(sum|mean|max|min|norm|argmax|amax)$"),
    # at::native::{vectorized,unrolled,}_elementwise_kernel, Triton pointwise, copies and fills; aten's
    # pointwise ops on CPU
    ("elementwise", r"elementwise|pointwise|triton_poi|CatArrayBatchedCopy|direct_copy|fill|"
                    r"^aten::(add|sub|mul|div|relu|gelu|silu|sigmoid|tanh|threshold_backward|sqrt|rsqrt|exp|"
                    r"log|neg|pow|lerp|addcmul|addcdiv|copy|clone|to|_to_copy|cat|stack|where|clamp|"
                    r"dropout|zero|ones_like|zeros_like|fill)_?$"),
)
CLASSES: tuple[tuple[str, re.Pattern], ...] = tuple((n, re.compile(p, re.IGNORECASE)) for n, p in _TABLE)


@functools.lru_cache(maxsize=1 << 16)
def class_of(name: str) -> str:
    """The first class of CLASSES whose pattern finds `name`, else "other" (cached: a trace repeats a few
    thousand names over millions of events)."""
    for cls, pattern in CLASSES:
        if pattern.search(name):
            return cls
    return OTHER


def gpu_kernel_class(name: str, cat: str) -> str:
    """A GPU event's class: HTA's memory and communication first (all-reduce apart), then CLASSES; the
    sync records and Memcpy/Sync-named kernels HTA calls OTHER stay "other"."""
    kind = C.gpu_class(name, cat)
    if kind == C.MEMORY:
        return MEMORY
    if kind == C.COMM:
        return ALLREDUCE if C.ALLREDUCE_KERNEL.search(name) else COLLECTIVE
    return OTHER if kind == C.OTHER else class_of(name)


def _sum_by_class(classes: list[str], times: np.ndarray) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for cls, t in zip(classes, times):
        n, total = out.get(cls, (0, 0.0))
        out[cls] = (n + 1, total + float(t))
    return out


def gpu_class_times(trace: Trace, rows: np.ndarray, selected: np.ndarray) -> dict[str, tuple[int, float]]:
    """class → (events, Σ duration µs) of the GPU events `rows[selected]` (a window's events, launch rule)."""
    rows = rows[selected]
    cache: dict[tuple[int, int], str] = {}
    classes = []
    for n, c in zip(trace.name_id[rows], trace.cat_id[rows]):
        if (n, c) not in cache:
            cache[(n, c)] = gpu_kernel_class(trace.names[n], trace.cats[c])
        classes.append(cache[(n, c)])
    return _sum_by_class(classes, trace.dur[rows])


def self_times(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each interval's length minus its direct children's (intervals nested in it), as the profiler's
    self CPU time; the intervals are one thread's operators, which nest."""
    order = np.lexsort((-end, ts))  # by start, the outer one first when two start together
    out = (end - ts).astype(float)
    stack: list[int] = []
    for i in order:
        while stack and ts[i] >= end[stack[-1]]:
            stack.pop()
        if stack:
            out[stack[-1]] -= min(end[i], end[stack[-1]]) - ts[i]
        stack.append(i)
    return out


def cpu_class_times(trace: Trace, w: Window) -> dict[str, tuple[int, float]]:
    """class → (events, µs) on a CPU trace in window w (events starting in [lo, hi)): the main thread's
    operators by self time, c10d's host side as "other collectives", gloo's collectives by duration."""
    ops = C.cat_mask(trace, C.HOST_OP_CATS) & ~C.name_mask(trace, C.PROFILER_STEP)
    ops &= trace.tid_id == main_thread(trace)
    coll = C.name_mask(trace, C.HOST_COLLECTIVE) & ~C.cat_mask(trace, C.HOST_OP_CATS)
    inside = (trace.ts >= w.lo) & (trace.ts < w.hi)
    rows = np.flatnonzero(ops)
    own = self_times(trace.ts[rows], trace.end[rows])
    keep = inside[rows]
    rows, own = rows[keep], own[keep]
    names = [trace.names[n] for n in trace.name_id[rows]]
    classes = [COLLECTIVE if C.COLLECTIVE_HOST_OP.search(n) else class_of(n) for n in names]
    out = _sum_by_class(classes, own)
    crow = np.flatnonzero(coll & inside)
    cnames = [trace.names[n] for n in trace.name_id[crow]]
    ccls = [ALLREDUCE if C.HOST_ALLREDUCE.search(x) else COLLECTIVE for x in cnames]
    for cls, (n, t) in _sum_by_class(ccls, trace.dur[crow]).items():
        n0, t0 = out.get(cls, (0, 0.0))
        out[cls] = (n0 + n, t0 + t)
    return out


# ---- interference: the same kernels with and without communication running beside them ---------------------
# A compute kernel (a CPU operator on a gloo trace) is *overlapped* when communication covers at least half
# of it, *alone* when none does; partly covered ones are neither. Per name, the alone instances' median
# duration is what an overlapped instance would have taken without communication beside it: NCCL's kernels
# take SMs and memory bandwidth (gloo's threads take cores) from it. bench project turns the difference into
# its interference factor (docs/design.md "Projection").
OVERLAPPED_COVER = 0.5


def _overlap_by_class(names: list[str], classes: list[str], dur: np.ndarray, cover: np.ndarray,
                      span: np.ndarray) -> dict[str, tuple[int, float, float]]:
    """class → (overlapped events with an alone twin, their Σ µs, Σ µs of their names' alone medians)."""
    alone: dict[str, list[float]] = {}
    for name, d, c in zip(names, dur, cover):
        if c <= 0:
            alone.setdefault(name, []).append(float(d))
    median = {name: float(np.median(v)) for name, v in alone.items()}
    out: dict[str, tuple[int, float, float]] = {}
    for name, cls, d, c, s in zip(names, classes, dur, cover, span):
        if s > 0 and c >= OVERLAPPED_COVER * s and name in median:
            n, t, a = out.get(cls, (0, 0.0, 0.0))
            out[cls] = (n + 1, t + float(d), a + median[name])
    return out


def gpu_overlap_times(trace: Trace, view, selected: np.ndarray) -> dict[str, tuple[int, float, float]]:
    """_overlap_by_class for the compute kernels among a GpuView's events `selected`, against the union
    of the communication kernels among them."""
    comm = selected & (view.cls == C.COMM)
    comm_set = iv.union(view.bts[comm], view.bend[comm])
    compute = np.flatnonzero(selected & (view.cls == C.COMPUTE) & view.is_kernel)
    ts, end = view.bts[compute], view.bend[compute]
    names = [trace.names[n] for n in trace.name_id[view.rows[compute]]]
    classes = [class_of(n) for n in names]
    return _overlap_by_class(names, classes, end - ts, iv.covered(comm_set, ts, end), end - ts)


def cpu_overlap_times(trace: Trace, w: Window) -> dict[str, tuple[int, float, float]]:
    """_overlap_by_class for the main thread's compute operators (by self time) in window w, against the
    union of gloo's collectives other than barriers."""
    ops = C.cat_mask(trace, C.HOST_OP_CATS) & ~C.name_mask(trace, C.PROFILER_STEP)
    ops &= trace.tid_id == main_thread(trace)
    coll = (C.name_mask(trace, C.HOST_COLLECTIVE) & ~C.cat_mask(trace, C.HOST_OP_CATS)
            & ~C.name_mask(trace, C.HOST_BARRIER))
    comm_set = iv.union(trace.ts[coll], trace.end[coll])
    rows = np.flatnonzero(ops)
    own = self_times(trace.ts[rows], trace.end[rows])
    inside = (trace.ts[rows] >= w.lo) & (trace.ts[rows] < w.hi)
    rows, own = rows[inside], own[inside]
    names = [trace.names[n] for n in trace.name_id[rows]]
    keep = [not C.COLLECTIVE_HOST_OP.search(n) for n in names]
    rows, own = rows[np.array(keep, dtype=bool)], own[np.array(keep, dtype=bool)]
    names = [n for n, k in zip(names, keep) if k]
    ts, end = trace.ts[rows], trace.end[rows]
    return _overlap_by_class(names, [class_of(n) for n in names], own, iv.covered(comm_set, ts, end),
                             end - ts)
