"""bench/worker/steady.py: the warm-up found by a changepoint test, and outliers counted by Tukey's fences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.worker import steady


def test_the_standardised_prefix_rank_sum_by_hand():
    # x = 4, 3, 1, 2: ranks 4, 3, 1, 2 (n = 4). t = 1: U = 2·4 − 1·5 = 3, var = 1·3·5/3 = 5, Z = 3/√5;
    # t = 2: U = 2·7 − 2·5 = 4, var = 2·2·5/3, Z = 4/√(20/3) = 1.549, the largest.
    z = steady._max_prefix_z(np.array([[4.0, 3.0, 1.0, 2.0]]), 2)
    assert z[0] == pytest.approx(4 / math.sqrt(20 / 3)) and 4 / math.sqrt(20 / 3) > 3 / math.sqrt(5)


def test_a_slow_start_is_found_where_it_ends():
    rng = np.random.default_rng(0)
    for _ in range(20):
        steps = np.r_[rng.normal(1.5, 0.05, 5), rng.normal(1.0, 0.05, 30)]
        end, p = steady.warmup_end(steps)
        assert end == 5 and p <= steady.WARMUP_ALPHA


def test_no_warm_up_in_steady_steps_a_faster_start_or_a_late_change():
    rng = np.random.default_rng(1)
    found = sum(steady.warmup_end(rng.lognormal(0, 0.1, 35))[0] > 0 for _ in range(200))
    assert found / 200 <= 0.08  # a 5 % test (its permutation p-value has ±0.7 % of Monte-Carlo error)
    faster_first = np.r_[np.full(5, 0.5), rng.normal(1.0, 0.05, 30)]
    assert steady.warmup_end(faster_first)[0] == 0   # one-sided: only a slower start is warm-up
    late = np.r_[rng.normal(1.0, 0.05, 25), rng.normal(1.5, 0.05, 10)]
    assert steady.warmup_end(late)[0] == 0           # a change late in the series is the machine's
    assert steady.warmup_end([3.0, 1.0, 1.0]) == (0, None)  # too few steps to test


def test_tukey_fences_by_hand():
    # 1, 2, 3, 4, 100: Q1 = 2, Q3 = 4 (linear interpolation), IQR 2: fences −1 and 7, one step outside
    assert steady.tukey_fences([1, 2, 3, 4, 100]) == (-1.0, 7.0)
    assert steady.tukey_outliers([1, 2, 3, 4, 100]) == 1
    assert steady.tukey_outliers([1, 2, 3, 4, 6.9]) == 0 and steady.tukey_outliers([1, 2, 3]) is None
