"""bench.stats: the percentile bootstrap, paired ratios, the verdict rule and rank skew, pinned by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bench import stats


def test_median_interval_of_a_known_sample():
    # 1..100, a uniform sample: the median is 50.5; the sample median's standard error is
    # 1 / (2 f(m) √n) with density f = 1/99 → 99 / 20 = 4.95, so the 95 % interval is about
    # 50.5 ± 1.96 · 4.95 = 40.8 .. 60.2. The order-statistic interval at n = 100: k = 40
    # (2·P(B ≤ 39) = 3.5 %, 2·P(B ≤ 40) = 5.7 %), so [x_(40), x_(61)] = [40, 61].
    samples = list(range(1, 101))
    assert stats.median_ci(samples) == (40.0, 61.0)
    assert stats.median_ci(samples[::-1]) == (40.0, 61.0)  # order of the samples does not matter


@pytest.mark.parametrize(("n", "k"), [(5, None), (6, 1), (8, 1), (9, 2), (20, 6), (100, 40)])
def test_order_statistic_depth_by_hand(n, k):
    # 2·P(Binomial(n, ½) ≤ k − 1) ≤ 5 % with the largest k: n = 5: 2/32 = 6.25 % > 5 % (none);
    # n = 6: 2/64 = 3.1 %; n = 8: 2/256 = 0.8 % but 2·9/256 = 7.0 %; n = 9: 2·10/512 = 3.9 %;
    # n = 20: 2·P(B ≤ 5) = 2·21700/2^20 = 4.1 %, 2·P(B ≤ 6) = 11.5 %
    assert stats.order_statistic_depth(n) == k


def test_binomial_cdf_by_hand_and_at_large_n():
    assert stats.binom_half_cdf(4, 1) == pytest.approx(5 / 16)
    assert stats.binom_half_cdf(20, 5) == pytest.approx(21700 / 2**20)
    assert stats.binom_half_cdf(2000, 1000) == pytest.approx(0.5 + 0.5 * 0.01784, abs=1e-4)  # P(B = n/2)


def test_median_interval_of_constant_samples_is_a_point():
    assert stats.median_ci([4.0] * 10) == (4.0, 4.0)
    assert stats.median_ci([4.0] * 5) == (None, None)  # fewer than MIN_SAMPLES: no 95 % interval exists
    assert stats.median_ci([4.0]) == (None, None) and stats.median_ci([]) == (None, None)


def test_median_interval_ignores_missing_values():
    values = [1.0, 3.0, 2.0, 5.0, 4.0, 6.0]
    assert stats.median_ci([*values, None, float("nan")]) == stats.median_ci(values) == (1.0, 6.0)


@pytest.mark.parametrize(("low", "high", "expected"), [
    (1.02, 1.10, "faster"), (0.90, 0.99, "slower"), (0.97, 1.03, "within noise"),
    (1.0, 1.2, "within noise"),  # touching 1 is not above it
    (None, 1.1, None),
])
def test_verdict_needs_the_whole_interval_on_one_side(low, high, expected):
    assert stats.verdict(low, high) == expected


def test_paired_ratio_cancels_noise_shared_by_a_round():
    # every round is slow or fast for both engines alike; the other engine is always 10 % faster
    rng = np.random.default_rng(0)
    baseline = list(rng.uniform(10, 30, size=40))
    other = [b / 1.1 for b in baseline]
    ratio, low, high = stats.paired_ratio(baseline, other)
    assert ratio == pytest.approx(1.1) and low == pytest.approx(1.1) and high == pytest.approx(1.1)
    assert stats.verdict(low, high) == "faster"


def test_paired_ratio_median_by_hand():
    # ratios 2/1, 3/2, 4/4, 6/4, 9/6, 2/2 = 2.0, 1.5, 1.0, 1.5, 1.5, 1.0 → median 1.5; six rounds: the
    # interval is [min, max] = [1.0, 2.0]
    ratio, low, high = stats.paired_ratio([2.0, 3.0, 4.0, 6.0, 9.0, 2.0], [1.0, 2.0, 4.0, 4.0, 6.0, 2.0])
    assert (ratio, low, high) == (pytest.approx(1.5), 1.0, 2.0)
    assert stats.paired_ratio([2.0, 3.0, 4.0], [1.0, 2.0, 4.0]) == (pytest.approx(1.5), None, None)
    assert stats.paired_ratio([1.0], [0.0]) == (None, None, None)


def test_sign_test_by_hand():
    # 8 rounds, 7 ratios above 1 and one below: p = 2·P(B(8, ½) ≤ 1) = 2·9/256
    base = [2.0] * 7 + [1.0] + [1.0]  # the last round is a tie (ratio exactly 1): dropped
    other = [1.0] * 7 + [2.0] + [1.0]
    assert stats.sign_test_p(base, other) == pytest.approx(18 / 256)
    assert stats.sign_test_p(base[:5], other[:5]) is None  # fewer than MIN_SAMPLES rounds
    assert stats.sign_test_p([1.0] * 6, [1.0] * 6) == 1.0


def test_holm_by_hand():
    # m = 4 (None is no test): sorted, 0.001 ≤ 0.05/4; 0.013 ≤ 0.05/3; 0.03 > 0.05/2 stops: 0.03, 0.04 stay
    assert stats.holm([0.03, 0.001, None, 0.013, 0.04]) == [False, True, None, True, False]
    # 0.0125 = 0.05/4 passes the first step, 0.0167 = 0.05/3 the second, 0.025 the third, 0.05 the last
    assert stats.holm([0.0125, 0.0166, 0.025, 0.05]) == [True, True, True, True]
    assert stats.holm([0.0126, 0.001]) == [True, True] and stats.holm([0.026, 0.03]) == [False, False]


def test_median_difference_interval():
    low, high = stats.median_difference_ci([10.0, 11.0, 12.0, 13.0], [5.0, 5.5, 6.0])
    assert low <= 12.5 - 5.5 <= high and low >= 10.0 - 6.0 and high <= 13.0 - 5.0


def test_rank_skew_by_hand():
    # rank 0: 10, 12, 11 ms; rank 1: 14, 11, 13 ms → skews 4, 1, 2 → p50 2; rank 1 slowest in 2 of 3
    assert stats.rank_skew([[10.0, 12.0, 11.0], [14.0, 11.0, 13.0]]) == (2.0, 1)
    assert stats.rank_skew([[10.0, 12.0]]) == (None, None)


def test_half_width_pct():
    assert stats.half_width_pct(100.0, 95.0, 105.0) == pytest.approx(5.0)
    assert stats.half_width_pct(None, 1.0, 2.0) is None


def test_round_order_rotates_and_walks_back_every_other_round():
    # worked by hand for three engines: starts 0, 1, 2, 0; upward in even rounds, downward in odd ones
    assert [stats.round_order(r, 3) for r in range(4)] == [[0, 1, 2], [1, 0, 2], [2, 0, 1], [0, 2, 1]]
    k, rounds = 5, 10
    orders = [stats.round_order(r, k) for r in range(rounds)]
    assert all(sorted(o) == list(range(k)) for o in orders)
    assert sorted(o[0] for o in orders) == sorted(list(range(k)) * (rounds // k))  # each first equally often
    for e in range(k):  # and no engine always follows the same one
        assert len({o[o.index(e) - 1] for o in orders if o.index(e) > 0}) >= 2


def test_checkpoints_double_up_to_the_cap():
    assert stats.checkpoints(10, 160) == [10, 20, 40, 80, 160]
    assert stats.checkpoints(10, 100) == [10, 20, 40, 80, 100]
    assert stats.checkpoints(10, 10) == [10]


def test_stop_reason_by_hand():
    # target 2 %: 1.9 % stops; 2.5 % at 40 of 160 rounds after 4 s goes on if 40 more rounds (4 s) fit in
    # 10 s, and stops for the budget when they do not (budget 7 s)
    assert stats.stop_reason(1.9, 2.0, 40, 160, 4.0, 80, 10.0) == "target"
    assert stats.stop_reason(2.5, 2.0, 40, 160, 4.0, 80, 10.0) is None
    assert stats.stop_reason(2.5, 2.0, 40, 160, 4.0, 80, 7.0) == "budget"
    assert stats.stop_reason(None, 2.0, 160, 160, 4.0, 160, 100.0) == "max_steps"  # no interval yet: on


def test_budget_fill_by_hand():
    # 40 rounds in 4 s (0.1 s each), budget 7 s: 30 more fit; capped by the rounds left to the maximum
    assert stats.budget_fill(40, 4.0, 7.0, 160) == 30
    assert stats.budget_fill(40, 4.0, 7.0, 50) == 10
    assert stats.budget_fill(40, 8.0, 7.0, 160) == 0  # already past it


def test_group_half_width_is_the_widest_of_cells_and_ratios():
    # six rounds; torch constant 10 ms; the other engine 10, 10, 10, 10, 12, 8 ms: its interval [8, 12]
    # around median 10 is ±20 %, the ratio's (10/12 … 10/8 around 1.0) is ±20.8 %; torch's ±0 %
    torch_ms, other = [10.0] * 6, [10.0, 10.0, 10.0, 10.0, 12.0, 8.0]
    assert stats.group_half_width_pct([torch_ms, other], reference=0) == pytest.approx(
        (10 / 8 - 10 / 12) / 2 * 100)
    assert stats.group_half_width_pct([torch_ms, other], reference=None) == pytest.approx(20.0)
    assert stats.group_half_width_pct([torch_ms[:5], other[:5]], reference=0) is None  # no interval yet


def test_unpaired_ratio_p_is_the_dual_of_its_interval():
    import math

    # Φ⁻¹(0.975) = 1.959964 (tables)
    assert stats._normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    # an interval whose lower end touches 1: z = ln r / (ln(r/low) / 1.959964) = 1.959964 → p = 0.05
    assert stats.unpaired_ratio_p(1.1, 1.0, 1.2) == pytest.approx(0.05, rel=1e-6)
    assert stats.unpaired_ratio_p(1 / 1.1, 0.8, 1.0) == pytest.approx(0.05, rel=1e-6)  # upper end, below 1
    # r = 1.1 [1.05, …]: σ = ln(1.1/1.05) / 1.959964 = 0.023735, z = ln 1.1 / σ = 4.0156, p = erfc(z/√2)
    p = stats.unpaired_ratio_p(1.1, 1.05, 1.16)
    assert p == pytest.approx(math.erfc(4.0156 / math.sqrt(2)), rel=1e-3)
    assert stats.unpaired_ratio_p(1.0, 0.9, 1.1) == pytest.approx(1.0)
    assert stats.unpaired_ratio_p(1.1, float("nan"), 1.2) is None
