"""A race's timed rounds on every rank (run.search race; the rule: bench/race.py).

A race group is a recipe's candidates, stepped side by side, round-robin, as an engine group's cells are
(bench/worker/groups.py forms it). At each of the race's pre-set looks (race.looks) rank 0 decides which
candidates are eliminated (race.eliminate: each tested against every other survivor, paired, and every
configuration of the recipe from this launch's earlier groups, unpaired, `RaceBook`) and whether the
survivors stop (the adaptive rule, stats.stop_reason), and broadcasts it; every rank then drops the same
trainers, so the collectives of the next rounds pair up. An eliminated candidate stops stepping at once
(its trainer is released by the caller) and keeps its rounds so far. The survivors go on to
run.target_ci_pct like an adaptive group: their medians and their paired ratios to their torch DDP twins
while both still race. The time budget is what the grid would give the survivors' engine groups
(matrix.group_budget_s each), counted from the first round: past the minimum rounds a race never spends
more on
timed rounds than the grid would on the same cells, and where that budget cannot reach the race's first
look (a loaded machine, slow steps), nothing is eliminated and the group is measured as the grid would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from bench import metrics, race, stats
from bench.config import BenchConfig
from bench.matrix import Cell, group_budget_s
from bench.worker import measure
from bench.worker.groups import engine_groups, torch_twin
from bench.worker.measure import TimedRounds


@dataclass
class RaceBook:
    """What a launch's races know of each other: per recipe, the number of its candidates in the launch
    (which fixes its looks) and the step times of its configurations that finished in an earlier group
    (a recipe too large for one group races them unpaired)."""

    candidates: dict[tuple, int] = field(default_factory=dict)
    finished: dict[tuple, dict[str, list[float]]] = field(default_factory=dict)

    @classmethod
    def of(cls, cells: list[Cell]) -> RaceBook:
        book = cls()
        for cell in cells:
            key = race.recipe(cell)
            book.candidates[key] = book.candidates.get(key, 0) + 1
        return book

    def add(self, cell: Cell, samples: list[float]) -> None:
        """A survivor of a finished group: later groups of its recipe race against it, unpaired."""
        self.finished.setdefault(race.recipe(cell), {})[cell.cell_id] = list(samples)


def twins(cells: list[Cell], alive: list[int]) -> list[tuple[int, int]]:
    """(torch DDP twin, cell) index pairs among `alive` (indices into cells), both still racing: the
    paired ratios the stopping rule reads, as an engine group's speed_vs_torch (groups.torch_twin)."""
    pairs = []
    for i in alive:
        j = torch_twin(cells[i], [cells[a] for a in alive])
        if j is not None:
            pairs.append((alive[j], i))
    return pairs


def race_rounds(steps: list[Callable[[], object]], cells: list[Cell], config: BenchConfig,
                device: torch.device, book: RaceBook,
                on_eliminated: Callable[[int, list[list[float]], race.Elimination], None],
                progress=lambda phase: None, failed: Callable[[], set[int]] | None = None) -> TimedRounds:
    """Collective. The race group's timed rounds: all candidates step until the race's first look (which
    may come before the minimum rounds: race.looks); at each look some are eliminated (`on_eliminated(i,
    its step times per rank, why)` on every rank, in index order, right after the decision: the caller
    records it and releases its trainer) and the rest go on until the adaptive rule stops them, never
    before the minimum rounds (with run.target_ci_pct = 0: exactly the minimum). `failed()` (collective,
    the ranks agreeing: bench/worker/guard.py) names the candidates whose steps raised: they leave the race
    at the look, neither deciding nor decided (their steps since did nothing, and would read as fastest)."""
    r, ws = config.run, dist.get_world_size()
    key = race.recipe(cells[0])
    earlier = book.finished.get(key, {})
    # the race's looks eliminate; the adaptive checkpoints (the minimum first) also look at the stopping
    # rule, so the budget can stop a race whose first look it cannot afford, as it would stop the grid
    looks = dict(race.looks(r.min_timed_steps, r.rounds_cap, book.candidates.get(key, len(cells))))
    points = sorted(set(looks) | set(stats.checkpoints(r.min_timed_steps, r.rounds_cap)))
    shares = [looks.get(n, 0.0) for n in points]
    steps = list(steps)  # an eliminated candidate's entry becomes None: its trainer can be freed
    per_rank: list[list[list[float]]] = [[[] for _ in range(ws)] for _ in steps]
    alive = list(range(len(steps)))
    eliminated: dict[int, race.Elimination] = {}

    def run(n):
        for e, ranks in zip(alive, measure.timed_rounds([steps[e] for e in alive], n, device)):
            for k, times in enumerate(ranks):
                per_rank[e][k] += times

    t0 = time.perf_counter()
    run(points[0])
    for i, done in enumerate(points):
        for e in sorted((failed() if failed else set()) & set(alive)):  # their own error says why
            alive.remove(e)
            steps[e] = None
        if not alive:
            return TimedRounds(per_rank, None, eliminated)
        decision = [{}, None, 0]  # eliminated (index → Elimination's fields), why stop, rounds to fill
        if dist.get_rank() == 0:
            look = Look(done, shares[i], points[i + 1] if i + 1 < len(points) else done,
                        time.perf_counter() - t0)
            with measure.ANALYSIS:
                decision = decide(per_rank, alive, cells, config, look, earlier)
        dist.broadcast_object_list(decision, src=0)
        for e, fields in sorted(decision[0].items()):
            eliminated[e] = race.Elimination(**fields)
            alive.remove(e)
            steps[e] = None
            on_eliminated(e, per_rank[e], eliminated[e])
        progress(f"timed ({done} rounds, {len(alive)} of {len(steps)} racing)")
        why, fill = decision[1], decision[2]
        if not r.adaptive and done >= r.min_timed_steps:  # fixed rounds: they are done
            return TimedRounds(per_rank, None, eliminated)
        if why is not None:
            run(fill)
            return TimedRounds(per_rank, why, eliminated)
        run(points[i + 1] - done)
    raise AssertionError("unreachable: the last look is max_timed_steps, where stop_reason stops")


@dataclass(frozen=True)
class Look:
    """One look of a race, as rank 0 decides at it: the rounds done, the share of the race's error rate
    spent here (race.looks; 0 at a checkpoint that only asks the stopping rule), the round count of the next
    look or checkpoint (`done` at the last), and the seconds since the race's first round."""

    done: int
    share: float
    upcoming: int
    elapsed_s: float


def decide(per_rank: list, alive: list[int], cells: list[Cell], config: BenchConfig, look: Look,
           earlier: dict) -> list:
    """Rank 0 at a look: [eliminated (index → Elimination's fields), why the survivors stop (None: go on;
    always before run.timed_steps × repeats rounds, the survivors' minimum, and with adaptivity off),
    rounds that still fit in their budget after a "budget" stop]."""
    r, done, elapsed_s = config.run, look.done, look.elapsed_s
    samples = {e: metrics.step_times_over_ranks(per_rank[e]) for e in alive}
    out = race.eliminate({cells[e].cell_id: samples[e] for e in alive}, done, look.share, earlier)
    gone = {e: asdict(out[cells[e].cell_id]) for e in alive if cells[e].cell_id in out}
    if not r.adaptive:
        return [gone, None, 0]
    left = [e for e in alive if e not in gone]
    if done < r.min_timed_steps:  # a look before the minimum rounds only eliminates: survivors go on
        return [gone, None, 0]
    local = {e: j for j, e in enumerate(left)}
    worst = stats.widest_half_width_pct([samples[e] for e in left],
                                        [(local[a], local[b]) for a, b in twins(cells, left)])
    # the survivors' pace from here: one step of each per round, at their medians so far
    round_s = sum(float(np.median(samples[e])) for e in left) / 1e3
    budget = sum(group_budget_s(config, len(g)) for g in engine_groups([cells[e] for e in left]))
    why = stats.stop_reason(worst, r.target_ci_pct, done, r.max_timed_steps, elapsed_s, look.upcoming, budget,
                            round_s=round_s)
    fill = stats.budget_fill(done, elapsed_s, budget, r.max_timed_steps, round_s=round_s) \
        if why == "budget" else 0
    return [gone, why, fill]
