"""The figures behind bench.stats' choice of interval (docs/design.md, "Uncertainty"): on synthetic step
times with a known median (tests/synthetic_steps.py), the A/A false-verdict rate and the coverage of a
cell's median, for the percentile bootstrap the suite used before and the order-statistic interval it uses
now, then with the adaptive stopping rule; then, for cells timed in several launches with a launch effect
(docs/measurement.md, "Between launches"), the coverage of bench/run/between.py's interval against one
launch's and against pooling the shared effect over cells, and two runs compared cell by cell (compare's
rule), with and without Holm's correction. Seeded: the same figures every run. A few minutes on one core.

    PYTHONPATH=. python scripts/interval_coverage.py
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import stats  # noqa: E402
from bench.run import between  # noqa: E402
from tests import synthetic_steps as syn  # noqa: E402


def percentile_median_ci(values: np.ndarray) -> tuple[float, float]:
    """The percentile bootstrap of the median, as bench.stats had it: 2,000 seeded resamples."""
    rng = np.random.default_rng(stats.SEED)
    picks = rng.integers(0, len(values), size=(stats.BOOTSTRAP_RESAMPLES, len(values)))
    lo, hi = np.percentile(np.median(values[picks], axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def fixed_rounds(name: str, interval, counts: tuple[int, ...], reps: int, median: float) -> None:
    rng = np.random.default_rng(1)
    for n in counts:
        false = covered = 0
        for _ in range(reps):
            a, b = syn.rounds(rng, [1.0, 1.0], n)
            false += stats.verdict(*interval(a / b)) != "within noise"
            low, high = interval(a)
            covered += low <= median <= high
        print(f"{name:16s} n={n:3d}  A/A false verdicts {false / reps:6.1%}  median coverage "
              f"{covered / reps:6.1%}  ({reps} pairs)")


def adaptive(target: float, minimum: int, reps: int, median: float, rng) -> None:
    covered = covered_ratio = false = 0
    rounds = []
    for _ in range(reps):
        data = syn.rounds(rng, [1.0, 1.0, 1.1, 1.0], 640)
        for n in stats.checkpoints(minimum, 640):
            kept = data[:, :n]
            if stats.stop_reason(stats.group_half_width_pct(kept, 0), target, n, 640, 0.0, n, float("inf")):
                break
        rounds.append(kept.shape[1])
        low, high = stats.median_ci(kept[1])
        covered += low <= median <= high
        _, low, high = stats.paired_ratio(kept[0], kept[2])
        covered_ratio += low <= 1 / 1.1 <= high
        false += stats.verdict(*stats.paired_ratio(kept[0], kept[1])[1:]) != "within noise"
    print(f"adaptive target ±{target:g} % from {minimum}: median rounds {np.median(rounds):.0f}, median "
          f"coverage {covered / reps:.1%}, ratio coverage {covered_ratio / reps:.1%}, A/A false verdicts "
          f"{false / reps:.1%} ({reps} groups)")


def _spread(cell: np.ndarray) -> between.Spread:
    intervals = [stats.median_ci(launch) for launch in cell]
    return between.spread([float(np.median(launch)) for launch in cell], [i[0] for i in intervals],
                          [i[1] for i in intervals])


def _pooled_over_cells(s: between.Spread, family: between.Family) -> tuple[float, float]:
    """The rejected variant: the shared effect's variance counted with the family's degrees of freedom."""
    own = family.prior
    residual = [y - s.mean - family.effects[k] for y, k in zip(s.logs, s.launch_ids)]
    own_sq = sum(r * r for r in residual) / (s.launches - 1) / (family.d / (s.launches - 1))
    post = (own.d0 * own.s0_sq + family.d * own_sq) / (own.d0 + family.d)
    half = stats.t_quantile(0.975, own.d0 + family.d) * math.sqrt((family.shared_sq + max(post, s.w_bar))
                                                                  / s.launches)
    return math.exp(s.mean - half), math.exp(s.mean + half)


def launch_effects(n_launches: int, sigma: float, spread: float, families: int, rng) -> None:
    truth = syn.cell_median()
    hits = {"combined": 0, "one launch's": 0, "shared pooled over cells": 0}
    widths, cells = [], 0
    for _ in range(families):
        data = syn.launches(rng, 16, n_launches, 20, sigma, spread)
        spreads = [_spread(cell) for cell in data]
        family = between.fit_family(spreads)
        for cell, s in zip(data, spreads):
            c = between.combine(s, family)
            pooled = stats.median_ci(cell.ravel())
            for name, (low, high) in (("combined", (c.low, c.high)), ("one launch's", pooled),
                                      ("shared pooled over cells", _pooled_over_cells(s, family))):
                hits[name] += low <= truth <= high
            widths.append((c.high - c.low) / 2 / c.center * 100)
            cells += 1
    print(f"{n_launches} launches, launch effect σ {sigma:.0%} (spread over cells {spread:g}): coverage "
          + ", ".join(f"{k} {v / cells:.1%}" for k, v in hits.items())
          + f"; median half-width {np.median(widths):.1f} % ({cells} cells)")


def a_a_runs(n_launches: int, sigma: float, pairs: int, rng) -> None:
    raw = holm_false = 0
    runs_clean = 0
    for _ in range(pairs):
        sides = []
        for _ in range(2):
            spreads = [_spread(cell) for cell in syn.launches(rng, 16, n_launches, 20, sigma)]
            family = between.fit_family(spreads)
            sides.append([between.combine(s, family) for s in spreads])
        p_values, called = [], 0
        for a, b in zip(*sides):
            down = math.hypot(math.log(a.center / a.low), math.log(b.high / b.center))
            up = math.hypot(math.log(a.high / a.center), math.log(b.center / b.low))
            r = a.center / b.center
            called += stats.verdict(r * math.exp(-down), r * math.exp(up)) != "within noise"
            se = (down + up) / (2 * stats.Z95)
            p_values.append(2 * (1 - statistics.NormalDist().cdf(abs(math.log(r)) / se)))
        kept = sum(bool(x) for x in stats.holm(p_values))
        raw, holm_false, runs_clean = raw + called, holm_false + kept, runs_clean + (kept == 0)
    print(f"A/A pairs of runs, {n_launches} launches, σ {sigma:.0%}: cells called faster or slower "
          f"{raw / (16 * pairs):.1%} each alone, {holm_false / (16 * pairs):.1%} after Holm; pairs with none "
          f"after Holm {runs_clean / pairs:.0%} ({pairs} pairs of 16 cells)")


def main() -> None:
    median = syn.cell_median()
    print(f"true median of a cell at scale 1: {median:.4f}")
    fixed_rounds("percentile", percentile_median_ci, (5, 10, 20, 60), 1000, median)
    fixed_rounds("order-statistic", stats.median_ci, (6, 10, 20, 60), 2000, median)
    rng = np.random.default_rng(1)
    for target in (2.0, 5.0):
        for minimum in (10, 20):
            adaptive(target, minimum, 1000, median, rng)
    rng = np.random.default_rng(2)
    for n_launches, sigma, spread in ((2, 0.05, 0.0), (3, 0.05, 0.0), (2, 0.05, 0.7), (3, 0.10, 1.0),
                                      (3, 0.0, 0.0)):
        launch_effects(n_launches, sigma, spread, 200, rng)
    for n_launches in (2, 3):
        a_a_runs(n_launches, 0.05, 200, rng)


if __name__ == "__main__":
    main()
