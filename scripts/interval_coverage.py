"""The figures behind bench.stats' choice of interval (docs/design.md, "Uncertainty"): on synthetic step
times with a known median (tests/synthetic_steps.py), the A/A false-verdict rate and the coverage of a
cell's median, for the percentile bootstrap the suite used before and the order-statistic interval it uses
now, then with the adaptive stopping rule. Seeded: the same figures every run. About a minute on one core.

    PYTHONPATH=. python scripts/interval_coverage.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import stats  # noqa: E402
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


def main() -> None:
    median = syn.cell_median()
    print(f"true median of a cell at scale 1: {median:.4f}")
    fixed_rounds("percentile", percentile_median_ci, (5, 10, 20, 60), 1000, median)
    fixed_rounds("order-statistic", stats.median_ci, (6, 10, 20, 60), 2000, median)
    rng = np.random.default_rng(1)
    for target in (2.0, 5.0):
        for minimum in (10, 20):
            adaptive(target, minimum, 1000, median, rng)


if __name__ == "__main__":
    main()
