"""The --dry-run estimate of a racing search (run.search race | race-all-sizes; bench/race.py): a range,
(low, high), from the grid estimate's rates and parts (bench/run/estimate.py), as a race spends them: every
candidate to its recipe's first look, then the survivors as grid cells. Never used for a result.
"""

from __future__ import annotations

from bench import anatomy, race
from bench.config import BenchConfig
from bench.matrix import Cell, by_launch, group_budget_s
from bench.run import estimate  # its RATES looked up when used (a test sets its own)
from bench.run.estimate import (
    Rates,
    cell_parts,
    compiling,
    estimate_step_seconds,
    fixed_parts,
    over_slots,
    profiled_seconds,
    scaled_parts,
    workload_sizes,
)
from bench.schema import search

RACE_SCENARIOS = ("low", "high")


def race_seconds(config: BenchConfig, cells: list[Cell], rates: Rates | None = None,
                 gpus: int = 0) -> tuple[float, float]:
    """The --dry-run range of a racing search's wall time, (low, high), from the same rates as the grid's
    estimate. In both, every candidate of a recipe is built, warmed up and stepped to the race's first look
    (race.looks: the rounds at which its number of candidates can first have an elimination); a survivor
    then costs what a grid cell does (its rounds at least the first look's), an eliminated one nothing
    more; where the first look comes after the minimum rounds and the grid's budget for the recipe's cells
    (run.max_group_s per group of the matrix's engines) ends before it, nothing is eliminated. low: one
    configuration survives each recipe; high: every one the rate model cannot tell from the recipe's best
    (its step within run.target_ci_pct of the fastest predicted; the model gives every engine and bucket
    size of a precision and batch the same step) survives. With run.search = race, a configuration whose
    choices (race.carry_keys) were eliminated in every recipe at a smaller world size is not launched at
    larger ones, in the same scenario. With run.launches L, a survivor is measured in every launch (a grid
    cell's L − 1 repeats) and an eliminated one only in the launch that eliminated it (raced_out ends a
    cell), taken as the first. Packed on a node of `gpus` GPUs (bench/run/packing.py), a world size costs its
    longest slot of whole recipes."""
    return tuple(sum(parts.values()) for parts in race_parts(config, cells, rates, gpus))


def race_parts(config: BenchConfig, cells: list[Cell], rates: Rates | None = None,
               gpus: int = 0) -> tuple[dict[str, float], ...]:
    """race_seconds' (low, high) by the anatomy's parts (anatomy.PARTS)."""
    rates = rates or estimate.RATES[config.run.device]
    flops, n_params, n_tensors = workload_sizes(config)
    runnable = [c for c in cells if not c.skip_reason]
    base = fixed_parts(config, rates, runnable)
    return tuple(anatomy.total([base, _race_scenario(config, rates, runnable, flops, n_params,
                                                            n_tensors, scenario, gpus)])
                 for scenario in RACE_SCENARIOS)


def _race_scenario(config: BenchConfig, rates: Rates, runnable: list[Cell], flops: float, n_params: int,
                   n_tensors: int, scenario: str, gpus: int = 0) -> dict[str, float]:
    r, total = config.run, []
    survived: dict[tuple, bool] = {}  # (world size, its carried choices) → survived some recipe there
    for ws, launch in by_launch(runnable).items():
        parts: dict[str, dict[str, float]] = {}  # what each cell of the world size costs in this scenario
        if search(r.search).carries_over:
            launch = [c for c in launch if not _carried_out(c, survived)]
        paying = compiling(launch)  # every launched candidate is built and warmed up
        recipes: dict[tuple, list[Cell]] = {}
        for cell in launch:
            recipes.setdefault(race.recipe(cell), []).append(cell)
        for group in recipes.values():
            looks = race.looks(r.min_timed_steps, r.rounds_cap, len(group))
            first = looks[0][0] if looks else 0
            step = {c.cell_id: estimate_step_seconds(rates, c, flops, n_params, n_tensors) for c in group}
            budget = group_budget_s(config, len(group))  # the grid's, for these cells
            if r.adaptive and first > r.min_timed_steps and first * sum(step.values()) > budget:
                looks, first = [], 0  # the budget stops the race at the minimum rounds, before its first look
            fastest = min(step.values())
            keep = {min(step, key=step.get)} if scenario == "low" else {
                c for c, s in step.items() if s <= fastest * (1 + r.target_ci_pct / 100)}
            for cell in group:
                alive = not looks or cell.cell_id in keep
                key = (ws, tuple(getattr(cell, k) for k in race.carry_keys(ws)))
                survived[key] = survived.get(key, False) or alive
                if alive:
                    parts[cell.cell_id] = (
                        cell_parts(config, rates, cell, flops, n_params, n_tensors, first,
                                   cell.cell_id in paying)
                        | {"profile": profiled_seconds(config, rates, cell, step[cell.cell_id], n_params)})
                else:
                    parts[cell.cell_id] = _raced_out_parts(config, rates, cell, step[cell.cell_id],
                                                           n_params, first, cell.cell_id in paying)
        seconds = {c: sum(p.values()) for c, p in parts.items()}
        total.append(scaled_parts(parts, over_slots(config, ws, gpus, seconds, launch)))
    return anatomy.total(total)


def _carried_out(cell: Cell, survived: dict[tuple, bool]) -> bool:
    """race.not_launched's rule on a scenario's outcomes: eliminated everywhere at a smaller world size."""
    return any(ws < cell.world_size and not alive
               and key == tuple(getattr(cell, k) for k in race.carry_keys(ws))
               for (ws, key), alive in survived.items())


def _raced_out_parts(config: BenchConfig, rates: Rates, cell: Cell, step: float, n_params: int,
                     rounds: int, compiles: bool = True) -> dict[str, float]:
    """An eliminated candidate: one build, the fixed per-cell overhead, warm-up and its rounds, compiling
    (`compiles`: the first of its graph_key in the launch)."""
    compiled = cell.compile not in (None, "none") and compiles
    return {"build": rates.build_s_per_param * n_params, "other": rates.cell_s,
            "warmup": config.run.warmup_steps * step + (rates.compile_s if compiled else 0.0),
            "timed": rounds * step}


def race_looks(config: BenchConfig, cells: list[Cell]) -> list[list[tuple[int, float]]]:
    """Per recipe of the runnable `cells` (all launched), its race's looks (race.looks)."""
    recipes: dict[tuple, int] = {}
    for cell in cells:
        recipes[race.recipe(cell)] = recipes.get(race.recipe(cell), 0) + 1
    r = config.run
    return [race.looks(r.min_timed_steps, r.rounds_cap, k) for k in recipes.values()]
