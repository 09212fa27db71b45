"""What one rank knows of its launch, built once in the worker's entry (bench/worker/main.py `launch_context`,
after the process group formed) and handed down to every group it runs (bench/worker/launch_groups.py →
bench/worker/cell.py run_group → GroupRun) instead of a dozen loose parameters.

`Launch` holds the plan's config and passes, the run folder, this rank's device, rank and world size, the
events file, the row facts of this rank's process (threads, host, the slot it was packed into), the run's
timed-rounds budget, a racing search's RaceBook, and whether the user's own torchrun or srun runs the plan
(plan mode, bench/worker/plan_mode.py) or `bench run`'s launcher watches it. The value is frozen; the
budget and the book inside it are the launch's two running accounts, which each group updates for the next.

A test that runs a group in its own process builds one as `Launch(config, device)`: rank 0 of a world of
one, every pass, no events file, a fresh budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.config import BenchConfig
from bench.schema import PASSES, Passes
from bench.worker.events import Events
from bench.worker.racing import RaceBook
from bench.worker.rounds import Budget


@dataclass(frozen=True)
class Launch:
    """One rank's launch (module docstring). `passes`: the launch's (bench.schema.PASSES; a repeat launch of
    run.launches runs REPEAT_PASSES). `facts`: the columns of this rank's process that go into every row it
    finishes. `budget`: None outside a launch (each group then has its own share alone)."""

    config: BenchConfig
    device: torch.device
    rank: int = 0
    world_size: int = 1
    passes: Passes = PASSES
    events: Events | None = None
    run_dir: Path | None = None
    facts: dict = field(default_factory=dict)
    budget: Budget | None = None
    book: RaceBook | None = None  # a racing search's shared state (bench/worker/racing.py)
    plan_run: bool = False  # the user's own torchrun/srun runs the plan: bench/worker/plan_mode.py
    launcher_pid: int | None = None  # `bench run`'s launcher, None in plan mode

    def progress(self, cell_ids: list[str]):
        """What a group calls between its phases: rank 0 writes a "progress" event (the launcher's
        watchdog hears it); the other ranks, and a launch without an events file, say nothing."""
        if self.rank != 0 or self.events is None:
            return lambda phase: None
        return lambda phase: self.events.emit(event="progress", cell_ids=cell_ids, phase=phase)
