"""Between launches: the interval of a cell measured in several launches, combining the variance within a
launch (its steps) and between launches (what a new launch changes: placement, memory layout, clocks,
other tenants).

The two-level model (Kalibera & Jones, "Rigorous benchmarking in reasonable time", ISMM 2013: estimate the
variance at each level of repetition) on the log scale, where a launch's effect multiplies every step:

    y_cj = ln(median of cell c in launch j) = μ_c + b_j + a_cj + e_cj,

b_j ~ (0, σ_b²) the launch's effect on all its cells (the machine during that launch), a_cj ~ (0, σ_c²)
its effect on this cell alone (where its buffers landed, what else ran at that moment), e_cj ~ (0, w_cj)
the error of the launch's median given its steps, w_cj = (ln(high / low) / (2 · 1.96))² from its own 95 %
order-statistic interval. The cell's value is exp(ȳ_c), the geometric mean of its L launches' medians, and
Var(ȳ_c) = (σ_b² + σ_c² + w̄_c) / L.

The cells measured in the same launches (a family: one world size of a run) separate the two: the launch's
shared effect is the mean over cells of their deviations, b̂_j = mean_c (y_cj − ȳ_c), with
S_b² = Σ b̂_j² / (L − 1) on L − 1 degrees of freedom, however many cells: pooling cells cannot tell more of
an effect they all share (moderating each cell's whole spread across the family, as if the shared part were
its own, covered 93.5 % on synthetic steps: 3 launches, σ 5 %, half of it shared, 1,600 cells). What
is left is each cell's own, s_c² = C/(C − 1) · Σ_j (y_cj − ȳ_c − b̂_j)² / (L − 1) on d = (L − 1)(C − 1)/C
degrees of freedom (C cells), estimating σ_c² + w̄_c. With the 2-3 launches a run affords, s_c² alone is
wide (Student's t on 1 or 2 degrees of freedom: 12.7 and 4.3 where the normal says 1.96), so it is moderated
across the family as limma does for genes with few replicates (Smyth 2004, "Linear models and empirical
Bayes methods for assessing differential expression in microarray experiments", SAGA 3(1): the moderated
t): the cells' s_c² are taken as draws from a scaled inverse-χ² prior whose centre s₀² and degrees of
freedom d₀ are fitted to them (`fit_prior`: limma's fitFDist, by moments of log s²), and each cell's is the
posterior s̃_c² = (d₀·s₀² + d·s_c²) / (d₀ + d) on d₀ + d degrees of freedom. When the cells agree, d₀ is
large and a cell borrows their precision; when they disagree (a noisy cell among quiet ones), d₀ is small
and each stands on its own. d₀ is capped at the degrees of freedom of the other cells (a prior cannot know
more than its data), and s̃_c² never falls below the cell's own w̄_c (no launch median is more precise than
its own interval).

The 95 % interval is exp(ȳ_c ± t_{0.975, ν} · √((S_b² + s̃_c²) / L)), ν by Satterthwaite (1946):
ν = (S_b² + s̃_c²)² / (S_b⁴ / (L − 1) + s̃_c⁴ / (d₀ + d)). A cell alone in its family falls back to its own
spread on L − 1 degrees of freedom. Coverage on synthetic steps with shared and own launch effects:
tests/test_between.py; docs/measurement.md, "Between launches".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.stats import CONFIDENCE, Z95, t_quantile


def _digamma(x: float) -> float:
    """ψ(x) for x > 0: the recurrence ψ(x) = ψ(x + 1) − 1/x up to x ≥ 6, then the asymptotic series
    (Abramowitz & Stegun 6.3.18); error below 1e-12 there."""
    out = 0.0
    while x < 6.0:
        out -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    series = f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (1 / 240 - f / 132))))
    return out + math.log(x) - 0.5 / x - series


def _trigamma(x: float) -> float:
    """ψ′(x) for x > 0: ψ′(x) = ψ′(x + 1) + 1/x² up to x ≥ 6, then the asymptotic series (A&S 6.4.12)."""
    out = 0.0
    while x < 6.0:
        out += 1.0 / (x * x)
        x += 1.0
    f = 1.0 / (x * x)
    return out + 1.0 / x + f / 2 + f / x * (1 / 6 - f * (1 / 30 - f * (1 / 42 - f / 30)))


def _tetragamma(x: float) -> float:
    """ψ″(x) for x > 0: ψ″(x) = ψ″(x + 1) − 2/x³ up to x ≥ 6, then the asymptotic series (A&S 6.4.13)."""
    out = 0.0
    while x < 6.0:
        out -= 2.0 / x ** 3
        x += 1.0
    f = 1.0 / (x * x)
    return out - f - f / x - f * f * (0.5 - f * (1 / 6 - f * (1 / 6 - f * 3 / 10)))


def _trigamma_inverse(y: float) -> float:
    """x with ψ′(x) = y (y > 0), by Newton's method from x = ½ + 1/y: limma's trigammaInverse (Smyth 2004)."""
    if y > 1e7:
        return 1.0 / math.sqrt(y)
    if y < 1e-6:
        return 1.0 / y
    x = 0.5 + 1.0 / y
    for _ in range(50):
        tri = _trigamma(x)
        step = tri * (1.0 - tri / y) / _tetragamma(x)
        x += step
        if -step / x < 1e-8:
            break
    return x


# A variance of log step times below this (a relative spread of 1e-6, finer than any clock here resolves a
# step) is floating-point rounding, not a spread: such a cell tells the prior nothing.
ROUNDING_SQ = 1e-12


@dataclass(frozen=True)
class Prior:
    """The moderating prior of a family of cells (those measured in the same launches): the centre s₀² of
    their launch-to-launch variances σ² and its weight in degrees of freedom d₀ (0: no prior, inf: every
    cell takes s₀²)."""

    s0_sq: float
    d0: float


NO_PRIOR = Prior(s0_sq=0.0, d0=0.0)


@dataclass(frozen=True)
class Spread:
    """One cell's launches on the log scale: each launch's log median (in launch order) with the launch's
    id, and the mean within-launch variance w̄ of those medians (None when a launch has no interval)."""

    logs: tuple[float, ...]
    launch_ids: tuple[int, ...]
    w_bar: float | None

    @property
    def launches(self) -> int:
        return len(self.logs)

    @property
    def mean(self) -> float:
        return float(np.mean(self.logs))

    @property
    def s_sq(self) -> float | None:
        """The launches' variance (None with one launch)."""
        return float(np.var(self.logs, ddof=1)) if len(self.logs) > 1 else None


def spread(medians: Sequence[float], lows: Sequence[float | None], highs: Sequence[float | None],
           launch_ids: Sequence[int] | None = None) -> Spread | None:
    """The Spread of a cell's launches from each launch's median and 95 % interval (launch_ids default
    0, 1, ...); None without a median."""
    ids = list(range(len(medians))) if launch_ids is None else list(launch_ids)
    kept = [(m, lo, hi, k) for m, lo, hi, k in zip(medians, lows, highs, ids) if m and m > 0]
    if not kept:
        return None
    with_interval = [(lo, hi) for _, lo, hi, _ in kept if lo and hi and lo > 0]
    w_bar = (float(np.mean([(math.log(hi / lo) / (2 * Z95)) ** 2 for lo, hi in with_interval]))
             if len(with_interval) == len(kept) else None)
    return Spread(logs=tuple(math.log(m) for m, _, _, _ in kept), launch_ids=tuple(k for *_, k in kept),
                  w_bar=w_bar)


def fit_prior(variances: Sequence[float], d: float) -> Prior:
    """The prior of a family's own variances s_c² on d degrees of freedom each (limma's fitFDist, by moments
    of log s²; Smyth 2004, § 6.2): with e_c = ln s_c² − ψ(d/2) + ln(d/2), ln s₀² + ψ(d₀/2) − ln(d₀/2) =
    mean(e) and ψ′(d₀/2) = var(e) − ψ′(d/2); d₀ = inf when that is ≤ 0 (they vary no more than sampling
    alone makes them), capped at the degrees of freedom of all but one cell (module docstring). NO_PRIOR
    with fewer than two variances above ROUNDING_SQ."""
    usable = [v for v in variances if v > ROUNDING_SQ]
    if len(usable) < 2:
        return NO_PRIOR
    e = np.log(usable) - _digamma(d / 2) + math.log(d / 2)
    excess = float(e.var(ddof=1)) - _trigamma(d / 2)
    d0 = 2 * _trigamma_inverse(excess) if excess > 0 else math.inf
    d0 = min(d0, d * (len(usable) - 1))
    return Prior(s0_sq=math.exp(float(e.mean()) + _digamma(d0 / 2) - math.log(d0 / 2)), d0=d0)


@dataclass(frozen=True)
class Family:
    """What the cells measured in the same launches share: the launches' common effects b̂_j (by launch
    id), S_b² on L − 1 degrees of freedom, and the prior of the cells' own variances on d each."""

    effects: dict[int, float]
    shared_sq: float
    d: float
    prior: Prior


def fit_family(spreads: Sequence[Spread | None]) -> Family | None:
    """The family of the cells measured in the same launches (the same launch ids, two or more); None when
    fewer than two cells share them (a cell then stands on its own spread)."""
    usable = [s for s in spreads if s is not None and s.launches > 1]
    if not usable:
        return None
    ids = max({s.launch_ids for s in usable}, key=lambda k: sum(s.launch_ids == k for s in usable))
    members = [s for s in usable if s.launch_ids == ids]
    cells, n = len(members), len(ids)
    if cells < 2:
        return None
    deviations = np.asarray([np.asarray(s.logs) - s.mean for s in members])  # cells × launches
    effects = deviations.mean(axis=0)
    shared_sq = float((effects ** 2).sum() / (n - 1))
    own = ((deviations - effects) ** 2).sum(axis=1) / (n - 1) * cells / (cells - 1)
    d = (n - 1) * (cells - 1) / cells
    return Family(effects=dict(zip(ids, effects.tolist())), shared_sq=shared_sq, d=d,
                  prior=fit_prior(own.tolist(), d))


@dataclass(frozen=True)
class Combined:
    """A cell's value over its launches, its 95 % interval, and the launches' spread."""

    center: float
    low: float | None
    high: float | None
    cv_pct: float | None  # 100 · s: the launch medians' standard deviation on the log scale (≈ their CV)
    dof: float | None     # the t quantile's degrees of freedom


def combine(s: Spread, family: Family | None) -> Combined:
    """The cell's geometric-mean value and its 95 % interval under the two-level model (module docstring).
    One launch: no between-launch spread, no interval here (the caller keeps the launch's own); a launch
    without an interval: none either."""
    center = math.exp(s.mean)
    if s.s_sq is None or s.w_bar is None:
        return Combined(center, None, None, None, None)
    cv = 100 * math.sqrt(s.s_sq)
    if family is None or set(s.launch_ids) != set(family.effects):
        shared, own, dof_shared, dof_own = 0.0, max(s.s_sq, s.w_bar), math.inf, s.launches - 1
    else:
        residual = [y - s.mean - family.effects[k] for y, k in zip(s.logs, s.launch_ids)]
        cells_factor = family.d / (s.launches - 1)  # (C − 1)/C: the family's own share of each deviation
        own_sq = sum(r * r for r in residual) / (s.launches - 1) / cells_factor
        prior = family.prior
        posterior = (prior.s0_sq if math.isinf(prior.d0)
                     else (prior.d0 * prior.s0_sq + family.d * own_sq) / (prior.d0 + family.d))
        shared, own = family.shared_sq, max(posterior, s.w_bar)
        dof_shared, dof_own = s.launches - 1, prior.d0 + family.d
    total = shared + own
    spread_of_total = (shared ** 2 / dof_shared if shared else 0.0) + own ** 2 / dof_own
    dof = total ** 2 / spread_of_total if spread_of_total else math.inf
    half = t_quantile(1 - (1 - CONFIDENCE) / 2, dof) * math.sqrt(total / s.launches)
    return Combined(center, math.exp(s.mean - half), math.exp(s.mean + half), cv, dof)
