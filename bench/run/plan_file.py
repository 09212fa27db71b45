"""plan.json, the launcher's word to the worker (bench/worker/main.py reads it): the resolved config, the
cells a launch times and profiles, the launcher to watch for, its passes, the timed-rounds budget it starts
with and its slot; a plan run's (bench run --plan-only, bench slurm) packed world sizes' shares. Its keys
are a file format: `passes` a list of pass names (bench.schema.Passes), `slot` packing.Slot.facts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import BenchConfig
from bench.matrix import Cell
from bench.run.packing import ALONE, Slot
from bench.schema import PASSES, Passes


@dataclass(frozen=True)
class LaunchWork:
    """What one launch (or a plan run) is given to do: the cells to time, the cells to profile after them,
    the passes it runs (bench.schema PASSES; a repeat launch of run.launches REPEAT_PASSES), the
    timed-rounds budget earlier launches left unspent (worker.rounds.Budget), and the slot it runs in
    (packing.Slot.facts: into every row)."""

    cells: list[Cell]
    profile: list[Cell] = field(default_factory=list)
    passes: Passes = PASSES
    carried_s: float = 0.0
    slot: Slot = ALONE


def write_plan(path: Path, config: BenchConfig, run_dir: Path, work: LaunchWork, launcher_pid: int | None,
               slots: dict[int, list[list[str]]] | None = None) -> None:
    """The worker's input: resolved config, the launch's `work`, the launcher to watch for (None: the user's
    own torchrun/srun), and a plan run's packed world sizes (`slots`: per world size, each launch's cell
    ids; bench slurm)."""
    plan = {"run_dir": str(run_dir.resolve()), "config": config.to_dict(),
            "cells": [c.to_dict() for c in work.cells], "profile": [c.to_dict() for c in work.profile],
            "launcher_pid": launcher_pid, "passes": list(work.passes), "carried_s": work.carried_s,
            "slot": work.slot.facts()}
    if slots:
        plan["slots"] = {str(ws): shares for ws, shares in slots.items()}
    path.write_text(json.dumps(plan, indent=1))
