"""Every metric formula of bench.metrics pinned with numbers worked out by hand (docs/design.md, Metrics)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import metrics


def test_step_time_is_the_slowest_rank_per_step():
    # rank 0 took 1 ms then 5 ms, rank 1 took 3 ms then 2 ms: the steps lasted 3 ms and 5 ms
    assert metrics.step_times_over_ranks([[1.0, 5.0], [3.0, 2.0]]) == [3.0, 5.0]


@pytest.mark.parametrize(("samples", "q", "expected"), [
    ([1.0, 2.0, 3.0, 4.0], 50, 2.5),               # between the 2nd and 3rd: (2 + 3) / 2
    ([10.0, 20.0, 30.0, 40.0, 50.0], 90, 46.0),   # position 0.9 · 4 = 3.6: 40 + 0.6 · (50 − 40)
    ([50.0, 10.0, 40.0, 20.0, 30.0], 50, 30.0),   # order does not matter: the middle value
    ([7.0], 90, 7.0),
])
def test_percentile_interpolates_linearly(samples, q, expected):
    assert metrics.percentile(samples, q) == pytest.approx(expected)
    assert metrics.percentile(samples, q) == pytest.approx(float(np.percentile(samples, q)))  # as numpy


def test_percentile_of_nothing_is_empty():
    assert metrics.percentile([], 50) is None


def test_throughput():
    assert metrics.throughput(64, 200.0) == pytest.approx(320.0)  # 64 samples in 0.2 s
    assert metrics.throughput(None, 200.0) is None and metrics.throughput(64, 0.0) is None


def test_scaling_efficiencies():
    # strong: T1 = 100 ms, T4 = 30 ms → 100 / (4 · 30) = 0.8333
    assert metrics.strong_scaling_efficiency(100.0, 30.0, 4) == pytest.approx(100 / 120)
    # weak: T1 = 100 ms, T_N = 125 ms → 0.8
    assert metrics.weak_scaling_efficiency(100.0, 125.0) == pytest.approx(0.8)
    assert metrics.strong_scaling_efficiency(math.nan, 30.0, 4) is None
    assert metrics.weak_scaling_efficiency(100.0, None) is None


def test_exposed_communication_is_step_minus_compute_only():
    assert metrics.exposed_comm_ms(12.5, 10.0) == pytest.approx(2.5)
    assert metrics.exposed_comm_ms(12.5, None) is None


def test_allreduce_bandwidths_follow_nccl_tests():
    # algbw = S / t: 1e9 bytes in 0.5 s = 2 GB/s
    assert metrics.algbw_gbps(1e9, 0.5) == pytest.approx(2.0)
    # busbw = algbw · 2(n − 1)/n (nccl-tests PERFORMANCE.md): factor 1 at n = 2, 1.5 at 4, 1.75 at 8
    assert metrics.busbw_gbps(10.0, 2) == pytest.approx(10.0)
    assert metrics.busbw_gbps(10.0, 4) == pytest.approx(15.0)
    assert metrics.busbw_gbps(10.0, 8) == pytest.approx(17.5)
    # one rank: nothing crosses a link (and algbw is not measured there)
    assert metrics.busbw_gbps(10.0, 1) == metrics.busbw_gbps(None, 1) == 0.0
    assert metrics.algbw_gbps(1e9, 0.0) is None and metrics.busbw_gbps(None, 4) is None


def test_mfu_is_achieved_over_peak():
    assert metrics.mfu(1e14, 4e14) == pytest.approx(0.25)
    assert metrics.mfu(1e14, None) is None and metrics.mfu(1e14, 0.0) is None
