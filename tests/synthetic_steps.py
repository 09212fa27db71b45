"""Synthetic step times with a known median, for the interval tests (tests/test_stats.py,
tests/test_adaptive.py) and scripts/interval_coverage.py: no timing, so the tests are exact and fast.

A round r of a group of engines: a slowdown shared by every engine of the round (the machine busy for a
while: log-normal, with a heavy tail of spikes), times each engine's own noise (log-normal, with rare
Pareto-tailed stalls), times the engine's true scale. The engines' own noises are independent and
identically distributed, so the ratio of two engines in one round has median scale_a / scale_b exactly
(its logarithm is symmetric about log(scale_a / scale_b)); a cell's median is scale × CELL_MEDIAN, found
once from a large sample (`cell_median`).
"""

from __future__ import annotations

import numpy as np

SHARED_SIGMA = 0.08      # the round's shared slowdown: log-normal spread
SHARED_SPIKE_P = 0.10    # ... and in this share of rounds a spike of 1 + Pareto(1.5) × 0.3
OWN_SIGMA = 0.03         # an engine's own noise in a step: log-normal spread
OWN_STALL_P = 0.05       # ... and in this share of steps a stall of 1 + Pareto(1.2) × 0.2
PARETO_SHARED, PARETO_OWN = 1.5, 1.2


def _shared(rng: np.random.Generator, n: int) -> np.ndarray:
    spikes = np.where(rng.random(n) < SHARED_SPIKE_P, 1 + rng.pareto(PARETO_SHARED, n) * 0.3, 1.0)
    return np.exp(rng.normal(0, SHARED_SIGMA, n)) * spikes


def _own(rng: np.random.Generator, shape) -> np.ndarray:
    stalls = np.where(rng.random(shape) < OWN_STALL_P, 1 + rng.pareto(PARETO_OWN, shape) * 0.2, 1.0)
    return np.exp(rng.normal(0, OWN_SIGMA, shape)) * stalls


def rounds(rng: np.random.Generator, scales: list[float], n: int) -> np.ndarray:
    """n rounds of len(scales) engines: an (engines × rounds) array of step times in ms."""
    shared = _shared(rng, n)
    return np.asarray(scales, dtype=np.float64)[:, None] * shared[None, :] * _own(rng, (len(scales), n))


def cell_median(n: int = 2_000_000, seed: int = 99) -> float:
    """The population median of one engine's step time at scale 1 (from n draws: ±0.1 % or better)."""
    return float(np.median(rounds(np.random.default_rng(seed), [1.0], n)[0]))


# A launch's effect on every step it times (tests/test_between.py): log-normal, part of it shared by every
# cell of the launch (the machine that launch ran on), part the cell's own (where its buffers landed).
LAUNCH_SHARED_SHARE = 0.5  # of the launch effect's variance


def launches(rng: np.random.Generator, cells: int, n_launches: int, n_rounds: int, sigma: float,
             spread: float = 0.0) -> np.ndarray:
    """Step times of `cells` engines (groups of 4 stepped round by round, as `rounds`) in `n_launches`
    launches of `n_rounds` rounds: a (cells × launches × rounds) array. Every step of a launch is multiplied
    by exp(a), a ~ N(0, σ_c²), σ_c = sigma · exp(N(0, spread²)) per cell (spread > 0: cells whose launches
    differ more than others'), LAUNCH_SHARED_SHARE of a's variance shared by the launch's cells. The true
    value of every cell, at a = 0, is CELL_MEDIAN (`cell_median`)."""
    sigmas = sigma * np.exp(rng.normal(0, spread, cells)) if spread else np.full(cells, sigma)
    out = np.empty((cells, n_launches, n_rounds))
    for j in range(n_launches):
        shared = rng.normal(0, 1)
        for g in range(0, cells, 4):
            size = min(4, cells - g)
            own = rng.normal(0, 1, size)
            effect = sigmas[g:g + size] * (np.sqrt(LAUNCH_SHARED_SHARE) * shared
                                          + np.sqrt(1 - LAUNCH_SHARED_SHARE) * own)
            out[g:g + size, j] = rounds(rng, list(np.exp(effect)), n_rounds)
    return out
