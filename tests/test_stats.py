"""bench.stats: the percentile bootstrap, paired ratios, the verdict rule and rank skew, pinned by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bench import stats


def test_median_interval_of_a_known_sample():
    # 1..100, a uniform sample: the median is 50.5; the sample median's standard error is
    # 1 / (2 f(m) √n) with density f = 1/99 → 99 / 20 = 4.95, so the 95 % interval is about
    # 50.5 ± 1.96 · 4.95 = 40.8 .. 60.2
    samples = list(range(1, 101))
    low, high = stats.median_ci(samples)
    assert low < 50.5 < high
    assert low == pytest.approx(40.8, abs=1.5) and high == pytest.approx(60.2, abs=1.5)
    assert stats.median_ci(samples) == (low, high)  # seeded: the same samples, the same interval


def test_median_interval_of_constant_samples_is_a_point():
    assert stats.median_ci([4.0] * 10) == (4.0, 4.0)
    assert stats.median_ci([4.0]) == (None, None) and stats.median_ci([]) == (None, None)


def test_median_interval_ignores_missing_values():
    assert stats.median_ci([1.0, None, float("nan"), 3.0]) == stats.median_ci([1.0, 3.0])


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
    # ratios 2/1, 3/2, 4/4 = 2.0, 1.5, 1.0 → median 1.5
    ratio, low, high = stats.paired_ratio([2.0, 3.0, 4.0], [1.0, 2.0, 4.0])
    assert ratio == pytest.approx(1.5) and 1.0 <= low <= 1.5 <= high <= 2.0
    assert stats.paired_ratio([1.0], [1.0]) == (None, None, None)


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
