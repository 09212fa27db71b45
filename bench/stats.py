"""Uncertainty for every compared number: intervals of medians, paired ratios, the verdict rule, the
family-wise correction of many verdicts, and the adaptive stopping rule of the timed rounds.

Used by the worker (to fill a row's intervals and to decide when to stop stepping) and by the report and
compare (to word findings). Pure Python + numpy; deterministic: the same samples give the same interval.

A median's interval (a cell's step time; a paired ratio's median over rounds) is the **order-statistic
interval** (distribution-free; Hollander & Wolfe, *Nonparametric Statistical Methods*, ch. 3; the sign
test's dual): [x_(k), x_(n−k+1)] of the sorted samples, with the largest k for which
2·P(Binomial(n, ½) ≤ k−1) ≤ 5 %. Its coverage is at least 95 % for any continuous distribution of
independent samples, at every n ≥ MIN_SAMPLES; below that no 95 % interval exists and none is given. It
replaced the percentile bootstrap, which under-covers at small n: on tests/synthetic_steps.py's A/A pair
it said "faster"/"slower" in 5.6-6.4 % of comparisons at 5-20 rounds (docs/notes.md "Uncertainty").
Steps are the units of a cell's interval; rounds (one step of each engine, side by side) are the units of
a paired ratio, which keeps the pairing that cancels noise lasting a round.

The difference of two unpaired medians (exposed communication) keeps the **percentile bootstrap** (Efron
& Tibshirani 1993, ch. 13): B resamples with replacement, seeded, the 2.5th and 97.5th percentiles.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from functools import cache

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20241122  # fixed: an interval is a function of its samples
VERDICTS = ("faster", "slower", "within noise")
# A cell whose 95 % interval of the median step time is wider than ±this (half-width over the median)
# is flagged `unstable` by the report: its numbers are shown but not trusted for comparisons.
UNSTABLE_HALF_WIDTH_PCT = 10.0
# The fewest samples (steps, or rounds of a pair) with a 95 % interval of their median: with n, the widest
# interval [min, max] misses the median with probability 2 · 2^−n, 6.25 % at 5 and 3.1 % at 6.
MIN_SAMPLES = 6


def _clean(samples: Sequence[float | None]) -> np.ndarray:
    values = np.asarray([s for s in samples if s is not None and math.isfinite(s)], dtype=np.float64)
    return values


def _percentile_interval(stats: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


def _log_binom_half(n: int, k: int) -> float:
    """log P(Binomial(n, ½) = k)."""
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2)


def binom_half_cdf(n: int, k: int) -> float:
    """P(Binomial(n, ½) ≤ k), summed in log space (2^−n underflows a float from n = 1075)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    logs = [_log_binom_half(n, j) for j in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


@cache
def order_statistic_depth(n: int, alpha: float = 1 - CONFIDENCE) -> int | None:
    """The k of the (1 − alpha) order-statistic interval [x_(k), x_(n−k+1)] (1-based) of the median of n
    samples (95 % by default): the largest k with 2·P(Binomial(n, ½) ≤ k−1) ≤ alpha; None when even
    [min, max] misses that (at 95 %: n < MIN_SAMPLES). Each end alone misses the median with probability
    at most alpha / 2 (a one-sided bound at that level). Worked by hand: n = 6 → 1 (2/64 = 3.1 %),
    n = 20 → 6 (2·P(B ≤ 5) = 4.1 %)."""
    k = 0
    while k < n // 2 and 2 * binom_half_cdf(n, k) <= alpha:
        k += 1  # k − 1 passes: the interval may reach one rank further in
    return k or None


def _order_statistic_interval(values: np.ndarray, alpha: float = 1 - CONFIDENCE) -> tuple[float | None,
                                                                                        float | None]:
    k = order_statistic_depth(len(values), alpha)
    if k is None:
        return None, None
    ordered = np.sort(values)
    return float(ordered[k - 1]), float(ordered[len(values) - k])


def median_ci(samples: Sequence[float], alpha: float = 1 - CONFIDENCE) -> tuple[float | None, float | None]:
    """(1 − alpha) order-statistic interval of the median of `samples` (95 % by default); (None, None)
    when there are too few samples for one (at 95 %: fewer than MIN_SAMPLES)."""
    return _order_statistic_interval(_clean(samples), alpha)


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


def paired_ratio(baseline: Sequence[float], other: Sequence[float], alpha: float = 1 - CONFIDENCE
                 ) -> tuple[float | None, float | None, float | None]:
    """(median, low, high) over rounds of baseline_i / other_i, with its (1 − alpha) order-statistic
    interval over the rounds (95 % by default). > 1 means `other` is faster than `baseline`. Samples are
    paired by index (round)."""
    return ratio_interval(round_ratios(baseline, other), alpha)


def ratio_interval(ratios: Sequence[float], alpha: float = 1 - CONFIDENCE
                   ) -> tuple[float | None, float | None, float | None]:
    """(median, low, high) of per-round ratios (`round_ratios`), the interval as paired_ratio's."""
    ratios = np.asarray(ratios, dtype=np.float64)
    if not len(ratios):
        return None, None, None
    lo, hi = _order_statistic_interval(ratios, alpha)
    return float(np.median(ratios)), lo, hi


def round_ratios(baseline: Sequence[float], other: Sequence[float]) -> np.ndarray:
    """baseline_i / other_i for the rounds where both are finite and non-zero."""
    pairs = [(b, o) for b, o in zip(baseline, other) if b and o and math.isfinite(b) and math.isfinite(o)]
    return np.asarray([b / o for b, o in pairs], dtype=np.float64)


def sign_test_p(baseline: Sequence[float], other: Sequence[float]) -> float | None:
    """Two-sided p-value of the sign test that the median ratio baseline_i / other_i is 1 (the test whose
    dual is paired_ratio's interval): with n rounds not tied at exactly 1 and k of them above 1,
    min(1, 2·P(Binomial(n, ½) ≤ min(k, n − k))). None with fewer than MIN_SAMPLES rounds."""
    return ratio_sign_test_p(round_ratios(baseline, other))


def ratio_sign_test_p(ratios: Sequence[float]) -> float | None:
    """sign_test_p of per-round ratios (`round_ratios`)."""
    ratios = np.asarray(ratios, dtype=np.float64)
    untied = ratios[ratios != 1.0]
    if len(ratios) < MIN_SAMPLES:
        return None
    if not len(untied):
        return 1.0
    above = int((untied > 1.0).sum())
    return min(1.0, 2 * binom_half_cdf(len(untied), min(above, len(untied) - above)))


def sign_test_greater_p(baseline: Sequence[float], other: Sequence[float]) -> float | None:
    """One-sided p-value of the sign test that the median ratio baseline_i / other_i is at most 1, against
    "above 1": with n rounds not tied at exactly 1 and k of them above 1, P(Binomial(n, ½) ≥ k). None with
    fewer than MIN_SAMPLES rounds. Worked by hand: 10 rounds all above 1 → 2^-10; 9 of 10 → 11/1024."""
    ratios = round_ratios(baseline, other)
    if len(ratios) < MIN_SAMPLES:
        return None
    untied = ratios[ratios != 1.0]
    above = int((untied > 1.0).sum())
    return binom_half_cdf(len(untied), len(untied) - above)  # P(B ≥ k) = P(B ≤ n − k) by symmetry


def speed_vs_torch_columns(ratios: Sequence[float]) -> dict:
    """The row's speed_vs_torch columns from per-round ratios torch step / engine step (none: all empty),
    and the ratios themselves (`speed_vs_torch_ratios`, in cells.jsonl: a cell's launches pool them)."""
    ratio, low, high = ratio_interval(ratios)
    return {"speed_vs_torch": ratio, "speed_vs_torch_ci95_low": low, "speed_vs_torch_ci95_high": high,
            "speed_vs_torch_half_width_pct": half_width_pct(ratio, low, high),
            "speed_vs_torch_p": ratio_sign_test_p(ratios), "verdict_vs_torch": verdict(low, high),
            "speed_vs_torch_ratios": list(ratios)}


def holm(p_values: Sequence[float | None], alpha: float = 1 - CONFIDENCE) -> list[bool | None]:
    """Holm's step-down correction (Holm 1979): which of m hypotheses are rejected with a family-wise
    error rate ≤ alpha, under any dependence between the tests. Sorted ascending, p_(i) is rejected while
    p_(j) ≤ alpha / (m − j + 1) for every j ≤ i. None stays None (no test) and does not count in m."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None and math.isfinite(p))
    out: list[bool | None] = [None if p is None or not math.isfinite(p) else False for p in p_values]
    m = len(tested)
    for j, (p, i) in enumerate(tested):
        if p > alpha / (m - j):
            break
        out[i] = True
    return out


def unpaired_ratio_interval(a, a_low, a_high, b, b_low, b_high):
    """The 95 % interval of a / b (a throughput ratio: step a / step b) from two medians measured apart, each
    with its own 95 % interval (scalars or numpy arrays alike; NaN where a side has none).

    The two estimates are independent, so on the log scale their half-widths add in quadrature, lower and
    upper distances kept apart (the order-statistic intervals are not symmetric):
    low = r · exp(−√(ln(a/a_low)² + ln(b_high/b)²)), high = r · exp(√(ln(a_high/a)² + ln(b/b_low)²)), r = a/b.
    (Two normal estimates' 95 % half-widths 1.96·σ combine to 1.96·√(σa² + σb²): an interval of 95 %, where
    the extremes a_low / b_high … a_high / b_low cover more, and so miss differences two precise cells
    resolve.) Used by compare (two runs) and advise (two cells of a run not stepped side by side)."""
    down = np.sqrt(np.log(a / a_low) ** 2 + np.log(b_high / b) ** 2)
    up = np.sqrt(np.log(a_high / a) ** 2 + np.log(b / b_low) ** 2)
    return a / b * np.exp(-down), a / b * np.exp(up)


def unpaired_ratio_p(ratio: float, low: float, high: float) -> float | None:
    """Two-sided p-value of ratio = 1 for an unpaired_ratio_interval, its dual: on the log scale the estimate
    is normal with the half-width on the side of 1 as 1.96·σ (z = ln r / σ, p = 2·(1 − Φ(|z|))), so p < 5 %
    exactly when the interval excludes 1. None without an interval."""
    values = (ratio, low, high)
    if any(v is None or not math.isfinite(v) or v <= 0 for v in values):
        return None
    z_95 = _normal_quantile(1 - (1 - CONFIDENCE) / 2)
    half = math.log(ratio / low) if ratio >= 1 else math.log(high / ratio)
    if half <= 0:
        return 0.0 if ratio != 1 else 1.0
    z = abs(math.log(ratio)) / (half / z_95)
    return math.erfc(z / math.sqrt(2))  # 2·(1 − Φ(z))


def _normal_quantile(p: float) -> float:
    """Φ⁻¹(p) by bisection on math.erf (1.959964 at 0.975), to 1e−12."""
    lo, hi = -10.0, 10.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p else (lo, mid)
    return (lo + hi) / 2


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


# The adaptive timed rounds (bench/worker/rounds.py): how many rounds, and why they stopped.
STOPPED_BY = ("target", "max_steps", "budget")


def checkpoints(minimum: int, maximum: int) -> list[int]:
    """The round counts at which the intervals are looked at, fixed before any step: minimum, then doubling
    (2×, 4×, …) up to maximum, which is the last. Looking only at pre-set points, and few of them, keeps the
    stopping rule from chasing a lucky stretch (each look is a chance to stop on a narrow interval)."""
    points = [minimum]
    while points[-1] < maximum:
        points.append(min(2 * points[-1], maximum))
    return points


def group_half_width_pct(samples: Sequence[Sequence[float]], reference: int | None) -> float | None:
    """The widest 95 % half-width, in % of its centre, over a group's engines: each engine's median step
    (samples[e], one step time per round) and, with a reference engine (torch DDP's index), each other
    engine's paired ratio to it. None while any of them has no interval yet (fewer than MIN_SAMPLES)."""
    pairs = [] if reference is None else [(reference, e) for e in range(len(samples)) if e != reference]
    return widest_half_width_pct(samples, pairs)


def widest_half_width_pct(samples: Sequence[Sequence[float]],
                          pairs: Sequence[tuple[int, int]]) -> float | None:
    """The widest 95 % half-width, in % of its centre, of each samples[e]'s median and of each pair's
    (reference, other) paired ratio; None while any of them has no interval yet (fewer than MIN_SAMPLES)."""
    widths = []
    for steps in samples:
        low, high = median_ci(steps)
        widths.append(half_width_pct(float(np.median(_clean(steps))) if len(_clean(steps)) else None,
                                     low, high))
    widths += [half_width_pct(*paired_ratio(samples[ref], samples[e])) for ref, e in pairs]
    return None if not widths or any(w is None for w in widths) else max(widths)


def stop_reason(worst_pct: float | None, target_pct: float, rounds: int, max_rounds: int,
                elapsed_s: float, next_rounds: int, budget_s: float,
                round_s: float | None = None) -> str | None:
    """Why the timed rounds stop at this checkpoint (one of STOPPED_BY), or None to go on: the target is
    met; or the cap of rounds is reached; or the next checkpoint's rounds, at this pace (`round_s` per
    round; default: elapsed_s over `rounds`), would take the group past its time budget."""
    if worst_pct is not None and worst_pct <= target_pct:
        return "target"
    if rounds >= max_rounds:
        return "max_steps"
    pace = elapsed_s / rounds if round_s is None else round_s
    if elapsed_s + (next_rounds - rounds) * pace > budget_s:
        return "budget"
    return None


def budget_fill(rounds: int, elapsed_s: float, budget_s: float, max_rounds: int,
                round_s: float | None = None) -> int:
    """Rounds that still fit in the budget at this pace (`round_s` per round; default: elapsed_s over
    `rounds`), at most up to max_rounds: run after a "budget" stop, so the group spends its whole budget.
    The count depends on the clock, not on the intervals, and nothing is looked at after them, so they add
    no stopping bias."""
    if rounds <= 0 or elapsed_s <= 0:
        return 0
    pace = elapsed_s / rounds if round_s is None else round_s
    if pace <= 0:
        return 0
    return max(0, min(max_rounds - rounds, math.floor((budget_s - elapsed_s) / pace)))


# --- Student's t, for the intervals of a cell measured in several launches (bench/run/between.py) ----------
Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes, 3rd ed.,
    § 6.4, `betacf`)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        even = m * (b - m) * x / ((qam + m2) * (a + m2))
        odd = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        for aa in (even, odd):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (Numerical Recipes § 6.4: the continued fraction
    where it converges fast, else the symmetry I_x(a, b) = 1 − I_{1−x}(b, a))."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                 + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    """P(T ≤ t) for Student's t with `dof` degrees of freedom (any positive real): 1 − ½·I_{ν/(ν+t²)}(ν/2, ½)
    for t ≥ 0 (Abramowitz & Stegun 26.5.27 with 26.7.1)."""
    tail = 0.5 * betainc(dof / 2.0, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t >= 0 else tail


@cache
def t_quantile(p: float, dof: float) -> float:
    """The p quantile of Student's t (p > ½), by bisection on t_cdf to 1e-10; the normal's at dof = inf.
    Worked values: t_{0.975} = 12.706 (1 dof), 4.303 (2), 2.228 (10), 1.960 (inf)."""
    if math.isinf(dof):
        return statistics.NormalDist().inv_cdf(p)
    low, high = 0.0, 1.0
    while t_cdf(high, dof) < p:
        high *= 2.0
    while high - low > 1e-10 * max(1.0, high):
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_cdf(mid, dof) < p else (low, mid)
    return (low + high) / 2.0
