"""A grid group's rounds on every rank after its warm-up: the timed rounds (`adaptive_rounds`: a fixed count,
or until the stopping rule or the time `Budget` says stop; a race's are bench/worker/racing.py's) and the
compute-only rounds (`compute_only_rounds`: the same batches without the gradient sync, whose difference
to the timed step is exposed communication).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from bench import metrics, stats
from bench.config import BenchConfig
from bench.worker import measure
from bench.worker.guard import Guard
from bench.worker.measure import TimedRounds
from bench.worker.trainer import Trainer
from bench.worker.warmup import warmup_found


class Budget:
    """The seconds of timed rounds groups may spend: each its own share (matrix.group_budget_s: max_group_s
    per plain group's worth of cells), and what a group leaves unspent (it reached its target early) goes to
    the groups after it — in its launch, and through the launcher (`carried_s` in the plan) to the next
    launch — so quiet groups hand their time to noisy ones and the run's timed rounds stay within the sum of
    the shares. Rank 0's clock decides (adaptive_rounds), so only rank 0's figures matter."""

    def __init__(self, carried_s: float = 0.0):
        self.carried_s = carried_s

    def allowance_s(self, share_s: float) -> float:
        """A group's budget: its own share and what the groups before it left."""
        return share_s + self.carried_s

    def spend(self, allowance_s: float, used_s: float) -> None:
        """A group given `allowance_s` used `used_s`: the rest goes to the next group."""
        self.carried_s = max(0.0, allowance_s - used_s)



def adaptive_rounds(steps: list, config: BenchConfig, device: torch.device, reference: int | None,
                    progress=lambda phase: None, warmup: list[list[float]] | None = None,
                    budget_s: float | None = None) -> TimedRounds:
    """Collective. The group's timed rounds (TimedRounds: per engine, per rank, its step times; why they
    stopped).

    run.repeats windows of run.timed_steps rounds first; then, with run.target_ci_pct on, more rounds up to
    each pre-set checkpoint (stats.checkpoints: doubling up to run.max_timed_steps) until stats.stop_reason
    says stop; a "budget" stop first runs the rounds that still fit in `budget_s` (default run.max_group_s;
    stats.budget_fill). The intervals looked at are those of the rounds after the warm-up that
    `warmup_found` finds in `warmup` (per engine, its warm-up steps) and the rounds so far. Rank 0 decides
    (the budget reads its clock) and broadcasts, so every rank stops at the same round and the collectives
    of the rounds pair up. stopped_by is None with adaptivity off; then, when the test finds the warm-up
    reaching into the rounds, as many rounds again are run (until the count stands, at most
    config.run.most_timed_steps in all), so that the fixed count of steady rounds is what gets measured.
    """
    r = config.run
    budget_s = r.max_group_s if budget_s is None else budget_s
    warmup = warmup or [[] for _ in steps]
    per_rank: list[list[list[float]]] = [[[] for _ in range(dist.get_world_size())] for _ in steps]

    def run(n):
        for e, ranks in enumerate(measure.timed_rounds(steps, n, device)):
            for k, times in enumerate(ranks):
                per_rank[e][k] += times

    t0 = time.perf_counter()
    for _ in range(r.repeats):
        run(r.timed_steps)
    if not r.adaptive:  # every rank has every rank's times: each finds the same warm-up, runs the same count
        # the warm-up test reads the whole series, so the rounds run to replace the ones it left out can
        # move its end further: replace until the count stands, at most r.most_timed_steps rounds in all
        extra, room = 0, r.most_timed_steps - r.min_timed_steps
        while (short := min(warmup_found(warmup, per_rank)[1], room) - extra) > 0:
            run(short)
            extra += short
        return TimedRounds(per_rank, None)
    points = stats.checkpoints(r.min_timed_steps, r.max_timed_steps)
    for i, done in enumerate(points):
        decision = [None, 0]  # why stop (None: go on), and the rounds to fill the budget with
        if dist.get_rank() == 0:
            with measure.ANALYSIS:
                first = warmup_found(warmup, per_rank)[1]
                samples = [metrics.step_times_over_ranks(ranks)[first:] for ranks in per_rank]
                worst = stats.group_half_width_pct(samples, reference)
                upcoming = points[i + 1] if i + 1 < len(points) else done
                elapsed = time.perf_counter() - t0
                why = stats.stop_reason(worst, r.target_ci_pct, done, r.max_timed_steps, elapsed, upcoming,
                                        budget_s)
                fill = stats.budget_fill(done, elapsed, budget_s, r.max_timed_steps)
                decision = [why, fill if why == "budget" else 0]
        dist.broadcast_object_list(decision, src=0)
        if decision[0] is not None:
            if decision[1]:
                progress(f"timed ({done + decision[1]} rounds)")
                run(decision[1])
            return TimedRounds(per_rank, decision[0])
        progress(f"timed ({points[i + 1]} rounds)")
        run(points[i + 1] - done)
    raise AssertionError("unreachable: the last checkpoint is max_timed_steps, where stop_reason stops")



def compute_only_rounds(trainers: list[Trainer], timed_steps: dict[str, list], n: int,
                        guard: Guard) -> dict[str, list[list[float]]]:
    """Collective. n rounds of steps in the engine's compute_only() (no gradient communication), the
    trainers side by side, each replaying its own timed window's batches (timed_steps[cell id]): with
    variable-length data (MRPC-like) other batches have other padded widths, so their compute would differ
    and exposed communication could go negative. Returns per cell id its step times per rank and round
    (ranks × rounds; nothing to wait for, so each rank's time is its own compute: the straggler's
    evidence); empty lists when n is 0. A step that raises fails its cell (`guard`; the ranks agree on it
    before this returns)."""
    if not n or not trainers:
        return {t.cell.cell_id: [] for t in trainers}
    for trainer in trainers:
        timed = timed_steps[trainer.cell.cell_id]
        trainer.schedule[trainer.cursor:trainer.cursor + n] = [timed[i % len(timed)] for i in range(n)]

    def without_sync(trainer):
        def step():
            with guard.cell(trainer.cell.cell_id) as live:
                if live:
                    with trainer.engine.compute_only(trainer.model):
                        trainer.step()
        return step

    rounds = measure.timed_rounds([without_sync(t) for t in trainers], n, trainers[0].device)
    guard.agree()
    return dict(zip((t.cell.cell_id for t in trainers), rounds))

