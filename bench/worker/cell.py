"""The order of a cell's phases on every rank, run for a group of cells side by side, and the measured part
of each cell's result row.

A group is the cells of one launch that differ only in engine (bench/worker/groups.py): their trainers are
built together and stepped round-robin, so machine noise lands on all of them alike and each engine's
samples pair up round by round with torch DDP's. A group of one is a cell timed alone.

The phases (GroupRun.PHASES, each a method that reads what the ones before it left and keeps the trainers
still measured): build → warm (compiled cells: until recompilation stops, compile_s) → rounds (timed, side by
side: the grid's or a race's; the warm-up the changepoint test finds left out) → checks (timed values, the
phase pass) → gates (parity: ranks agree; every cell but plain torch DDP hands its optimizer torch DDP's
gradient at the same weights, bench/worker/parity.py)
→ compute_only (rounds without the gradient sync) → probes (exposed
communication, skew, MFU, the all-reduce probe) → memory (the trainers released, then per cell alone: peak
memory of its training steps). A compiled cell that torch refuses to compile in a known way
(KNOWN_COMPILE_REFUSALS) leaves the group in its warm-up and is recorded `skipped` with torch's reason.
Profiled passes run after every timed step of the launch (bench/worker/main.py), never here.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from bench import metrics, schema, stats
from bench.config import BenchConfig
from bench.matrix import MEMORY_STEPS, Cell, group_budget_s
from bench.race import Elimination
from bench.schema import PASSES
from bench.worker import measure, parity, steady
from bench.worker.groups import torch_twin
from bench.worker.guard import Guard, Peers, check_losses, failure
from bench.worker.measure import Stopwatch, TimedRounds
from bench.worker.racing import RaceBook, race_rounds
from bench.worker.trainer import PhaseClock, Trainer, sync_device

DIVERGED = "parameters differ across ranks after the timed steps"
# Warm-up steps a compiled cell may add beyond run.warmup_steps while it still recompiles (a graph
# recompiled for the rebuilt buckets, a guard that failed); every cell of its group takes them too, so
# all step the same batches.
MAX_RECOMPILE_STEPS = 5
# torch.compile failures that say the configuration cannot be compiled (not a bug of the cell): the cell
# is `skipped` with torch's message. DDPOptimizer (torch/_dynamo/backends/distributed.py) splits the
# graph at DDP's buckets and refuses a first bucket larger than the others (seen with torch 2.13 at
# bucket_cap_mb=0.1).
KNOWN_COMPILE_REFUSALS = ("First bucket should be smaller/equal to other buckets",)
# How often a compiling step says it is alive: well inside any watchdog limit (run.cell_timeout_s is at
# least tens of seconds), and rare enough to cost nothing (one events line a minute; a cold inductor
# compile of smollm2-360m can take longer than the 600 s the GPU presets allow a silent cell).
HEARTBEAT_S = 60.0


def steps_needed(config: BenchConfig) -> int:
    """Optimizer steps a trainer may run over the timed phases (the data schedule's length): the adaptive
    rounds' cap, as the rounds they will take are not known in advance, and the warm-up steps a compiled
    cell may add."""
    r = config.run
    return (r.warmup_steps + MAX_RECOMPILE_STEPS + r.most_timed_steps + r.phase_steps
            + r.compute_only_steps)


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


COMPANION = "companion"  # a cell stepped beside its group for the pairing only (its row is another group's)


def run_group(cells: list[Cell], config: BenchConfig, device: torch.device, rank: int, world_size: int,
              progress=lambda phase: None, book: RaceBook | None = None, budget: Budget | None = None,
              passes: frozenset[str] = frozenset(PASSES), companions: frozenset[str] = frozenset(),
              peers: Peers | None = None) -> list[tuple[str, str | None, dict]]:
    """Collective. Every phase of the group's cells (GroupRun.PHASES, in order) → per cell (status, error,
    measured part of the row): "ok" | "diverged" with its row; "raced_out" with its rounds so far and the
    comparison that eliminated it, when a RaceBook makes the group a race (bench/worker/racing.py: only the
    survivors go through the phases after the timed rounds); or — for a cell whose trainer raised, whose
    loss is not finite or that torch refused to compile — its own status and error with nothing measured,
    while the other cells go on (bench/worker/guard.py). `progress(phase)` is called between phases (the
    launcher's watchdog hears it). `budget`: the launch's (default: this group's share alone). `passes`: the
    launch's (bench.schema.PASSES; a repeat launch of run.launches runs REPEAT_PASSES: build, warm-up, timed
    rounds, the parity check and the compute-only rounds, no phase, probe or memory pass). `companions`:
    cells already measured in an earlier group of the launch, stepped here in the warm-up and timed rounds
    only, so that the others are paired with them (groups.paired_chunks); their outcome is (COMPANION, None,
    {}) and nothing of them is recorded. `peers`: how the ranks learn of a failure on some of them only
    (guard.Peers: it then raises GroupBroken out of here on every rank)."""
    group = GroupRun(cells, config, device, rank, world_size, progress, book, budget or Budget(), passes,
                     companions, Guard(peers))
    for phase in GroupRun.PHASES:
        entering, t0, analysed = group.entering(phase), time.perf_counter(), measure.ANALYSIS.seconds
        phase(group)
        group.charge(phase.__name__, entering, time.perf_counter() - t0, measure.ANALYSIS.seconds - analysed)
        if not group.trainers:  # every cell failed, or a race eliminated every one
            break
    return group.outcomes()


class GroupRun:
    """One group's measurement on this rank, phase by phase. Each phase reads what the ones before it left
    here and leaves `trainers`: those still measured (a phase that leaves none ends the group). Every phase
    is collective: the ranks run the same phases over the same trainers (the guard agrees on failures)."""

    def __init__(self, cells: list[Cell], config: BenchConfig, device: torch.device, rank: int,
                 world_size: int, progress, book: RaceBook | None, budget: Budget, passes: frozenset[str],
                 companions: frozenset[str], guard: Guard):
        self.cells, self.config, self.device = cells, config, device
        self.rank, self.world_size = rank, world_size
        self.progress, self.book, self.budget, self.passes = progress, book, budget, passes
        self.companions, self.guard = companions, guard
        self.clock = Stopwatch()  # the group's stepping, shared over its cells as steps_wall_s
        self.trainers: list[Trainer] = []
        self.raced_out: dict[str, tuple[str, str | None, dict]] = {}  # cell id → its outcome, raced out
        self.raced_cells: dict[str, Cell] = {}
        self.paired: list[tuple[Cell, dict]] = []  # companions' timed values: the others pair with them
        self.side_by_side, self.stopped_by = 1, None
        self.rows: dict[str, dict] = {}  # cell id → its measured row so far
        self.measured: list[Cell] = []  # the cells every phase measured (the memory phase's survivors)
        self.spent: dict[str, dict[str, float]] = {c.cell_id: {} for c in cells}  # cell id → its anatomy

    # each phase's part of the cost anatomy (schema.ANATOMY_PARTS PARTS)
    PART = {"build": "build", "warm": "warmup", "rounds": "timed", "checks": "phase", "gates": "gate",
            "compute_only": "compute_only", "probes": "probe", "memory": "memory"}

    def entering(self, phase) -> list[str]:
        """The cells `phase` (about to run) is run for: every cell for the build, then those measured."""
        if phase.__name__ == "build":
            return [c.cell_id for c in self.cells]
        return [t.cell.cell_id for t in self.trainers if t is not None]

    def charge(self, phase: str, ids: list[str], seconds: float, analysis_s: float = 0.0) -> None:
        """A phase's seconds shared among the cells that entered it (schema.anatomy_share): the warm-up in
        proportion to each cell's own warm-up steps' time and compile, the timed rounds to its own steps'
        time (a candidate raced out at round 16 of a race whose survivors ran 40 pays for its 16), the
        others evenly; the statistics between the rounds as `analysis`."""
        part = self.PART[phase]
        weights = None
        if part == "warmup" and getattr(self, "warm_times", None):
            weights = [sum(self.warm_times.get(i) or []) / 1e3 + (self.compile_s.get(i) or 0.0) for i in ids]
        elif part == "timed" and getattr(self, "timed", None):
            weights = [sum(metrics.step_times_over_ranks(self.timed[i])) if self.timed.get(i) else 0.0
                       for i in ids]
        for cell_id, s in schema.anatomy_share(seconds - analysis_s, ids, weights).items():
            schema.anatomy_add(self.spent.setdefault(cell_id, {}), part, s)
        for cell_id, s in schema.anatomy_share(analysis_s, ids, weights).items():
            if s:
                schema.anatomy_add(self.spent[cell_id], "analysis", s)

    def build(self) -> None:
        """A trainer per cell, every one over the same data schedule's length."""
        n = steps_needed(self.config)
        _, built = self.guard.each(self.cells, lambda c: Trainer(c, self.config, self.device, self.rank,
                                                                  self.world_size, n), cell_of=lambda c: c)
        self.trainers = list(built.values())

    def warm(self) -> None:
        """run.warmup_steps rounds (compiled cells: until recompiling stops); the losses checked."""
        with self.clock:
            self.compile_s, self.warm_times = warm_up(self.trainers, self.config.run.warmup_steps,
                                                      self.device, self.guard, self.progress)
            sync_device(self.device)
        self.keep_finite()

    def rounds(self) -> None:
        """The timed rounds, side by side: the grid's fixed or adaptive count, or a race's (which eliminates
        candidates as it goes); then the warm-up the changepoint test finds in them is left out, and the
        companions and raced-out cells leave."""
        r = self.config.run
        self.progress("timed")
        self.first_timed = self.trainers[0].cursor  # every trainer has stepped as often: a common warm-up
        self.trainers, self.skipped_before = self.guard.each(self.trainers, skipped_steps)  # syncs, untimed
        allowance = self.budget.allowance_s(group_budget_s(self.config, len(self.trainers)))
        timed_clock = Stopwatch()
        with self.clock, timed_clock:
            rounds, order = self.grid_rounds(allowance) if self.book is None else self.raced_rounds()
        self.stopped_by = rounds.stopped_by
        if r.adaptive:  # a fixed count spends no budget, and so leaves none
            self.budget.spend(allowance, timed_clock.seconds)
        self.side_by_side = len(rounds.per_rank)  # stepped round-robin in the timed rounds (a race's too)
        with measure.ANALYSIS:
            found, self.first = warmup_found([self.warm_times[c.cell_id] for c in order], rounds.per_rank)
        self.found = {c.cell_id: end for c, end in zip(order, found)}
        if self.book is not None:  # a race's looks compared every round: its eliminated cells' rows keep them
            self.first = 0
        self.timed = {c.cell_id: ranks for c, ranks in zip(order, rounds.per_rank)}
        # a companion's rounds pair the others with it (add_speed_vs_torch); then it leaves, as one raced out
        self.paired = [(t.cell, timed_values([x[self.first:] for x in self.timed[t.cell.cell_id]],
                                             t.cell.global_batch))
                       for t in self.trainers if t is not None and t.cell.cell_id in self.companions]
        self.trainers = [t for t in self.trainers if t is not None and t.cell.cell_id not in self.raced_out
                         and t.cell.cell_id not in self.companions]
        self.keep_finite()
        # each trainer's own timed batches (a race's candidates differ in per-rank batch and accumulation)
        self.timed_steps = {t.cell.cell_id: t.schedule[self.first_timed:t.cursor] for t in self.trainers}

    def grid_rounds(self, allowance: float) -> tuple[TimedRounds, list[Cell]]:
        """Every trainer to the end (adaptive_rounds), paired with the torch DDP cell when there is one."""
        reference = next((i for i, t in enumerate(self.trainers) if t.cell.is_baseline), None)
        warm = [self.warm_times[t.cell.cell_id] for t in self.trainers]
        rounds = adaptive_rounds([self.guard.step(t) for t in self.trainers], self.config, self.device,
                                 reference, self.progress, warm, allowance)
        return rounds, [t.cell for t in self.trainers]

    def raced_rounds(self) -> tuple[TimedRounds, list[Cell]]:
        """A race (bench/worker/racing.py): an eliminated candidate's row is made at the look that decided
        it, on every rank in the same order, and its trainer goes (its slot in `trainers` becomes None)."""
        racing = [t.cell for t in self.trainers]

        def eliminate(i: int, ranks: list[list[float]], why: Elimination) -> None:
            self.raced_out[racing[i].cell_id] = raced_out_outcome(self.trainers[i], ranks, why,
                                                                  self.compile_s, len(racing) > 1)
            self.raced_cells[racing[i].cell_id] = racing[i]
            self.trainers[i] = None
            release(self.device)

        def failed() -> set[int]:  # collective: the candidates whose steps raised, on any rank
            agreed = self.guard.agree()
            return {i for i, c in enumerate(racing) if c.cell_id in agreed}

        rounds = race_rounds([self.guard.step(t) for t in self.trainers], racing, self.config, self.device,
                             self.book, eliminate, self.progress, failed)
        return rounds, racing

    def checks(self) -> None:
        """Per cell: its timed values, warm-up and outlier columns, the phase pass, loss, compile time,
        precision flags and the engine's state per rank."""
        self.progress("checks")
        r, passes = self.config.run, self.passes

        def checks(trainer: Trainer) -> dict:
            ranks, cell_id = self.timed[trainer.cell.cell_id], trainer.cell.cell_id
            with self.clock:
                phases = [phase_pass(trainer) for _ in range(r.phase_steps if "phase" in passes else 0)]
            return (timed_values([times[self.first:] for times in ranks], trainer.cell.global_batch)
                    | warmup_values(self.warm_times[cell_id], ranks, self.first, self.found[cell_id])
                    | phase_values(phases) | {
                "final_loss": measure.mean_over_ranks(float(trainer.last_loss.float()), self.device),
                "compile_s": self.compile_s.get(cell_id)} | trainer.precision.flags
                | trainer.engine.state_bytes_per_rank(trainer.param_bytes, self.world_size, trainer.cell))

        self.trainers, self.rows = self.guard.each(self.trainers, checks)
        self.keep_finite()  # apart: no collective after it

    def gates(self) -> None:
        """The parity gates: parameters identical over ranks; every cell but plain torch DDP hands its
        optimizer torch DDP's gradient at the same weights and batch (bench/worker/parity.py). The gate
        loads its weights into the trainers: nothing after it reads their values."""
        references = parity.References(self.trainers, self.config, self.rank, self.world_size)

        def gates(trainer: Trainer) -> dict:
            out = {"identical": measure.params_identical(trainer.engine.full_parameters(trainer.model),
                                                         self.device)}
            if parity.needs_gate(trainer.cell):
                with self.clock:
                    out |= parity.gate(trainer, references)
            return out

        self.trainers, self.gated = self.guard.each(self.trainers, gates)
        references.release()  # the references go before the compute-only rounds
        release(self.device)

    def compute_only(self) -> None:
        """Every launch, repeats too: a merged row's step, compute-only and exposed communication then come
        from the same launches (bench/run/merge.py). No gradient sync from here on: ranks' parameters drift
        apart, which the gates above saw."""
        self.progress("compute-only")
        with self.clock:
            self.compute_only_ms = compute_only_rounds(self.trainers, self.timed_steps,
                                                       self.config.run.compute_only_steps, self.guard)

    def probes(self) -> None:
        """Per cell: exposed communication and rank skew, work and MFU, the all-reduce probe, the buckets the
        engine used (what `bench project` reads) and fp16's scale and skipped steps."""
        probe_iters = self.config.run.probe_iters if "probe" in self.passes else 0

        def probes(trainer: Trainer) -> dict:
            row, cell_id = self.rows[trainer.cell.cell_id], trainer.cell.cell_id
            tokens, flops = measure.work_per_step(trainer, self.timed_steps[cell_id])
            before, now = self.skipped_before[cell_id], skipped_steps(trainer)
            ranks = self.compute_only_ms[cell_id]  # ranks × rounds: each rank's own work, for the skew
            return (self.gated[cell_id]
                    | exposed_values(row["step_times_ms"], metrics.step_times_over_ranks(ranks))
                    | skew_values(ranks) | {"compute_only_ms_per_rank": ranks}
                    | work_values(trainer, row, tokens, flops)
                    | probe_values(measure.allreduce_probe(trainer, probe_iters), self.world_size)
                    | {"bucket_sizes_bytes": trainer.engine.bucket_sizes_bytes(trainer.model,
                                                                                trainer.cell.wrap_bucket_mb),
                       "loss_scale": trainer.precision.loss_scale(), "skipped_steps": now,
                       "skipped_timed_steps": None if before is None else now - before})

        self.trainers, probed = self.guard.each(self.trainers, probes)
        for cell_id, values in probed.items():
            self.rows[cell_id] |= values

    def memory(self) -> None:
        """The trainers go, then each cell alone: the peak memory of its training steps."""
        measured = [t.cell for t in self.trainers]
        self.trainers = []
        release(self.device)
        self.progress("memory")
        measured, memory = self.guard.each(
            measured, lambda c: {} if "memory" not in self.passes else
            solo_peak_memory(c, self.config, self.device, self.rank, self.world_size), cell_of=lambda c: c)
        self.measured = measured
        for cell in measured:
            self.rows[cell.cell_id] |= memory[cell.cell_id]

    PHASES = (build, warm, rounds, checks, gates, compute_only, probes, memory)

    def keep_finite(self) -> None:
        """Collective: the trainers whose losses are finite on every rank stay."""
        self.trainers, _ = self.guard.each(self.trainers, lambda t: check_losses(t.losses))

    def outcomes(self) -> list[tuple[str, str | None, dict]]:
        """Per cell: its measured row (after the last phase), its race's elimination, COMPANION, or its
        failure. The survivors of a race join its book: later groups of their recipe race them, unpaired."""
        measured = self.measured
        wall = {"steps_wall_s": self.clock.seconds / self.side_by_side}
        rows = [self.rows[c.cell_id] | wall | {"interleaved": self.side_by_side > 1,
                                               "stopped_by": self.stopped_by} for c in measured]
        add_speed_vs_torch(measured, rows, [(self.raced_cells[i], row) for i, (_, _, row) in
                                            self.raced_out.items()] + self.paired)
        outcomes = {c.cell_id: outcome(row, c) for row, c in zip(rows, measured)}
        if self.book is not None:
            for cell, row in zip(measured, rows):
                if outcomes[cell.cell_id][0] == "ok":
                    self.book.add(cell, row["step_times_ms"])
        for row, c in zip(rows, measured):
            row["anatomy_s"] = dict(self.spent[c.cell_id])
        for cell_id, (_, _, row) in self.raced_out.items():
            row |= wall | {"anatomy_s": dict(self.spent[cell_id])}
        outcomes |= self.raced_out | {cell_id: (COMPANION, None, {}) for cell_id in self.companions
                                      if cell_id not in self.guard.failed}
        return [outcomes.get(c.cell_id) or self.guard.outcome(c.cell_id) for c in self.cells]


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


def raced_out_outcome(trainer: Trainer, per_rank: list[list[float]], why: Elimination,
                      compile_s: dict, interleaved: bool) -> tuple[str, str | None, dict]:
    """Collective. An eliminated candidate's outcome: status raced_out (diverged if its ranks' parameters
    already differ), its timed rounds so far and the comparison that eliminated it."""
    row = timed_values(per_rank, trainer.cell.global_batch) | why.columns() | {
        "compile_s": compile_s.get(trainer.cell.cell_id), "interleaved": interleaved,
        **trainer.precision.flags,
        **trainer.engine.state_bytes_per_rank(trainer.param_bytes, trainer.cell.world_size, trainer.cell)}
    if not measure.params_identical(trainer.engine.full_parameters(trainer.model), trainer.device):
        return "diverged", DIVERGED, row
    return "raced_out", why.sentence(), row


def outcome(row: dict, cell: Cell) -> tuple[str, str | None, dict]:
    identical, failure = row.pop("identical"), row.pop("parity_failure", None)
    if not identical:
        return "diverged", DIVERGED, row
    if failure:
        return "diverged", failure, row
    return "ok", None, row


@contextmanager
def heartbeat(progress, what: str):
    """While the block runs, `progress(f"{what} (N s)")` every HEARTBEAT_S from a thread: a compile runs
    inside one step, and the launcher's watchdog (run.cell_timeout_s) hears nothing else meanwhile."""
    done = threading.Event()
    t0 = time.perf_counter()

    def beat():
        while not done.wait(HEARTBEAT_S):
            progress(f"{what} ({time.perf_counter() - t0:.0f} s)")

    thread = threading.Thread(target=beat, name="bench-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def warm_up(trainers: list[Trainer], n: int, device: torch.device, guard: Guard,
            progress=lambda phase: None) -> tuple[dict, dict[str, list[float]]]:
    """Collective. n rounds of every trainer's step, then more (at most MAX_RECOMPILE_STEPS) while a
    compiled trainer still compiled in the last round. Returns per compiled cell the seconds of its
    warm-up steps that compiled (compile_s): 0 when every graph it runs was compiled earlier in the
    process for an identical model (dynamo guards on code, shapes and dtypes, not on the module object, so
    a second trainer of the same model reuses the first one's graphs); and per cell id its warm-up steps'
    times, each timed as a timed round's step (measure.StepTimer) and the slowest rank's: the start of the
    series the warm-up test reads (`warmup_found`). A step that raises fails its cell
    (`guard`: the others step on); a compiled cell torch refuses (KNOWN_COMPILE_REFUSALS) is `skipped`
    with torch's reason. The ranks agree on both after every round."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    compile_s: dict[str, float] = {}
    compiled = [t for t in trainers if t.cell.compile not in (None, "none")]
    timers = {t.cell.cell_id: measure.StepTimer(device) for t in trainers}
    for round_ in range(n + MAX_RECOMPILE_STEPS):
        recompiled = False
        for trainer in trainers:
            cell = trainer.cell
            if cell.cell_id in guard.local:  # failed here, or on a rank that said so at the last agree
                continue
            if trainer not in compiled:
                timers[cell.cell_id].time(guard.step(trainer))
                continue
            graphs, t0 = counters["stats"]["unique_graphs"], time.perf_counter()
            try:
                with heartbeat(progress, f"compiling {cell.cell_id}"):
                    timers[cell.cell_id].time(trainer.step)
            except Exception as e:  # noqa: BLE001 - a known refusal is a skip; any other failure the cell's
                if not any(text in str(e) for text in KNOWN_COMPILE_REFUSALS):
                    guard.step_failed(cell.cell_id, *failure(e, cell.cell_id))
                    continue
                guard.fail(cell.cell_id, "skipped", f"compile={cell.compile}: {type(e).__name__}: " + next(
                    line for line in str(e).splitlines() if any(t in line for t in KNOWN_COMPILE_REFUSALS)))
                # dynamo remembers the failed frame (DDP's forward) and would run it eagerly for every
                # later cell of this process: start afresh (the group's other compiled cells recompile)
                torch._dynamo.reset()
                recompiled = True
                continue
            sync_device(device)
            if counters["stats"]["unique_graphs"] != graphs:
                compile_s[cell.cell_id] = compile_s.get(cell.cell_id, 0.0) + time.perf_counter() - t0
                recompiled = True
        guard.agree()
        if round_ + 1 >= n and not measure.max_over_ranks(float(recompiled), device):
            break
    for trainer in compiled:  # compiled, but every graph it runs was compiled before in this process
        if trainer.cell.cell_id not in guard.failed:
            compile_s.setdefault(trainer.cell.cell_id, 0.0)
    gathered = measure.gather_times(list(timers.values()))
    return compile_s, {cell_id: metrics.step_times_over_ranks(ranks)
                       for cell_id, ranks in zip(timers, gathered)}


def warmup_found(warm: list[list[float]], per_rank: list[list[list[float]]]) -> tuple[list[int], int]:
    """Where each engine's warm-up ends, found by the changepoint test (bench.worker.steady.warmup_end) on its
    series: its warm-up steps, then its timed rounds (the slowest rank's). Returns (per engine the steps
    of its series found to be warm-up, 0 for none; the timed rounds the group leaves out as warm-up: the
    latest engine's end past the warm-up steps, the same for every engine so that rounds stay paired)."""
    found, first = [], 0
    for series_head, ranks in zip(warm, per_rank):
        end, _ = steady.warmup_end(list(series_head) + metrics.step_times_over_ranks(ranks))
        found.append(end)
        first = max(first, end - len(series_head))
    return found, first


def warmup_values(warm: list[float], per_rank: list[list[float]], first: int, found: int) -> dict:
    """The row's warm-up and outlier columns: warmup_steps_detected (the test's end of warm-up, in steps
    from the cell's first; 0: none found), the steps kept out of the measurement (`warmup_times_ms`, the
    warm-up steps and the rounds left out, in cells.jsonl) and outlier_steps (Tukey's fences over the
    steps measured: counted, kept)."""
    timed = metrics.step_times_over_ranks(per_rank)
    return {"warmup_steps_detected": found, "warmup_times_ms": list(warm) + timed[:first],
            "outlier_steps": steady.tukey_outliers(timed[first:])}


def skipped_steps(trainer: Trainer) -> int | None:
    """Collective for fp16 cells (every rank's trainer has the same precision): optimizer steps the
    GradScaler skipped so far, the maximum over ranks (under no_sync a rank's local gradients can overflow
    alone); None for other precisions. A device sync."""
    local = trainer.precision.skipped_steps()
    return None if local is None else int(measure.max_over_ranks(local, trainer.device))


def release(device: torch.device) -> None:
    """Free what dropped trainers held (models, buckets, optimizer state) before anything else runs."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def phase_pass(trainer: Trainer) -> dict[str, float | None]:
    """One step with device syncs between phases → forward/backward/optimizer ms, and the engine's own
    end-of-backward wait (ddp_core on CPU only: see Engine.sync_wait_ms)."""
    clock = PhaseClock(trainer.device)
    trainer.step(clock)
    return {"forward": clock.ms["forward"], "backward": clock.ms["backward"],
            "sync_wait": trainer.engine.sync_wait_ms(trainer.model, trainer.device),
            "optimizer": clock.ms["opt_step"]}


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


def solo_peak_memory(cell: Cell, config: BenchConfig, device: torch.device, rank: int,
                     world_size: int) -> dict[str, float | None]:
    """Collective. The cell's trainer alone (nothing else resident): peak memory of a few training steps,
    before any parity clone or probe buffer exists; max over ranks, MiB. peak_mem_mb: allocated (CPU: RSS);
    peak_reserved_mb: the caching allocator's; device_used_mb: the GPU's used memory with the trainer still
    resident (the allocator keeps its peak blocks, so ≈ reserved + context, NCCL and cuBLAS memory)."""
    measure.reset_peak_memory(device)
    trainer = Trainer(cell, config, device, rank, world_size, MEMORY_STEPS)
    for _ in range(MEMORY_STEPS):
        trainer.step()
    sync_device(device)
    out = {"peak_mem_mb": measure.peak_memory_mb(device),
           "peak_reserved_mb": measure.peak_reserved_mb(device),
           "device_used_mb": measure.device_used_mb(device)}
    del trainer
    release(device)
    return out


def timed_values(per_rank: list[list[float]], global_batch: int) -> dict:
    """The step-time columns from per-rank per-step samples: per step the slowest rank; the 95 % interval
    of the median (bench.stats)."""
    samples = metrics.step_times_over_ranks(per_rank)
    p50 = metrics.percentile(samples, 50)
    low, high = stats.median_ci(samples)
    return {
        "n_timed_steps": len(samples),
        "step_time_ms_p50": p50,
        "step_time_ms_p90": metrics.percentile(samples, 90),
        "step_time_ms_ci95_low": low,
        "step_time_ms_ci95_high": high,
        "step_time_half_width_pct": stats.half_width_pct(p50, low, high),
        "step_time_ms_mean": statistics.fmean(samples),
        "step_time_ms_min": min(samples),
        "step_time_ms_std": statistics.stdev(samples) if len(samples) > 1 else None,
        "samples_per_s": metrics.throughput(global_batch, p50),
        "step_times_ms": samples,
    }


def skew_values(compute_only_per_rank: list[list[float]]) -> dict:
    """rank_skew_ms_p50 and slowest_rank from the compute-only rounds (ranks × rounds), where each rank's
    step is its own work: in a synchronised step every rank ends with the step's last collective, so step
    times cannot tell which rank the others waited for (measured, debug.fault=slow:20@ on rank 1 of 2:
    timed-step skew 0.2-0.8 ms, rank 0 "slowest" in 4 of 4 cells; compute-only skew about 20 ms, rank 1)."""
    skew, slowest = stats.rank_skew(compute_only_per_rank) if compute_only_per_rank else (None, None)
    return {"rank_skew_ms_p50": skew, "slowest_rank": slowest}


def phase_values(phases: list[dict]) -> dict:
    """p50 over the phase pass's steps of each phase (empty when a phase was not measured)."""
    def p50(name):
        return metrics.percentile([ph[name] for ph in phases if ph.get(name) is not None], 50)

    return {f"{name}_ms_p50": p50(name) for name in ("forward", "backward", "sync_wait", "optimizer")}


def exposed_values(step_samples: list[float], compute_only: list[float]) -> dict:
    """Compute-only p50, exposed communication (step p50 − compute-only p50) and its 95 % interval."""
    compute_p50 = metrics.percentile(compute_only, 50)
    low, high = stats.median_difference_ci(step_samples, compute_only)
    return {"compute_only_ms_p50": compute_p50,
            "exposed_comm_ms": metrics.exposed_comm_ms(metrics.percentile(step_samples, 50), compute_p50),
            "exposed_comm_ms_ci95_low": low, "exposed_comm_ms_ci95_high": high}


def work_values(trainer: Trainer, row: dict, tokens: float | None, flops: float | None) -> dict:
    """Tokens/s, model TFLOP/s and MFU at the p50 step time (empty when the workload does not say)."""
    p50 = row["step_time_ms_p50"]
    flops_per_s = metrics.throughput(flops, p50)
    peak = measure.device_peak_flops(trainer.device, trainer.cell.precision)
    return {
        "tokens_per_s": metrics.throughput(tokens, p50),
        "model_tflops_per_s": None if flops_per_s is None else flops_per_s / 1e12,
        "mfu": metrics.mfu(flops_per_s, None if peak is None else peak * trainer.cell.world_size),
        "n_params": trainer.n_params,
        "seq_len": getattr(trainer.workload, "seq_len", None),  # sequence models only
    }


def probe_values(probe: measure.Probe, world_size: int) -> dict:
    """The all-reduce probe's columns (nccl-tests algbw and busbw; algbw empty at world size 1, where
    nothing crosses a link) and its size sweep, one entry per message size (`allreduce_sweep`)."""
    algbw = metrics.algbw_gbps(probe.nbytes, probe.seconds)
    dtype = str(probe.dtype).removeprefix("torch.")
    sweep = []
    for size, seconds in probe.sweep:
        bw = metrics.algbw_gbps(size, seconds)
        sweep.append({"size_bytes": size, "dtype": dtype, "time_us": seconds * 1e6, "algbw_gbps": bw,
                      "busbw_gbps": metrics.busbw_gbps(bw, world_size)})
    return {"allreduce_bytes": probe.nbytes, "allreduce_algbw_gbps": algbw,
            "allreduce_busbw_gbps": metrics.busbw_gbps(algbw, world_size), "n_buckets": probe.n_buckets,
            "allreduce_sweep": sweep}


def add_speed_vs_torch(cells: list[Cell], rows: list[dict], raced: list[tuple[Cell, dict]] = ()) -> None:
    """Per non-torch cell of the group, against the plain torch DDP cell of its configuration in the group
    (groups.torch_twin; a race group holds several, and a torch cell it raced out still has its rounds
    so far, `raced`): the median over the rounds they shared of torch step / this cell's step, its 95 %
    interval, and the verdict. Empty without such a cell."""
    pool = [*zip(cells, rows), *raced]
    for cell, row in zip(cells, rows):
        ratios = []
        twin = torch_twin(cell, [c for c, _ in pool])
        if twin is not None:
            ratios = stats.round_ratios(pool[twin][1]["step_times_ms"], row["step_times_ms"]).tolist()
        row |= stats.speed_vs_torch_columns(ratios)
