"""The order of a cell's phases on every rank, run for a group of cells side by side, and the measured part
of each cell's result row.

A group is the cells of one launch that differ only in engine (bench/worker/groups.py): their trainers are
built together and stepped round-robin, so machine noise lands on all of them alike and each engine's
samples pair up round by round with torch DDP's. A group of one is a cell timed alone.

The phases (GroupRun.PHASES; each a method that keeps the trainers still measured and returns a typed
result, which `PhaseResults` keeps under the phase's name for the phases after it and the rows): build →
warm (compiled cells: until recompilation stops, compile_s) → rounds (timed, side by side: the grid's or a
race's; the warm-up the changepoint test finds left out) → checks (timed values, the phase pass) → gates
(parity: ranks agree; every cell but plain torch DDP hands its optimizer torch DDP's gradient at the same
weights, bench/worker/parity.py) → compute_only (rounds without the gradient sync) → probes (exposed
communication, skew, MFU, the all-reduce probe) → memory (the trainers released, then per cell alone: peak
memory of its training steps). A compiled cell that torch refuses to compile in a known way
(warmup.KNOWN_COMPILE_REFUSALS) leaves the group in its warm-up and is recorded `skipped` with torch's reason.
Profiled passes run after every timed step of the launch (bench/worker/main.py), never here.

The phases' pieces live beside this file: the warm-up (bench/worker/warmup.py), the grid's timed rounds and
the compute-only rounds (bench/worker/rounds.py), a race's rounds (bench/worker/racing.py), and the columns
a row is made of (bench/worker/row_values.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bench import anatomy, metrics
from bench.config import BenchConfig
from bench.matrix import MEMORY_STEPS, Cell, group_budget_s
from bench.race import Elimination
from bench.worker import measure, parity
from bench.worker.context import Launch
from bench.worker.guard import Guard, Peers, check_losses
from bench.worker.measure import Stopwatch, TimedRounds, phase_pass, skipped_steps
from bench.worker.racing import race_rounds
from bench.worker.rounds import Budget, adaptive_rounds, compute_only_rounds
from bench.worker.row_values import (
    add_speed_vs_torch,
    exposed_values,
    phase_values,
    probe_values,
    skew_values,
    timed_values,
    warmup_values,
    work_values,
)
from bench.worker.trainer import Trainer, release, sync_device
from bench.worker.warmup import MAX_RECOMPILE_STEPS, warm_up, warmup_found

DIVERGED = "parameters differ across ranks after the timed steps"
COMPANION = "companion"  # a cell stepped beside its group for the pairing only (its row is another group's)

Outcome = tuple[str, str | None, dict]  # a cell's (status, error, measured part of its row)


def steps_needed(config: BenchConfig) -> int:
    """Optimizer steps a trainer may run over the timed phases (the data schedule's length): the adaptive
    rounds' cap, as the rounds they will take are not known in advance, and the warm-up steps a compiled
    cell may add."""
    r = config.run
    return (r.warmup_steps + MAX_RECOMPILE_STEPS + r.most_timed_steps + r.phase_steps
            + r.compute_only_steps)


def run_group(cells: list[Cell], launch: Launch, companions: frozenset[str] = frozenset(),
              peers: Peers | None = None) -> list[Outcome]:
    """Collective. Every phase of the group's cells (GroupRun.PHASES, in order) → per cell (status, error,
    measured part of the row): "ok" | "diverged" with its row; "raced_out" with its rounds so far and the
    comparison that eliminated it, when the launch's RaceBook makes the group a race (bench/worker/racing.py:
    only the survivors go through the phases after the timed rounds); or — for a cell whose trainer raised,
    whose loss is not finite or that torch refused to compile — its own status and error with nothing
    measured, while the other cells go on (bench/worker/guard.py). Rank 0 tells the launcher's watchdog of
    each phase (Launch.progress). The launch's budget (default: this group's share alone) and passes decide
    how long the rounds run and which passes run (a repeat launch of run.launches runs REPEAT_PASSES: build,
    warm-up, timed rounds, the parity check and the compute-only rounds, no phase, probe or memory pass).
    `companions`: cells already measured in an earlier group of the launch, stepped here in the warm-up and
    timed rounds only, so that the others are paired with them (groups.paired_chunks); their outcome is
    (COMPANION, None, {}) and nothing of them is recorded. `peers`: how the ranks learn of a failure on some
    of them only (guard.Peers: it then raises GroupBroken out of here on every rank)."""
    group = GroupRun(cells, launch, companions, Guard(peers))
    for phase in GroupRun.PHASES:
        entering, t0, analysed = group.entering(phase), time.perf_counter(), measure.ANALYSIS.seconds
        result = phase(group)
        if result is not None:  # every phase but the build returns what it measured
            setattr(group.done, phase.__name__, result)
        group.charge(phase.__name__, entering, time.perf_counter() - t0, measure.ANALYSIS.seconds - analysed)
        if not group.trainers:  # every cell failed, or a race eliminated every one
            break
    return group.outcomes()


@dataclass(frozen=True)
class Warmed:
    """The warm-up's result (warmup.warm_up): per compiled cell the seconds its warm-up steps compiled, per
    cell its warm-up steps' times (ms, the slowest rank's)."""

    compile_s: dict[str, float]
    times: dict[str, list[float]]


@dataclass(frozen=True)
class Timed:
    """The timed rounds' result, per cell id where it says so."""

    per_rank: dict[str, list[list[float]]]  # every timed round's times, ranks × rounds (warm-up ones too)
    first: int  # the rounds left out as warm-up: the same for every cell, so that rounds stay paired
    found: dict[str, int]  # the steps of its series the changepoint test found to be warm-up
    steps: dict[str, list]  # each survivor's own timed batches (the compute-only rounds replay them)
    skipped_before: dict[str, int | None]  # fp16: the optimizer steps skipped before the timed rounds
    stopped_by: str | None  # why the rounds stopped (None: a fixed count)
    side_by_side: int  # the trainers stepped round-robin in the timed rounds
    paired: list[tuple[Cell, dict]]  # the companions' timed values: the others pair with them
    raced_out: dict[str, tuple[Cell, Outcome]]  # the cells a race eliminated, with their outcomes


@dataclass(frozen=True)
class Memory:
    """The memory phase's result: the cells every phase measured, and per cell its peak-memory columns."""

    measured: list[Cell]
    values: dict[str, dict]


@dataclass
class PhaseResults:
    """What each phase returned, under the phase's name (None: it has not run). checks, gates, probes:
    per cell id a part of its row; compute_only: per cell id its compute-only step times, ranks × rounds."""

    warm: Warmed | None = None
    rounds: Timed | None = None
    checks: dict[str, dict] = field(default_factory=dict)
    gates: dict[str, dict] = field(default_factory=dict)
    compute_only: dict[str, list[list[float]]] = field(default_factory=dict)
    probes: dict[str, dict] = field(default_factory=dict)
    memory: Memory | None = None


class GroupRun:
    """One group's measurement on this rank, phase by phase. Each phase reads what the ones before it
    returned (`done`) and leaves `trainers`: those still measured (a phase that leaves none ends the group).
    Every phase is collective: the ranks run the same phases over the same trainers (the guard agrees on
    failures). `clock`: the group's stepping, shared over its cells as steps_wall_s; `spent`: per cell id
    its cost anatomy."""

    def __init__(self, cells: list[Cell], launch: Launch, companions: frozenset[str], guard: Guard):
        self.cells, self.launch, self.config = cells, launch, launch.config
        self.companions, self.guard = companions, guard
        self.progress = launch.progress([c.cell_id for c in cells])
        self.clock = Stopwatch()
        self.trainers: list[Trainer] = []
        self.done = PhaseResults()
        self.spent: dict[str, dict[str, float]] = {c.cell_id: {} for c in cells}

    # each phase's part of the cost anatomy (anatomy.PARTS)
    PART = {"build": "build", "warm": "warmup", "rounds": "timed", "checks": "phase", "gates": "gate",
            "compute_only": "compute_only", "probes": "probe", "memory": "memory"}

    def entering(self, phase) -> list[str]:
        """The cells `phase` (about to run) is run for: every cell for the build, then those measured."""
        if phase.__name__ == "build":
            return [c.cell_id for c in self.cells]
        return [t.cell.cell_id for t in self.trainers if t is not None]

    def charge(self, phase: str, ids: list[str], seconds: float, analysis_s: float = 0.0) -> None:
        """A phase's seconds shared among the cells that entered it (anatomy.share): the warm-up in
        proportion to each cell's own warm-up steps' time and compile, the timed rounds to its own steps'
        time (a candidate raced out at round 16 of a race whose survivors ran 40 pays for its 16), the
        others evenly; the statistics between the rounds as `analysis`."""
        part, warm, timed = self.PART[phase], self.done.warm, self.done.rounds
        weights = None
        if part == "warmup" and warm is not None and warm.times:
            weights = [sum(warm.times.get(i) or []) / 1e3 + (warm.compile_s.get(i) or 0.0) for i in ids]
        elif part == "timed" and timed is not None and timed.per_rank:
            weights = [sum(metrics.step_times_over_ranks(timed.per_rank[i])) if timed.per_rank.get(i) else 0.0
                       for i in ids]
        for cell_id, s in anatomy.share(seconds - analysis_s, ids, weights).items():
            anatomy.add(self.spent.setdefault(cell_id, {}), part, s)
        for cell_id, s in anatomy.share(analysis_s, ids, weights).items():
            if s:
                anatomy.add(self.spent[cell_id], "analysis", s)

    def build(self) -> None:
        """A trainer per cell, every one over the same data schedule's length."""
        n, launch = steps_needed(self.config), self.launch
        _, built = self.guard.each(self.cells, lambda c: Trainer(c, self.config, launch.device, launch.rank,
                                                                  launch.world_size, n), cell_of=lambda c: c)
        self.trainers = list(built.values())

    def warm(self) -> Warmed:
        """run.warmup_steps rounds (compiled cells: until recompiling stops); the losses checked."""
        with self.clock:
            warmed = Warmed(*warm_up(self.trainers, self.config.run.warmup_steps, self.launch.device,
                                     self.guard, self.progress))
            sync_device(self.launch.device)
        self.keep_finite()
        return warmed

    def rounds(self) -> Timed:
        """The timed rounds, side by side: the grid's fixed or adaptive count, or a race's (which eliminates
        candidates as it goes); then the warm-up the changepoint test finds in them is left out, and the
        companions and raced-out cells leave."""
        self.progress("timed")
        first_timed = self.trainers[0].cursor  # every trainer has stepped as often: a common warm-up
        self.trainers, skipped_before = self.guard.each(self.trainers, skipped_steps)  # syncs, untimed
        budget = self.launch.budget or Budget()
        allowance = budget.allowance_s(group_budget_s(self.config, len(self.trainers)))
        timed_clock = Stopwatch()
        with self.clock, timed_clock:
            rounds, order, raced = (self.grid_rounds(allowance) if self.launch.book is None
                                    else self.raced_rounds())
        if self.config.run.adaptive:  # a fixed count spends no budget, and so leaves none
            budget.spend(allowance, timed_clock.seconds)
        warm = self.done.warm.times
        with measure.ANALYSIS:
            found, first = warmup_found([warm[c.cell_id] for c in order], rounds.per_rank)
        if self.launch.book is not None:
            first = 0  # a race's looks compared every round: its eliminated cells' rows keep them
        per_rank = {c.cell_id: ranks for c, ranks in zip(order, rounds.per_rank)}
        # a companion's rounds pair the others with it (add_speed_vs_torch); then it leaves, as one raced out
        paired = [(t.cell, timed_values([x[first:] for x in per_rank[t.cell.cell_id]], t.cell.global_batch))
                  for t in self.trainers if t is not None and t.cell.cell_id in self.companions]
        self.trainers = [t for t in self.trainers if t is not None and t.cell.cell_id not in raced
                         and t.cell.cell_id not in self.companions]
        self.keep_finite()
        # each trainer's own timed batches (a race's candidates differ in per-rank batch and accumulation)
        steps = {t.cell.cell_id: t.schedule[first_timed:t.cursor] for t in self.trainers}
        return Timed(per_rank=per_rank, first=first, found={c.cell_id: end for c, end in zip(order, found)},
                     steps=steps, skipped_before=skipped_before, stopped_by=rounds.stopped_by,
                     side_by_side=len(rounds.per_rank), paired=paired, raced_out=raced)

    def grid_rounds(self, allowance: float) -> tuple[TimedRounds, list[Cell], dict]:
        """Every trainer to the end (adaptive_rounds), paired with the torch DDP cell when there is one."""
        reference = next((i for i, t in enumerate(self.trainers) if t.cell.is_baseline), None)
        warm = [self.done.warm.times[t.cell.cell_id] for t in self.trainers]
        rounds = adaptive_rounds([self.guard.step(t) for t in self.trainers], self.config, self.launch.device,
                                 reference, self.progress, warm, allowance)
        return rounds, [t.cell for t in self.trainers], {}

    def raced_rounds(self) -> tuple[TimedRounds, list[Cell], dict[str, tuple[Cell, Outcome]]]:
        """A race (bench/worker/racing.py): an eliminated candidate's row is made at the look that decided
        it, on every rank in the same order, and its trainer goes (its slot in `trainers` becomes None)."""
        racing, raced = [t.cell for t in self.trainers], {}

        def eliminate(i: int, ranks: list[list[float]], why: Elimination) -> None:
            raced[racing[i].cell_id] = racing[i], raced_out_outcome(self.trainers[i], ranks, why,
                                                                    self.done.warm.compile_s, len(racing) > 1)
            self.trainers[i] = None
            release(self.launch.device)

        def failed() -> set[int]:  # collective: the candidates whose steps raised, on any rank
            agreed = self.guard.agree()
            return {i for i, c in enumerate(racing) if c.cell_id in agreed}

        rounds = race_rounds([self.guard.step(t) for t in self.trainers], racing, self.config,
                             self.launch.device, self.launch.book, eliminate, self.progress, failed)
        return rounds, racing, raced

    def checks(self) -> dict[str, dict]:
        """Per cell: its timed values, warm-up and outlier columns, the phase pass, loss, compile time,
        precision flags and the engine's state per rank."""
        self.progress("checks")
        warm, timed = self.done.warm, self.done.rounds
        phase_steps = self.config.run.phase_steps if self.launch.passes.includes("phase") else 0

        def checks(trainer: Trainer) -> dict:
            ranks, cell_id = timed.per_rank[trainer.cell.cell_id], trainer.cell.cell_id
            with self.clock:
                phases = [phase_pass(trainer) for _ in range(phase_steps)]
            return (timed_values([times[timed.first:] for times in ranks], trainer.cell.global_batch)
                    | warmup_values(warm.times[cell_id], ranks, timed.first, timed.found[cell_id])
                    | phase_values(phases) | {
                "final_loss": measure.mean_over_ranks(float(trainer.last_loss.float()), self.launch.device),
                "compile_s": warm.compile_s.get(cell_id)} | trainer.precision.flags
                | trainer.engine.state_bytes_per_rank(trainer.param_bytes, self.launch.world_size,
                                                      trainer.cell))

        self.trainers, rows = self.guard.each(self.trainers, checks)
        self.keep_finite()  # apart: no collective after it
        return rows

    def gates(self) -> dict[str, dict]:
        """The parity gates: parameters identical over ranks; every cell but plain torch DDP hands its
        optimizer torch DDP's gradient at the same weights and batch (bench/worker/parity.py). The gate
        loads its weights into the trainers: nothing after it reads their values."""
        references = parity.References(self.trainers, self.config, self.launch.rank, self.launch.world_size)

        def gates(trainer: Trainer) -> dict:
            out = {"identical": measure.params_identical(trainer.engine.full_parameters(trainer.model),
                                                         self.launch.device)}
            if parity.needs_gate(trainer.cell):
                with self.clock:
                    out |= parity.gate(trainer, references)
            return out

        self.trainers, gated = self.guard.each(self.trainers, gates)
        references.release()  # the references go before the compute-only rounds
        release(self.launch.device)
        return gated

    def compute_only(self) -> dict[str, list[list[float]]]:
        """Every launch, repeats too: a merged row's step, compute-only and exposed communication then come
        from the same launches (bench/run/merge.py). No gradient sync from here on: ranks' parameters drift
        apart, which the gates above saw."""
        self.progress("compute-only")
        with self.clock:
            return compute_only_rounds(self.trainers, self.done.rounds.steps,
                                       self.config.run.compute_only_steps, self.guard)

    def probes(self) -> dict[str, dict]:
        """Per cell: exposed communication and rank skew, work and MFU, the all-reduce probe, the buckets the
        engine used (what `bench project` reads) and fp16's scale and skipped steps."""
        probe_iters = self.config.run.probe_iters if self.launch.passes.includes("probe") else 0
        done = self.done

        def probes(trainer: Trainer) -> dict:
            row, cell_id = done.checks[trainer.cell.cell_id], trainer.cell.cell_id
            tokens, flops = measure.work_per_step(trainer, done.rounds.steps[cell_id])
            before, now = done.rounds.skipped_before[cell_id], skipped_steps(trainer)
            ranks = done.compute_only[cell_id]  # ranks × rounds: each rank's own work, for the skew
            return (done.gates[cell_id]
                    | exposed_values(row["step_times_ms"], metrics.step_times_over_ranks(ranks))
                    | skew_values(ranks) | {"compute_only_ms_per_rank": ranks}
                    | work_values(trainer, row, tokens, flops)
                    | probe_values(measure.allreduce_probe(trainer, probe_iters), self.launch.world_size)
                    | {"bucket_sizes_bytes": trainer.engine.bucket_sizes_bytes(trainer.model,
                                                                                trainer.cell.wrap_bucket_mb),
                       "loss_scale": trainer.precision.loss_scale(), "skipped_steps": now,
                       "skipped_timed_steps": None if before is None else now - before})

        self.trainers, probed = self.guard.each(self.trainers, probes)
        return probed

    def memory(self) -> Memory:
        """The trainers go, then each cell alone: the peak memory of its training steps."""
        measured = [t.cell for t in self.trainers]
        self.trainers = []
        release(self.launch.device)
        self.progress("memory")
        wanted = self.launch.passes.includes("memory")
        measured, memory = self.guard.each(measured, lambda c: solo_peak_memory(c, self.launch) if wanted
                                           else {}, cell_of=lambda c: c)
        return Memory(measured, memory)

    PHASES = (build, warm, rounds, checks, gates, compute_only, probes, memory)

    def keep_finite(self) -> None:
        """Collective: the trainers whose losses are finite on every rank stay."""
        self.trainers, _ = self.guard.each(self.trainers, lambda t: check_losses(t.losses))

    def outcomes(self) -> list[Outcome]:
        """Per cell: its measured row (after the last phase), its race's elimination, COMPANION, or its
        failure. The survivors of a race join its book: later groups of their recipe race them, unpaired."""
        done, book = self.done, self.launch.book
        measured = done.memory.measured if done.memory is not None else []
        side_by_side, stopped_by, paired, raced = ((1, None, [], {}) if done.rounds is None else
                                                   (done.rounds.side_by_side, done.rounds.stopped_by,
                                                    done.rounds.paired, done.rounds.raced_out))
        wall = {"steps_wall_s": self.clock.seconds / side_by_side}
        rows = [done.checks[c.cell_id] | done.probes[c.cell_id] | done.memory.values[c.cell_id] | wall
                | {"interleaved": side_by_side > 1, "stopped_by": stopped_by} for c in measured]
        add_speed_vs_torch(measured, rows, [(cell, row) for cell, (_, _, row) in raced.values()] + paired)
        outcomes = {c.cell_id: outcome(row) for row, c in zip(rows, measured)}
        if book is not None:
            for cell, row in zip(measured, rows):
                if outcomes[cell.cell_id][0] == "ok":
                    book.add(cell, row["step_times_ms"])
        for row, c in zip(rows, measured):
            row["anatomy_s"] = dict(self.spent[c.cell_id])
        for cell_id, (_, (_, _, row)) in raced.items():
            row |= wall | {"anatomy_s": dict(self.spent[cell_id])}
        outcomes |= {cell_id: out for cell_id, (_, out) in raced.items()}
        outcomes |= {cell_id: (COMPANION, None, {}) for cell_id in self.companions
                     if cell_id not in self.guard.failed}
        return [outcomes.get(c.cell_id) or self.guard.outcome(c.cell_id) for c in self.cells]


def raced_out_outcome(trainer: Trainer, per_rank: list[list[float]], why: Elimination,
                      compile_s: dict, interleaved: bool) -> Outcome:
    """Collective. An eliminated candidate's outcome: status raced_out (diverged if its ranks' parameters
    already differ), its timed rounds so far and the comparison that eliminated it."""
    row = timed_values(per_rank, trainer.cell.global_batch) | why.columns() | {
        "compile_s": compile_s.get(trainer.cell.cell_id), "interleaved": interleaved,
        **trainer.precision.flags,
        **trainer.engine.state_bytes_per_rank(trainer.param_bytes, trainer.cell.world_size, trainer.cell)}
    if not measure.params_identical(trainer.engine.full_parameters(trainer.model), trainer.device):
        return "diverged", DIVERGED, row
    return "raced_out", why.sentence(), row


def outcome(row: dict) -> Outcome:
    """A measured cell's outcome: diverged when its ranks' parameters differ or its parity gate failed."""
    identical, failure = row.pop("identical"), row.pop("parity_failure", None)
    if not identical:
        return "diverged", DIVERGED, row
    if failure:
        return "diverged", failure, row
    return "ok", None, row


def solo_peak_memory(cell: Cell, launch: Launch) -> dict[str, float | None]:
    """Collective. The cell's trainer alone (nothing else resident): peak memory of a few training steps,
    before any parity clone or probe buffer exists; max over ranks, MiB. peak_mem_mb: allocated (CPU: RSS);
    peak_reserved_mb: the caching allocator's; device_used_mb: the GPU's used memory with the trainer still
    resident (the allocator keeps its peak blocks, so ≈ reserved + context, NCCL and cuBLAS memory)."""
    device = launch.device
    measure.reset_peak_memory(device)
    trainer = Trainer(cell, launch.config, device, launch.rank, launch.world_size, MEMORY_STEPS)
    for _ in range(MEMORY_STEPS):
        trainer.step()
    sync_device(device)
    out = {"peak_mem_mb": measure.peak_memory_mb(device),
           "peak_reserved_mb": measure.peak_reserved_mb(device),
           "device_used_mb": measure.device_used_mb(device)}
    del trainer
    release(device)
    return out
