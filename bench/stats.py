"""Uncertainty for every compared number: bootstrap intervals, paired ratios and the verdict rule.

Used by the worker (to fill a row's intervals) and by the report and compare (to word findings). Pure
Python + numpy; the resampling is seeded, so the same samples always give the same interval.

The bootstrap is the **percentile bootstrap** (Efron 1979; Efron & Tibshirani 1993, ch. 13): resample the
observations with replacement B times, compute the statistic on each resample, and take the 2.5th and
97.5th percentiles of those B values as the 95 % interval. Steps are resampled as independent units;
rounds (one step of each engine, side by side) are resampled as units for paired ratios, which keeps the
pairing that cancels noise lasting a round.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20241122  # fixed: an interval is a function of its samples
VERDICTS = ("faster", "slower", "within noise")
# A cell whose 95 % interval of the median step time is wider than ±this (half-width over the median)
# is flagged `unstable` by the report: its numbers are shown but not trusted for comparisons.
UNSTABLE_HALF_WIDTH_PCT = 10.0


def _clean(samples: Sequence[float | None]) -> np.ndarray:
    values = np.asarray([s for s in samples if s is not None and math.isfinite(s)], dtype=np.float64)
    return values


def _percentile_interval(stats: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


def median_ci(samples: Sequence[float]) -> tuple[float | None, float | None]:
    """95 % percentile-bootstrap interval of the median of `samples`; (None, None) with fewer than 2."""
    values = _clean(samples)
    if len(values) < 2:
        return None, None
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))
    return _percentile_interval(np.median(values[picks], axis=1))


def median_difference_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, float | None]:
    """95 % interval of median(a) − median(b), resampling a and b independently (unpaired samples, e.g.
    the synced and the compute-only windows of one cell)."""
    va, vb = _clean(a), _clean(b)
    if len(va) < 2 or len(vb) < 2:
        return None, None
    rng = np.random.default_rng(SEED)
    ma = np.median(va[rng.integers(0, len(va), size=(BOOTSTRAP_RESAMPLES, len(va)))], axis=1)
    mb = np.median(vb[rng.integers(0, len(vb), size=(BOOTSTRAP_RESAMPLES, len(vb)))], axis=1)
    return _percentile_interval(ma - mb)


def round_order(r: int, k: int) -> list[int]:
    """The order in which k interleaved engines step in round r: engine r mod k first, then upward (even
    rounds) or downward (odd rounds), wrapping around.

    Every engine goes first equally often, which spreads the slow moments of the machine over all of
    them; walking the other way every other round keeps an engine from always stepping right after the
    same one (a predecessor that leaves caches or the allocator in a particular state would otherwise bias
    one engine's samples the same way every round).
    """
    step = 1 if r % 2 == 0 else -1
    return [(r + step * j) % k for j in range(k)]


def paired_ratio(baseline: Sequence[float], other: Sequence[float]) -> tuple[float | None, float | None,
                                                                                 float | None]:
    """(median, low, high) over rounds of baseline_i / other_i, with its 95 % interval from resampling
    rounds. > 1 means `other` is faster than `baseline`. Samples are paired by index (round)."""
    pairs = [(b, o) for b, o in zip(baseline, other) if b and o and math.isfinite(b) and math.isfinite(o)]
    if len(pairs) < 2:
        return None, None, None
    ratios = np.asarray([b / o for b, o in pairs], dtype=np.float64)
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, len(ratios), size=(BOOTSTRAP_RESAMPLES, len(ratios)))
    lo, hi = _percentile_interval(np.median(ratios[picks], axis=1))
    return float(np.median(ratios)), lo, hi


def verdict(low: float | None, high: float | None, neutral: float = 1.0) -> str | None:
    """`faster` only when the whole interval is above `neutral`, `slower` only when it is below, else
    `within noise`; None when there is no interval."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return None
    if low > neutral:
        return "faster"
    if high < neutral:
        return "slower"
    return "within noise"


def rank_skew(per_rank_ms: Sequence[Sequence[float]]) -> tuple[float | None, int | None]:
    """(p50 over steps of slowest − fastest rank, the rank most often slowest) from per-rank step times
    (one list per rank, aligned by step). (None, None) for a single rank."""
    if len(per_rank_ms) < 2 or not per_rank_ms[0]:
        return None, None
    steps = np.asarray(per_rank_ms, dtype=np.float64)  # ranks × steps
    skew = steps.max(axis=0) - steps.min(axis=0)
    slowest = Counter(int(r) for r in steps.argmax(axis=0)).most_common(1)[0][0]
    return float(np.median(skew)), slowest


def half_width_pct(center: float | None, low: float | None, high: float | None) -> float | None:
    """Half the interval's width as a percentage of its centre (None when any is missing or centre 0)."""
    if center is None or low is None or high is None or not center:
        return None
    return (high - low) / 2 / abs(center) * 100
