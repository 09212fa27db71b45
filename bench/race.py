"""Racing search (`bench run --search race`; docs/design.md "Racing"): which configurations of a recipe
are eliminated, and when. Pure Python + numpy, used by the ranks (bench/worker/racing.py), the launcher
(configurations not launched at larger world sizes) and the --dry-run estimate.

A **recipe** is one model's global batch per optimizer step at one world size (results.csv
`global_batch`, what `bench advise` ranks); its **candidates** are the cells that reach it in different
ways: engine and engine options, bucket size, precision, comm dtype, and accumulation with the per-rank
batch that goes with it. Their step times are times per optimizer step of the same samples, so the
shorter step is the higher throughput.

**The rule at a look.** The looks are pre-set (`looks`): the first where an elimination first becomes
possible, then the adaptive rounds' checkpoints. At each, every survivor c stands for the hypothesis
H_c "no other configuration is faster than c" (c is a best one), tested one-sided against every other:
- paired, against each survivor it stepped beside in the same rounds: the sign test over their shared
  rounds (`stats.sign_test_greater_p` of step_c / step_b), the dual of the paired ratio's order-statistic
  interval that speed_vs_torch uses. A slowdown of the machine shared by a round lands on both and cancels;
- unpaired, against each configuration of the recipe that finished in an earlier group of this launch (a
  recipe that did not fit in one group, bench/worker/groups.py): the two medians' one-sided
  order-statistic bounds must separate (`separation_p`), so drift between the groups is not cancelled,
  only outlasted.
H_c's p-value combines those tests by **Simes' rule** (`simes`: any of the others could be the one that
looks faster by chance; a candidate slower than many of them pays a smaller correction than Bonferroni's,
one slower than a single other the same); **Holm's step-down** over the survivors' hypotheses at the
look's share of RACE_ALPHA; the shares of the looks add up to RACE_ALPHA (Bonferroni over the looks: a
group-sequential test with pre-set looks). So the chance that a race eliminates any configuration that no
other is faster than, at any look, is at most RACE_ALPHA per recipe and world size, whichever
configuration looked best (no reference is picked from the rounds being tested, as comparing with the
observed best would: that selection gave 7-14 % of races of equals a false elimination,
docs/measurement.md). An eliminated cell's row keeps its rounds so far and the comparison (`Elimination`).
No elimination happens on fewer rounds than give an interval at the corrected level (more rounds than
stats.MIN_SAMPLES).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np

from bench import stats

# The chance, per recipe and world size, that the race eliminates a configuration that no other is truly
# faster than (the family-wise error of all its eliminations, every look together): the project's 5 %
# (stats.CONFIDENCE).
RACE_ALPHA = 1 - stats.CONFIDENCE
# The share of RACE_ALPHA spent at the race's first look: every candidate is still stepping there, so an
# elimination saves the most; the later looks (checkpoints) share the rest. Half: the first look needs at
# most one round more than with all of it (log2(2) = 1), and the later looks keep enough to eliminate the
# close ones with the rounds they have.
FIRST_LOOK_SHARE = 0.5


def recipe(cell) -> tuple:
    """The race a cell (a matrix.Cell or a results row) belongs to: model, model size, world size and
    global batch per optimizer step."""
    get = cell.get if isinstance(cell, dict) else lambda k: getattr(cell, k)
    return (get("model"), get("model_size"), int(get("world_size")), int(get("global_batch")))


@dataclass(frozen=True)
class Elimination:
    """Why a candidate left the race: the configuration it was found slower than (its smallest test), its
    step over that one's (median over shared rounds, or the ratio of medians unpaired) with the interval at
    the level that test met, its hypothesis's p-value (`simes`), Holm's level it met, and the rounds run
    when it happened."""

    against: str
    slowdown: float
    slowdown_low: float | None
    slowdown_high: float | None
    p: float
    level: float
    round: int
    paired: bool

    def columns(self) -> dict:
        """The row's race_* columns (bench/schema.py)."""
        return {f"race_{k}": v for k, v in asdict(self).items()}

    def sentence(self) -> str:
        """The raced_out row's `error`: what eliminated it, in words."""
        interval = ("" if self.slowdown_low is None or self.slowdown_high is None
                    else f" [{self.slowdown_low:.3f}, {self.slowdown_high:.3f}]")
        how = "side by side" if self.paired else "unpaired, an earlier group"
        return (f"raced out after {self.round} rounds: step {self.slowdown:.3f}×{interval} that of "
                f"{self.against} ({how}; one-sided p {self.p:.2g} <= Holm's {self.level:.2g})")


def looks(minimum: int, maximum: int, candidates: int, alpha: float = RACE_ALPHA) -> list[tuple[int, float]]:
    """The race's pre-set looks, (rounds, the share of `alpha` the look spends), fixed before any round from
    the round limits (run.timed_steps × repeats, the adaptive cap) and the number of candidates alone.

    The first look spends FIRST_LOOK_SHARE of alpha and comes where a candidate beaten in every round by
    one other can be eliminated (`first_look_rounds`), before `minimum` if that is enough (the minimum is
    the survivors' floor, not a candidate's: an elimination needs only its corrected test); the later looks
    are the adaptive rounds' checkpoints beyond it (stats.checkpoints: `minimum`, doubling up to
    `maximum`), sharing the rest equally. Without a checkpoint after it (fixed rounds, maximum =
    minimum), one look at `maximum` spends all of alpha. Empty when no look can eliminate (one candidate;
    too few rounds)."""
    if candidates < 2:
        return []
    checkpoints = stats.checkpoints(minimum, maximum)
    first = first_look_rounds(candidates, alpha * FIRST_LOOK_SHARE)
    later = [n for n in checkpoints if n > first]
    if first <= maximum and later:
        rest = alpha * (1 - FIRST_LOOK_SHARE) / len(later)
        return [(first, alpha * FIRST_LOOK_SHARE)] + [(n, rest) for n in later]
    # no checkpoint after the first possible look (fixed rounds): one look at the end, all of alpha
    return [(maximum, alpha)] if first_look_rounds(candidates, alpha) <= maximum else []


def first_look_rounds(candidates: int, share: float) -> int:
    """Where the race's first look comes, spending `share`: the fewest rounds at which a candidate that lost
    every round to one other (one of its m = candidates − 1 sign tests at 2^-n: Simes' p, as Bonferroni's, m
    2^-n) passes Holm's strictest step over the candidates' hypotheses, share / candidates: ⌈log2(candidates
    m / share)⌉, and never fewer than stats.MIN_SAMPLES (the rounds of a 95 % interval). Simes' rule also
    eliminates there the candidates that lost most rounds to many others. A candidate slower than every
    other in every round could go sooner (⌈log2(candidates / share)⌉), but on real rounds few do, and a
    look that finds nothing spends its α for nothing: on the GRU at world size 2 (docs/measurement.md
    "Racing search"), a look at 11 rounds of 35 candidates eliminated none, and one at 11 of 14 found 1
    (another race's look at 13 had found 8), the budget then ending before the next look. Worked by hand:
    14 candidates at 0.025 → ⌈log2(7280)⌉ = 13; 35 → ⌈log2(47600)⌉ = 16; 4 → ⌈log2(480)⌉ = 9."""
    return max(stats.MIN_SAMPLES, math.ceil(math.log2(max(1, candidates * (candidates - 1)) / share)))


def _miss(n: int, depth: int) -> float:
    """The chance that the depth-th smallest of n samples lies above their median (a lower bound that
    misses): P(Binomial(n, ½) ≤ depth − 1)."""
    return stats.binom_half_cdf(n, depth - 1)


def _bounds(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """One-sided order-statistic bounds of the median, each missing with probability at most `level`."""
    return stats.median_ci(values, alpha=2 * level)


def separation_p(candidate: Sequence[float], reference: Sequence[float]) -> float | None:
    """Unpaired: the p-value of "candidate's median is no larger than reference's" from the medians'
    one-sided order-statistic bounds: the smallest β at which candidate's lower bound (missing with
    probability ≤ β/2) lies above reference's upper bound (≤ β/2): under H0 both must miss for that, so
    P ≤ β. None with fewer than stats.MIN_SAMPLES samples on either side."""
    c, r = np.sort(stats._clean(candidate)), np.sort(stats._clean(reference))
    if len(c) < stats.MIN_SAMPLES or len(r) < stats.MIN_SAMPLES:
        return None
    levels = sorted({2 * _miss(len(c), d) for d in range(1, len(c) // 2 + 1)}
                    | {2 * _miss(len(r), d) for d in range(1, len(r) // 2 + 1)})
    for beta in levels:
        low, _ = _bounds(c, beta / 2)
        _, high = _bounds(r, beta / 2)
        if low is not None and high is not None and low > high:
            return min(1.0, beta)
    return 1.0


def _median(samples: Sequence[float]) -> float:
    return float(np.median(stats._clean(samples)))


def eliminate(survivors: dict[str, Sequence[float]], rounds: int, share: float,
              earlier: dict[str, Sequence[float]] | None = None, combine=None) -> dict[str, Elimination]:
    """The survivors eliminated at this look, by cell id. `survivors`: each one's step times, one per round,
    all stepped in the same `rounds` rounds (paired by index); `earlier`: the step times of the recipe's
    configurations that finished in an earlier group of this launch (unpaired); `share`: this look's α
    (`looks`); `combine`: how a hypothesis's tests make its p-value (default `simes`; `bonferroni`, the rule
    until issue 56, for scripts/race_replay.py's comparison).

    Each survivor c's hypothesis is "no other configuration is faster than c", tested by its one-sided
    tests against every other survivor (paired sign test) and every earlier configuration (unpaired
    separation), combined by `simes` (any of the others could be the one truly faster); Holm's step-down
    over the survivors' combined p-values at `share`. The other of its smallest test is the one it lost to."""
    if share <= 0 or len(survivors) + len(earlier or {}) < 2:
        return {}
    earlier, combine = earlier or {}, combine or simes
    ids = list(survivors)
    paired = _sign_tests([survivors[c] for c in ids])
    others = len(survivors) + len(earlier) - 1  # the comparisons each hypothesis is tested by
    # c → (its p, the share of the level its smallest test met, against whom, paired)
    combined: dict[str, tuple[float, float, str, bool]] = {}
    for i, c in enumerate(ids):
        tests = [(paired[i][j], b, True) for j, b in enumerate(ids) if b != c]
        tests += [(separation_p(survivors[c], earlier[b]), b, False) for b in earlier]
        tests = sorted((t for t in tests if t[0] is not None), key=lambda t: t[0])
        if tests:
            p, fraction = combine([t[0] for t in tests], others)
            combined[c] = (p, fraction, *tests[0][1:])  # the smallest test: the one it lost to
    ranked = sorted(combined, key=lambda c: combined[c][0])
    out: dict[str, Elimination] = {}
    for j, c in enumerate(ranked):
        level = share / (len(ranked) - j)  # Holm's j-th step (0-based)
        p, fraction, against, paired_test = combined[c]
        if p > level:
            break
        out[c] = _elimination(c, against, (p, level, level * fraction), rounds, paired_test, survivors,
                              earlier)
    return out


def simes(ascending: Sequence[float], m: int) -> tuple[float, float]:
    """Simes' combination of one hypothesis's m one-sided tests (the p-values given, `ascending`; a test
    that could not be made counts as p = 1): min over j of m · p_(j) / j, which rejects at level α when
    the j-th smallest p is at most j α / m for some j. It is valid for tests that are positively
    dependent, as a candidate's tests against the others are (each reads its own rounds: a slow round of
    the candidate counts against it in all of them); tests/test_race.py's races of equals check its error
    rate on heavy-tailed rounds. Never above Bonferroni's m · p_(1), and far below it for a candidate slower
    than many others: one that lost every one of n rounds to each of the others has p = 2^-n, where
    Bonferroni's is m 2^-n. Returns (the p-value, j/m at the j attaining it: at a level α the smallest test
    then met α j/m, the level its reported interval is at)."""
    best, fraction = 1.0, 1.0
    for j, p in enumerate(ascending, start=1):
        value = m * p / j
        if value < best:
            best, fraction = value, j / m
    return min(1.0, best), fraction


def bonferroni(ascending: Sequence[float], m: int) -> tuple[float, float]:
    """Bonferroni's combination (the rule until issue 56, kept to compare with): the smallest p times m;
    the smallest test met α / m."""
    return min(1.0, m * ascending[0]), 1 / m


def _sign_tests(samples: list[Sequence[float]]) -> list[list[float | None]]:
    """p[i][j]: stats.sign_test_greater_p(samples[i], samples[j]) for every pair, from one comparison of
    all rounds at once (a look tests every survivor against every other)."""
    lengths = {len(s) for s in samples}
    clean = all(s is not None and math.isfinite(s) and s > 0 for row in samples for s in row)
    if len(lengths) != 1 or not clean or lengths.pop() < stats.MIN_SAMPLES:  # rounds that do not line up
        return [[stats.sign_test_greater_p(a, b) for b in samples] for a in samples]
    x = np.asarray(samples, dtype=np.float64)
    above = (x[:, None, :] > x[None, :, :]).sum(axis=2)
    untied = (x[:, None, :] != x[None, :, :]).sum(axis=2)
    return [[_upper_tail(int(untied[i, j]), int(above[i, j])) for j in range(len(x))] for i in range(len(x))]


@cache
def _upper_tail(n: int, k: int) -> float:
    """P(Binomial(n, ½) ≥ k), as stats.sign_test_greater_p computes it."""
    return stats.binom_half_cdf(n, n - k)


def _elimination(c: str, against: str, tested: tuple[float, float, float], rounds: int, paired: bool,
                 survivors: dict, earlier: dict) -> Elimination:
    """`tested`: (c's combined p-value, Holm's level it met, the level its test against `against` met:
    the interval's)."""
    p, level, own = tested
    if paired:
        slowdown, low, high = stats.paired_ratio(survivors[c], survivors[against], alpha=2 * own)
    else:
        mine, theirs = stats._clean(survivors[c]), stats._clean(earlier[against])
        (c_low, c_high), (r_low, r_high) = _bounds(mine, own / 2), _bounds(theirs, own / 2)
        slowdown = _median(mine) / _median(theirs)
        low = None if c_low is None or r_high is None else c_low / r_high
        high = None if c_high is None or r_low is None else c_high / r_low
    return Elimination(against=against, slowdown=float(slowdown), slowdown_low=low, slowdown_high=high,
                       p=float(p), level=float(level), round=rounds, paired=paired)



# What a world size's race decides for larger ones: the choices it exercises. From two ranks up, the whole
# configuration (everything a user chooses but the world size and the batch: the per-rank and global batch
# follow from the scaling rule, so one configuration meets one recipe per scaling at each world size).
CARRY_KEYS = ("model", "model_size", "engine", "engine_options", "bucket_cap_mb", "precision", "comm_dtype",
              "grad_accum")
# At one rank nothing is communicated, so a race there compares the engines', bucket sizes' and comm
# dtypes' overhead without the communication they exist to hide, and would prune what wins once there is
# some: from world size 1 only the precision and accumulation carry (every engine, bucket and comm dtype of
# them raced out).
CARRY_KEYS_ONE_RANK = ("model", "model_size", "precision", "grad_accum")


def carry_keys(world_size: int) -> tuple[str, ...]:
    """The choices a race at `world_size` decides for larger world sizes."""
    return CARRY_KEYS_ONE_RANK if world_size == 1 else CARRY_KEYS


def not_launched(cell, records: list[dict]) -> dict | None:
    """For `cell` of a `race` search (not race-all-sizes): the raced_out record of a smaller world size at
    which every recorded cell sharing its choices (carry_keys of that size) was raced out, in every recipe
    it ran there (the largest such world size); None when it must be launched. A record of the same
    scaling rule is preferred, as the closest recipe."""
    by_size: dict[int, list[dict]] = {}
    for record in records:
        ws = int(record["world_size"])
        keys = carry_keys(ws)
        if ws < cell.world_size and all(record.get(k) == getattr(cell, k) for k in keys):
            by_size.setdefault(ws, []).append(record)
    for ws in sorted(by_size, reverse=True):
        rows = by_size[ws]
        if all(r["status"] == "raced_out" for r in rows):
            return next((r for r in rows if r.get("scaling") == cell.scaling), rows[0])
    return None


def not_launched_reason(cell, source: dict) -> str:
    """The `error` of a cell not launched because `source` (not_launched) was raced out."""
    what = ("its configuration" if int(source["world_size"]) > 1
            else f"{cell.precision} with accumulation {cell.grad_accum} (every engine and bucket size of it)")
    return (f"not launched at world size {cell.world_size}: {what} was raced out at world size "
            f"{source['world_size']} in every recipe it ran there ({source['cell_id']}: "
            f"{source.get('race_slowdown') or float('nan'):.3f}× the step of {source.get('race_against')}); "
            f"--search race-all-sizes races it at every world size")
