"""Interval sets in numpy: a set is a sorted (n, 2) float array of disjoint [start, end) intervals.

Everything the breakdown needs is a union, an intersection, a difference or a clip of such sets, and their
total length; each is O(n log n) in numpy, with no Python loop over events.
"""

from __future__ import annotations

import numpy as np

EMPTY = np.empty((0, 2), dtype=np.float64)


def union(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The union of intervals [starts[i], ends[i]) as a disjoint sorted set (zero-length ones dropped)."""
    keep = ends > starts
    if not keep.any():
        return EMPTY
    s, e = starts[keep], ends[keep]
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new group starts where an interval begins after everything before it has ended.
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return np.column_stack([s[first], reach[last]])


def merge(*sets: np.ndarray) -> np.ndarray:
    """Union of several interval sets."""
    both = np.concatenate([x for x in sets if len(x)] or [EMPTY])
    return union(both[:, 0], both[:, 1])


def length(a: np.ndarray) -> float:
    """Total length of a disjoint set."""
    return float((a[:, 1] - a[:, 0]).sum()) if len(a) else 0.0


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a ∩ b for two disjoint sorted sets."""
    if not len(a) or not len(b):
        return EMPTY
    # Sweep: +1 at each start and -1 at each end of either set; the pieces where the depth is 2 are in both.
    points = np.concatenate([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    steps = np.concatenate([np.ones(len(a)), -np.ones(len(a)), np.ones(len(b)), -np.ones(len(b))])
    order = np.lexsort((steps, points))  # at equal times ends (-1) first: touching intervals do not overlap
    points, depth = points[order], np.cumsum(steps[order])
    inside = depth[:-1] == 2
    out = np.column_stack([points[:-1][inside], points[1:][inside]])
    return out[out[:, 1] > out[:, 0]]


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a − b for two disjoint sorted sets."""
    if not len(a) or not len(b):
        return a
    points = np.concatenate([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    # depth counts a (+1/-1) and b (+2/-2): depth 1 means inside a and outside b.
    steps = np.concatenate([np.ones(len(a)), -np.ones(len(a)), 2 * np.ones(len(b)), -2 * np.ones(len(b))])
    order = np.lexsort((steps, points))
    points, depth = points[order], np.cumsum(steps[order])
    inside = depth[:-1] == 1
    out = np.column_stack([points[:-1][inside], points[1:][inside]])
    return union(out[:, 0], out[:, 1]) if len(out) else EMPTY


def clip(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """a ∩ [lo, hi)."""
    if not len(a):
        return EMPTY
    out = np.column_stack([np.maximum(a[:, 0], lo), np.minimum(a[:, 1], hi)])
    return out[out[:, 1] > out[:, 0]]


def weighted_time(starts: np.ndarray, ends: np.ndarray, values: np.ndarray, cap: float | None) -> float:
    """∫ min(Σ values of the intervals active at t, cap) dt — TensorBoard's SM-efficiency integral."""
    keep = ends > starts
    if not keep.any():
        return 0.0
    s, e, v = starts[keep], ends[keep], values[keep]
    points = np.concatenate([s, e])
    deltas = np.concatenate([v, -v])
    order = np.argsort(points, kind="stable")
    points, level = points[order], np.cumsum(deltas[order])
    level = np.maximum(level[:-1], 0.0)
    if cap is not None:
        level = np.minimum(level, cap)
    return float((level * np.diff(points)).sum())


def covered(a: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per interval [starts[i], ends[i]): how much of it the disjoint sorted set `a` covers. With C(t) the
    length of `a` before t (piecewise linear, from the cumulative lengths), the cover is C(end) − C(start)."""
    if not len(a):
        return np.zeros(len(starts))
    before = np.concatenate([[0.0], np.cumsum(a[:, 1] - a[:, 0])])  # length of a[:k], k = 0..len(a)

    def upto(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(a[:, 0], t, side="right")  # intervals starting at or before t
        prev = np.maximum(k - 1, 0)
        inside = np.clip(t - a[prev, 0], 0.0, a[prev, 1] - a[prev, 0])
        return np.where(k > 0, before[prev] + inside, 0.0)

    return upto(np.asarray(ends, float)) - upto(np.asarray(starts, float))
