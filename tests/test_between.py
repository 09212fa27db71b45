"""bench/run/between.py: the interval of a cell measured in several launches, hand-worked, and its coverage on
synthetic steps with a launch effect (tests/synthetic_steps.py), where the interval of one launch's steps
misses the cell's value far more often than 5 %."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from bench import stats
from bench.run import between
from tests import synthetic_steps as syn


@pytest.mark.parametrize("dof, quantile", [(1, 12.7062), (2, 4.3027), (6, 2.4469), (10, 2.2281),
                                           (math.inf, 1.9600)])
def test_t_quantile_matches_the_tables(dof, quantile):
    # Student's t, 97.5th percentile (any table, e.g. Abramowitz & Stegun 26.10)
    assert stats.t_quantile(0.975, dof) == pytest.approx(quantile, abs=1e-4)


def test_polygamma_values():
    # ψ(1) = −γ, ψ′(1) = π²/6, ψ″(1) = −2ζ(3); ψ(x + 1) = ψ(x) + 1/x
    assert between._digamma(1.0) == pytest.approx(-0.5772156649, abs=1e-9)
    assert between._trigamma(1.0) == pytest.approx(math.pi ** 2 / 6, abs=1e-9)
    assert between._tetragamma(1.0) == pytest.approx(-2 * 1.2020569032, abs=1e-8)
    assert between._digamma(7.5) == pytest.approx(between._digamma(6.5) + 1 / 6.5, abs=1e-10)
    assert between._trigamma_inverse(between._trigamma(3.7)) == pytest.approx(3.7, rel=1e-7)


def test_spread_by_hand():
    # launches with medians 10 and 12, intervals [9, 11] and [11, 13]: ȳ = ln √120, s² = (ln 1.2)² / 2,
    # w̄ = mean of (ln(11/9) / 3.92)² and (ln(13/11) / 3.92)²
    s = between.spread([10.0, 12.0], [9.0, 11.0], [11.0, 13.0], [4, 7])
    assert math.exp(s.mean) == pytest.approx(math.sqrt(120)) and s.launch_ids == (4, 7)
    assert s.s_sq == pytest.approx(math.log(1.2) ** 2 / 2)
    w = [(math.log(hi / lo) / (2 * stats.Z95)) ** 2 for lo, hi in ((9, 11), (11, 13))]
    assert s.w_bar == pytest.approx(sum(w) / 2) and s.launches == 2
    assert between.spread([10.0, 12.0], [9.0, None], [11.0, None]).w_bar is None  # a launch without one
    assert between.spread([10.0], [9.0], [11.0]).s_sq is None


def test_fit_prior_by_hand():
    # Three cells' own variances on d = 2, each 0.01: log s² varies no more than sampling makes it, so
    # d₀ = inf, capped at the other cells' degrees of freedom d·(C − 1) = 4; s₀² = exp(mean(e) + ψ(2) −
    # ln 2) with e = ln 0.01 − ψ(1) + ln 1 and ψ(2) = ψ(1) + 1: s₀² = 0.01 · e / 2.
    prior = between.fit_prior([0.01] * 3, 2)
    assert prior.d0 == 4 and prior.s0_sq == pytest.approx(0.01 * math.e / 2)
    assert between.fit_prior([0.01], 2) == between.NO_PRIOR  # a prior needs two cells
    assert between.fit_prior([0.01, 0.0], 2) == between.NO_PRIOR  # ... with a spread


def test_fit_prior_recovers_a_known_prior():
    # σ_c² drawn from the scaled inverse χ² prior (s₀² = 0.01, d₀ = 8), s_c² = σ_c² χ²_d / d with d = 2: the
    # moment fit finds both within sampling error over 4,000 cells
    rng = np.random.default_rng(3)
    sigma_sq = 0.01 * 8 / rng.chisquare(8, 4000)
    prior = between.fit_prior((sigma_sq * rng.chisquare(2, 4000) / 2).tolist(), 2)
    assert prior.d0 == pytest.approx(8, rel=0.3) and prior.s0_sq == pytest.approx(0.01, rel=0.1)


def test_fit_family_and_a_shared_launch_effect_by_hand():
    # Two cells, two launches, both 20 % slower in launch 7 than in launch 4: all of it is the launches'
    # shared effect, b̂ = ∓ln(1.2)/2, S_b² = 2·(ln(1.2)/2)² / 1; nothing is left to the cells (no prior);
    # d = (L − 1)(C − 1)/C = 0.5. With w̄ = 0.0001: total = S_b² + w̄ on ν = total² / (S_b⁴/1 + w̄²/0.5)
    # = 1.012 degrees of freedom (t = 12.356): half = 12.356 · √(total / 2) = 1.1297.
    cells = [between.spread([m, m * 1.2], [m * 0.9, m * 1.1], [m * 1.1, m * 1.3], [4, 7]) for m in (10, 20)]
    family = between.fit_family(cells + [None, between.spread([5.0], [4.0], [6.0], [4])])
    h = math.log(1.2) / 2
    assert family.effects == pytest.approx({4: -h, 7: h}) and family.d == 0.5
    assert family.shared_sq == pytest.approx(math.log(1.2) ** 2 / 2) and family.prior == between.NO_PRIOR
    combined = between.combine(dataclasses.replace(cells[0], w_bar=0.0001), family)
    assert combined.dof == pytest.approx(1.011996, rel=1e-5)
    assert math.log(combined.high / combined.center) == pytest.approx(1.12974, rel=1e-4)
    assert between.fit_family(cells[:1]) is None  # one cell: nothing to share


def test_combine_by_hand():
    # Three launches, no shared effect left (b̂ = 0, S_b² = 0.0001), a family of C = 3 (d = 2·2/3 = 4/3) with
    # prior d₀ = 4, s₀² = 0.01·e/2. The cell's launches ln 10 ∓ 0.02: own s² = (2 · 0.02² / 2) / (2/3) =
    # 0.0006; s̃² = (4 s₀² + (4/3)·0.0006) / (16/3) = 0.0103436; total 0.0104436 on ν = total² /
    # (0.0001²/2 + s̃⁴/(16/3)) = 5.4356 (t = 2.50984): half = 2.50984 · √(total / 3) = 0.148084.
    family = between.Family(effects={0: 0.0, 1: 0.0, 2: 0.0}, shared_sq=0.0001, d=4 / 3,
                            prior=between.Prior(0.01 * math.e / 2, 4.0))
    logs = (math.log(10) - 0.02, math.log(10), math.log(10) + 0.02)
    combined = between.combine(between.Spread(logs, (0, 1, 2), 0.0001), family)
    assert combined.center == pytest.approx(10.0) and combined.dof == pytest.approx(5.43560, rel=1e-5)
    assert math.log(combined.high / 10) == pytest.approx(0.148084, rel=1e-5)
    assert math.log(10 / combined.low) == pytest.approx(0.148084, rel=1e-5)
    assert combined.cv_pct == pytest.approx(2.0)
    # alone (no family, or launches the family did not run): its own spread on L − 1 = 2 degrees of
    # freedom, never below its launches' own w̄
    alone = between.combine(between.Spread(logs, (0, 1, 5), 0.0001), family)
    assert math.log(alone.high / 10) == pytest.approx(4.302653 * math.sqrt(0.0004 / 3), rel=1e-5)
    floor = between.combine(between.Spread(logs, (0, 1, 2), 0.0009), None)
    assert math.log(floor.high / 10) == pytest.approx(4.302653 * math.sqrt(0.0009 / 3), rel=1e-5)
    one = between.combine(between.Spread((math.log(5),), (0,), 0.0001), None)
    assert (one.center, one.low, one.high, one.cv_pct) == (pytest.approx(5.0), None, None, None)


def _spread(cell: np.ndarray) -> between.Spread:
    """A synthetic cell's Spread (launches × rounds), as bench/run/merge.py makes a real one's."""
    intervals = [stats.median_ci(launch) for launch in cell]
    return between.spread([float(np.median(launch)) for launch in cell], [i[0] for i in intervals],
                          [i[1] for i in intervals])


def _coverage(rng, n_launches: int, sigma: float, spread: float, families: int = 50, cells: int = 16,
              n_rounds: int = 20) -> tuple[float, float]:
    """(coverage of the combined interval, coverage of the interval of all steps pooled as one launch's)
    of the cells' true value, over `families` runs of `cells` cells each."""
    truth = syn.cell_median()
    combined = pooled = 0
    for _ in range(families):
        data = syn.launches(rng, cells, n_launches, n_rounds, sigma, spread)
        spreads = [_spread(cell) for cell in data]
        family = between.fit_family(spreads)
        for cell, s in zip(data, spreads):
            c = between.combine(s, family)
            combined += c.low <= truth <= c.high
            low, high = stats.median_ci(cell.ravel())
            pooled += low <= truth <= high
    return combined / (families * cells), pooled / (families * cells)


@pytest.mark.parametrize("n_launches, sigma, spread", [
    (2, 0.05, 0.0),   # every cell's launches differ alike (σ 5 %)
    (3, 0.05, 0.0),
    (2, 0.05, 0.7),   # some cells' launches differ several times more than others'
    (3, 0.10, 1.0),
    (3, 0.0, 0.0),    # no launch effect: the prior says so, the interval stays near the launches' own
])
def test_the_combined_interval_covers_the_cells_value_across_launches(n_launches, sigma, spread):
    rng = np.random.default_rng(21)
    combined, pooled = _coverage(rng, n_launches, sigma, spread)
    assert combined >= 0.93, combined
    if sigma:  # one launch's interval, even of all the steps, knows nothing of the launch effect
        assert pooled < 0.80, pooled


def test_an_a_a_pair_of_runs_is_within_noise_with_the_combined_intervals():
    # Two runs of the same cells (3 launches each, σ 5 %): compare's ratio interval (half-widths in quadrature
    # on the log scale) says faster or slower in at most ~5 % of cells; with one launch's intervals, in most.
    rng = np.random.default_rng(23)
    truth_false = pooled_false = total = 0
    for _ in range(30):
        sides = []
        for _ in range(2):
            data = syn.launches(rng, 16, 3, 20, 0.05)
            spreads = [_spread(cell) for cell in data]
            family = between.fit_family(spreads)
            one_launch = [(float(np.median(cell.ravel())), *stats.median_ci(cell.ravel())) for cell in data]
            sides.append(([between.combine(s, family) for s in spreads], one_launch))
        for (ca, pa), (cb, pb) in zip(zip(*sides[0]), zip(*sides[1])):
            total += 1
            truth_false += _called(ca.center, ca.low, ca.high, cb.center, cb.low, cb.high)
            pooled_false += _called(*pa, *pb)
    assert truth_false / total <= 0.06 and pooled_false / total > 0.15, (truth_false, pooled_false, total)


def _called(a, a_low, a_high, b, b_low, b_high) -> bool:
    """Whether bench.report.compare.ratio_interval's interval of a / b excludes 1."""
    down = math.hypot(math.log(a / a_low), math.log(b_high / b))
    up = math.hypot(math.log(a_high / a), math.log(b / b_low))
    r = a / b
    return stats.verdict(r * math.exp(-down), r * math.exp(up)) != "within noise"
