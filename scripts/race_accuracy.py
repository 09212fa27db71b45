"""The figures behind the racing search's rule (docs/measurement.md, "Racing"): on synthetic step times
with a known ordering (tests/synthetic_steps.py: heavy-tailed noise, a slowdown shared by each round), run
through the ranks' own decision (bench/worker/racing.py `decide`, as tests/test_race.py does), how often
the race's pick is the best or within 2 % of it, how many candidates it eliminates and when, and how often
a race of equals eliminates anything; beside it, the rule before Simes' (Bonferroni over the others) and
the rule first tried, Holm over the comparisons with the look's observed best. Seeded: the same figures
every run. About a minute on one core.

    PYTHONPATH=. python scripts/race_accuracy.py
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import race, stats  # noqa: E402
from tests.test_race import TIE_MARGIN, candidates, known_order_races, simulate  # noqa: E402

REPS = 500


def against_observed_best(survivors, rounds, share, earlier=None):
    """The rule first tried: every survivor against the look's lowest median, one-sided sign tests, Holm
    over those K − 1 comparisons (the reference is chosen from the same rounds it is tested on)."""
    best = min(survivors, key=lambda c: np.median(survivors[c]))
    tests = sorted((stats.sign_test_greater_p(survivors[c], survivors[best]), c)
                   for c in survivors if c != best)
    out = {}
    for j, (p, c) in enumerate(t for t in tests if t[0] is not None):
        level = share / (len(tests) - j)
        if p > level:
            break
        out[c] = race._elimination(c, best, (p, level, level), rounds, True, survivors, {})
    return out


def trial(k: int, rng) -> None:
    config, cells = candidates(k)
    good, gone = known_order_races(rng, k, REPS)
    clean = sum(len(simulate(rng, [1.0] * k, config, cells)[0]) == k for _ in range(REPS))
    looks = race.looks(config.run.min_timed_steps, config.run.rounds_cap, k)
    print(f"  {k} candidates (first look at {looks[0][0]} rounds): pick within {TIE_MARGIN:.0%} of the best "
          f"{good / REPS:.1%}; eliminated median {np.median(gone):.0f} of the {k - 1} slower ones, {k - 3} "
          f"of them beyond the margin (min {min(gone)}); races of equals with no elimination "
          f"{clean / REPS:.1%}")


def main() -> None:
    rng = np.random.default_rng(2034)
    print(f"default's CPU rounds (min 10, cap 160), {REPS} races each, seeded")
    print("the rule (hypotheses 'no other is faster', Simes over the others, Holm over the survivors):")
    for k in (4, 14, 35):
        trial(k, rng)
    rule, smallest = race.eliminate, race.first_look_rounds
    print("the rule before (the same looks, Bonferroni over the others):")
    race.eliminate = partial(rule, combine=race.bonferroni)
    try:
        for k in (4, 14, 35):
            trial(k, rng)
    finally:
        race.eliminate = rule
    print("the rule first tried (Holm over the comparisons with the look's observed best):")
    race.eliminate = against_observed_best
    race.first_look_rounds = lambda k, share: max(stats.MIN_SAMPLES,
                                                int(np.ceil(np.log2(max(1, k - 1) / share))))
    try:
        for k in (4, 14, 35):
            trial(k, rng)
    finally:
        race.eliminate, race.first_look_rounds = rule, smallest


if __name__ == "__main__":
    main()
