"""The steady state of a cell's steps: where its warm-up ends, found by a changepoint test on the step times
rather than assumed from `run.warmup_steps`, and which steps are outliers (Tukey's fences), counted and
shown, never dropped.

Used by the worker (bench/worker/warmup.py) on every group's step times, and by the launcher when it merges a
cell's launches (bench/run/merge.py). Pure numpy; deterministic (the permutation test is seeded).

**Warm-up** (`warmup_end`): the test asks whether the series starts with a stretch of slower steps. For every
split t of the first half (1 ≤ t ≤ n/2) the rank-sum of the first t steps is standardised,
Z_t = (2·Σ_{i≤t} r_i − t(n+1)) / √(t(n−t)(n+1)/3) (the Mann–Whitney statistic of the prefix against the
rest, exact mean and variance under "no change"; Pettitt 1979 uses the same U_t unstandardised), and the
largest Z_t is the maximally selected rank statistic (Lausen & Schumacher 1992). Its null distribution is
that of the same maximum over random orders of the same steps: a seeded permutation test,
p = (1 + #{perm ≥ observed}) / (1 + WARMUP_PERMUTATIONS). Standardising each split (Pettitt's
unstandardised maximum sits near the middle) gives the test its power at short prefixes, which is where
warm-up is. One-sided and limited to the first half: a faster start, or a change late in the series, is the
machine changing, not warm-up, and stays in the measurement.
When p ≤ WARMUP_ALPHA the warm-up ends where a two-segment fit by least absolute deviations puts the break
(each segment about its own median; over the same splits, the prefix slower): a rank statistic's argmax
overshoots when the first steady steps happen to rank high (5 slow steps then 30 steady ones, synthetic:
located at 6-16 in 35 % of draws by the argmax of Z_t, at 5 by the fit).

**Outliers** (`tukey_outliers`): steps below Q1 − 1.5·IQR or above Q3 + 1.5·IQR (Tukey 1977, *Exploratory
Data Analysis*: "outside" values; quartiles by numpy's linear interpolation). Counted per cell, kept in
every statistic: the median and its order-statistic interval are robust to them, and a cell whose steps
stall now and then should say so rather than look quiet.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WARMUP_ALPHA = 0.05
# 999 permutations: the p-value's resolution is 0.001, and its Monte-Carlo error at p = 0.05 is
# √(0.05·0.95/999) ≈ 0.007 (Davison & Hinkley 1997, ch. 4: 999 is the usual count for a 5 % test).
WARMUP_PERMUTATIONS = 999
WARMUP_SEED = 20261126  # fixed: the same steps give the same warm-up
TUKEY_K = 1.5  # Tukey's inner fences: 1.5 interquartile ranges beyond the quartiles


def _max_prefix_z(ranks: np.ndarray, last: int) -> np.ndarray:
    """For each row of `ranks` (permutations × n), the largest standardised prefix rank-sum Z_t over the
    splits t = 1..last."""
    n = ranks.shape[-1]
    t = np.arange(1, last + 1, dtype=np.float64)
    u = 2 * np.cumsum(ranks[..., :last], axis=-1) - t * (n + 1)
    return (u / np.sqrt(t * (n - t) * (n + 1) / 3)).max(axis=-1)


def warmup_end(steps: Sequence[float]) -> tuple[int, float | None]:
    """(t, p): the steps from the first that a one-sided changepoint test finds slower than the rest, and
    the test's p-value; t = 0 when it finds none (p > WARMUP_ALPHA), and (0, None) with fewer than 4 steps
    (no split of the first half leaves a rest to compare with). See the module docstring."""
    x = np.asarray(steps, dtype=np.float64)
    n = len(x)
    if n < 4:
        return 0, None
    ranks = x.argsort(kind="stable").argsort(kind="stable") + 1.0  # ties: arbitrary but fixed order
    last = n // 2
    observed = _max_prefix_z(ranks[None, :], last)
    rng = np.random.default_rng(WARMUP_SEED)
    perms = rng.permuted(np.tile(ranks, (WARMUP_PERMUTATIONS, 1)), axis=1)
    null = _max_prefix_z(perms, last)
    p = (1 + int((null >= observed[0] - 1e-12).sum())) / (1 + WARMUP_PERMUTATIONS)
    return (_l1_break(x, last) if p <= WARMUP_ALPHA else 0), p


def _l1_break(x: np.ndarray, last: int) -> int:
    """The split t (1..last) of the best two-segment fit by least absolute deviations about each segment's
    median, among those whose first segment is the slower; the test has found one."""
    best, where = np.inf, 0
    for t in range(1, last + 1):
        head, rest = x[:t], x[t:]
        mh, mr = np.median(head), np.median(rest)
        cost = np.abs(head - mh).sum() + np.abs(rest - mr).sum()
        if mh > mr and cost < best:
            best, where = cost, t
    return where


def tukey_fences(samples: Sequence[float]) -> tuple[float, float] | None:
    """(low, high) = (Q1 − 1.5·IQR, Q3 + 1.5·IQR) of the samples; None with fewer than 4."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) < 4:
        return None
    q1, q3 = np.percentile(x, [25, 75])
    return float(q1 - TUKEY_K * (q3 - q1)), float(q3 + TUKEY_K * (q3 - q1))


def tukey_outliers(samples: Sequence[float]) -> int | None:
    """How many samples lie outside Tukey's fences (`tukey_fences`); None with fewer than 4 samples."""
    fences = tukey_fences(samples)
    if fences is None:
        return None
    x = np.asarray(samples, dtype=np.float64)
    return int(((x < fences[0]) | (x > fences[1])).sum())
