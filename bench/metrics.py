"""The metrics of docs/design.md "Metrics", defined once, one small function each.

The runner computes row values with these; the report computes speedup and efficiency with these.
Every function returns None (an empty cell) when an input it needs was not measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _missing(*values) -> bool:
    return any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values)


def step_times_over_ranks(per_rank_ms: Sequence[Sequence[float]]) -> list[float]:
    """Per step, the maximum over ranks: a step is as slow as its slowest rank."""
    return [max(step) for step in zip(*per_rank_ms)]


def percentile(samples: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation (numpy's default); None for no samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def throughput(items_per_step: float | None, step_time_ms: float | None) -> float | None:
    """Items (samples or tokens) per second for one optimizer step of `step_time_ms`."""
    if _missing(items_per_step, step_time_ms) or step_time_ms <= 0:
        return None
    return items_per_step / (step_time_ms / 1e3)


def strong_scaling_efficiency(t1_ms: float | None, tn_ms: float | None, n: int) -> float | None:
    """T1 / (N · T_N) at a fixed global batch."""
    if _missing(t1_ms, tn_ms) or tn_ms <= 0:
        return None
    return t1_ms / (n * tn_ms)


def weak_scaling_efficiency(t1_ms: float | None, tn_ms: float | None) -> float | None:
    """T1 / T_N at a fixed per-rank batch."""
    if _missing(t1_ms, tn_ms) or tn_ms <= 0:
        return None
    return t1_ms / tn_ms


def exposed_comm_ms(step_ms: float | None, compute_only_ms: float | None) -> float | None:
    """Step time minus the compute-only step time of the same cell (gradients not synchronised)."""
    if _missing(step_ms, compute_only_ms):
        return None
    return step_ms - compute_only_ms


def algbw_gbps(size_bytes: float | None, time_s: float | None) -> float | None:
    """nccl-tests algorithm bandwidth: S / t, in GB/s (1e9 bytes)."""
    if _missing(size_bytes, time_s) or time_s <= 0:
        return None
    return size_bytes / time_s / 1e9


def busbw_gbps(algbw: float | None, n: int) -> float | None:
    """nccl-tests all-reduce bus bandwidth: algbw · 2(n−1)/n; 0 at n = 1, where nothing crosses a link
    (and algbw, with no link to measure, is empty)."""
    if n == 1:
        return 0.0
    if _missing(algbw):
        return None
    return algbw * 2 * (n - 1) / n


def mfu(model_flops_per_s: float | None, peak_flops_per_s: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOPs per second over the device's peak (all ranks' peak)."""
    if _missing(model_flops_per_s, peak_flops_per_s) or peak_flops_per_s <= 0:
        return None
    return model_flops_per_s / peak_flops_per_s
