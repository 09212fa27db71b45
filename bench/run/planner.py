"""What a run will measure, decided before anything is created: the preset loaded with its overrides,
checked against the machine (or, for a plan made on a login node, against the nodes it names), and expanded
into cells. Everything here raises ConfigError (one line naming the key and the value, exit 2) and writes
nothing.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
import sys
from dataclasses import dataclass

from bench import anatomy, schema
from bench.config import BenchConfig, ConfigError, load_config, resolve_path
from bench.matrix import Cell, by_launch, expand
from bench.run import checks
from bench.schema import MiB

GiB = 1024 * MiB


@dataclass(frozen=True)
class Plan:
    """A validated run: its resolved config, every cell of its matrix in sweep order (skipped ones carry
    their reason), and the preset's name, which names the run folder."""

    config: BenchConfig
    cells: tuple[Cell, ...]
    preset: str
    # the GPUs of the node a CUDA run's launches share (this machine's, or --gpus-per-node): what packing
    # splits (bench/run/packing.py); 0 on CPU
    gpus: int = 0

    @property
    def runnable(self) -> list[Cell]:
        return [c for c in self.cells if not c.skip_reason]

    def profiled(self, cells: list[Cell] | None = None) -> list[Cell]:
        """The cells (of `cells`, default the runnable ones) that get a profiled pass."""
        cells = self.runnable if cells is None else cells
        return [c for c in cells if self.config.profile.covers(c.cell_id)]


def plan(config: str, overrides: list[str] = (), *, plan_only: bool = False, nnodes: int = 1,
         gpus_per_node: int | None = None, search: str | None = None,
         memory_gb: float | None = None) -> Plan:
    """Load the preset `config` (a name or a TOML path) with `--set` overrides, check it against the machine
    and expand its cells. With `plan_only` and `gpus_per_node`, the check is against `nnodes` × that many
    GPUs rather than this machine's (a GPU-less login node planning a CUDA run). `search` (--search) sets
    run.search; `memory_gb` (--memory-gb) and, in a racing search, the GPU's own memory skip the cells whose
    per-rank state cannot fit (`prune_memory`). Warnings that do not stop the run (CPU ranks sharing cores,
    timing-relevant variables) go to stderr."""
    for flag, value in (("--nnodes", nnodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}={value}: must be at least 1")
    if memory_gb is not None and not (memory_gb > 0 and math.isfinite(memory_gb)):
        raise ConfigError(f"--memory-gb={memory_gb:g}: must be a number of GiB above 0")
    if search is not None:
        overrides = [*overrides, f"run.search={search}"]
    if gpus_per_node is not None and not plan_only:
        raise ConfigError(f"--gpus-per-node={gpus_per_node}: only with --plan-only (a run uses this "
                          "machine's GPUs)")
    # --plan-only --gpus-per-node G plans for the compute nodes, not for this (maybe GPU-less) machine:
    # "auto" resolves to cuda, and the world sizes are checked against --nnodes × G.
    planned_gpus = gpus_per_node if plan_only else None
    resolved = load_config(config, list(overrides),
                           cuda_available=(lambda: True) if planned_gpus else checks.cuda_for_auto)
    check_model(resolved)
    gpu_count, bf16_ok = checks.machine(resolved)
    if planned_gpus and resolved.run.device == "cuda":
        gpu_count, bf16_ok = planned_gpus, True  # bf16 is the nodes' to check: a cell fails there
    if resolved.run.device == "cuda" and not gpu_count:  # asked for cuda: say why torch has none
        reason = checks.unusable_gpus()
        if reason:
            raise ConfigError(f"run.device='cuda': {reason}")
        if plan_only:
            raise ConfigError("run.device='cuda': this machine has no CUDA device; to plan for GPU "
                              "nodes from here, pass --gpus-per-node G (the GPUs of each node)")
    checks.check_device(resolved, gpu_count, nnodes=nnodes if plan_only else 1)
    crowded = checks.cpu_oversubscription(resolved)
    if crowded:
        print(crowded, file=sys.stderr)
    from bench.envinfo import timing_warnings

    for warning in timing_warnings(dict(os.environ)):  # recorded in env.json and the report too
        print(f"warning: {warning}", file=sys.stderr)
    # a plan is capped at the GPUs it will run on (--nnodes × --gpus-per-node, or this machine's), as
    # --help says: a world size above them is skipped with its reason (refused when the preset does not set
    # run.skip_world_sizes_above_gpus)
    cells = expand(resolved, bf16_supported=bf16_ok,
                   gpu_count=gpu_count * nnodes if plan_only and gpu_count else gpu_count)
    check_patterns(resolved, cells, bf16_ok)
    device_bytes = checks.device_memory_bytes(resolved) if schema.search(resolved.run.search).races else None
    if memory_gb is not None or device_bytes is not None:
        cells = prune_memory(cells, resolved, memory_gb, device_bytes)
    return Plan(config=resolved, cells=tuple(cells), preset=resolve_path(config).stem,
                gpus=gpu_count if resolved.run.device == "cuda" else 0)


def check_model(config: BenchConfig) -> None:
    """A user model that the ranks could not build or step stops here, one line naming the spec and the
    cause (bench/workloads/preflight.py: a meta-device build and step, nothing allocated), before a run
    folder exists; a built-in model needs no check."""
    from bench.workloads import UserModelError, is_user_spec
    from bench.workloads.preflight import check_user_model

    w = config.workload
    if is_user_spec(w.model):
        try:
            check_user_model(w.model, w.model_size, w.options())
        except UserModelError as e:
            raise ConfigError(f"workload: {e}") from None


def check_patterns(config: BenchConfig, cells: list[Cell], bf16_ok: bool) -> None:
    """The keys that name cells by pattern each match one (ConfigError naming the key and the pattern
    otherwise: a typo would run nothing, or inject no fault, silently): matrix.cells over the matrix's
    cells before it filters them, debug.fault's substring over the cells it keeps. (profile.cells may miss:
    a preset's patterns name its own matrix's cells, and --set narrows the matrix.)"""
    every = [c.cell_id for c in expand(dataclasses.replace(config, matrix=dataclasses.replace(
        config.matrix, cells=("*",))), bf16_supported=bf16_ok)]
    kept = [c.cell_id for c in cells]
    checks_ = [("matrix.cells", config.matrix.cells, every, fnmatch.fnmatchcase, "a glob")]
    if config.debug.fault:
        pattern = config.debug.fault.partition("@")[2]
        checks_.append(("debug.fault", (pattern,), kept, lambda cell_id, p: p in cell_id, "a substring"))
    for key, patterns, ids, matches, kind in checks_:
        for pattern in patterns:
            if ids and not any(matches(cell_id, pattern) for cell_id in ids):
                shown = config.debug.fault if key == "debug.fault" else pattern
                raise ConfigError(f"{key}={shown!r}: {pattern!r} ({kind} over cell ids) matches none of the "
                                  f"{len(ids)} cells, e.g. {ids[0]!r}")


def prune_memory(cells: list[Cell], config: BenchConfig, memory_gb: float | None,
                 device_bytes: int | None) -> list[Cell]:
    """The cells with a skip reason added where the per-rank state the engine says it holds (parameters,
    gradients and AdamW's moments: Engine.state_bytes_per_rank, from the model's fp32 parameter count on
    the meta device) exceeds `memory_gb` GiB or the device's memory. Activations are not counted, so a
    cell kept here can still run out of memory; one skipped here cannot fit."""
    from bench import engines
    from bench.run.estimate import model_size_counts

    n_params, _ = model_size_counts(config)
    limits = [(memory_gb * GiB, f"--memory-gb {memory_gb:g}")] if memory_gb is not None else []
    if device_bytes is not None:
        limits.append((device_bytes, f"the GPU's {device_bytes / GiB:.1f} GiB"))
    out = []
    for cell in cells:
        state = sum(engines.get(cell.engine).state_bytes_per_rank(4 * n_params, cell.world_size,
                                                                  cell).values())
        over = next((why for limit, why in limits if state > limit), None)
        if over is not None and not cell.skip_reason:
            cell = dataclasses.replace(cell, skip_reason=(
                f"per-rank state {state / GiB:.3g} GiB (parameters, gradients, AdamW moments by the "
                f"engine's layout) exceeds {over}: it cannot fit"))
        out.append(cell)
    return out


def describe(plan: Plan) -> list[str]:
    """`--dry-run`: a line per cell, then the totals and the time estimate (bench/run/estimate.py)."""
    from bench.run.estimate import RATES, expected_rounds

    config, cells = plan.config, list(plan.cells)
    runnable, profiled = plan.runnable, {c.cell_id for c in plan.profiled()}
    lines = [f"{'skip' if cell.skip_reason else 'run ':4}  {cell.cell_id}"
             + (f"  ({cell.skip_reason})" if cell.skip_reason else "")
             + ("  [profiled]" if cell.cell_id in profiled else "") for cell in cells]
    r = config.run
    noise_measured = RATES[r.device].half_width_sqrt_n_pct is not None
    wall = wall_words(config, cells, plan.gpus)
    lines.append(f"each cell timed in {r.launches} launches (run.launches), in an order shuffled with "
                 "run.seed; the intervals hold the variance between them" if r.launches > 1 else
                 "each cell timed in one launch (run.launches = 1): the variance between launches stays "
                 "unknown")
    lines.append(f"{len(runnable)} cells to run ({len(profiled)} profiled), {len(cells) - len(runnable)} "
                 f"skipped, {launch_count(config, runnable, plan.gpus)} launches; {wall} (bench.run.estimate."
                 f"RATES: calibrated on a 2-core CPU, one H100 and one H200; GPU all-reduce speed assumed)")
    packed = packed_words(config, runnable, plan.gpus)
    if packed:
        lines.append(packed)
    if runnable:
        lines += parts_lines(config, cells, plan.gpus)
    if schema.search(r.search).races and runnable:
        lines.append(race_line(config, cells, plan.gpus))
        lines += parts_lines(config, cells, plan.gpus, race=True)
    if r.adaptive and runnable and noise_measured:
        rounds = sorted(expected_rounds(config, cells))
        median = rounds[len(rounds) // 2]
        lines.append(f"timed rounds per cell expected: {rounds[0]}-{rounds[-1]} (median {median}), "
                     f"until ±{r.target_ci_pct:g} % (run.target_ci_pct), at most {r.max_timed_steps} rounds "
                     f"or {r.max_group_s:g} s a group")
    elif r.adaptive and runnable:
        lines.append(f"timed rounds per cell: {r.min_timed_steps} to {r.max_timed_steps}, until "
                     f"±{r.target_ci_pct:g} % (run.target_ci_pct) or {r.max_group_s:g} s a group")
    return lines


def parts_lines(config, cells: list[Cell], gpus: int = 0, race: bool = False) -> list[str]:
    """`--dry-run`: the estimate by the cost anatomy's parts (anatomy.PARTS: what the run measures and
    prints by the same names at its end). A device whose step-time noise is not measured gives both ends of
    its range; a race, its low and high scenarios."""
    from bench import schema
    from bench.run.estimate import RATES, estimate_parts, replace
    from bench.run.estimate_race import race_parts

    r = config.run
    if race:
        low, high = race_parts(config, cells, gpus=gpus)
        return [f"  race's parts, low: {anatomy.words(low)}",
                f"  race's parts, high: {anatomy.words(high)}"]
    rates = RATES[r.device]
    what = "the grid's" if schema.search(r.search).races else "the estimate's"
    if r.adaptive and rates.half_width_sqrt_n_pct is None:
        low = estimate_parts(config, cells, replace(rates, half_width_sqrt_n_pct=0.0), gpus)
        high = estimate_parts(config, cells, replace(rates, half_width_sqrt_n_pct=float("inf")), gpus)
        return [f"  {what} parts, fewest rounds: {anatomy.words(low)}",
                f"  {what} parts, every group to its cap: {anatomy.words(high)}"]
    return [f"  {what} parts: {anatomy.words(estimate_parts(config, cells, gpus=gpus))}"]


def launch_count(config, runnable: list[Cell], gpus: int) -> int:
    """The sweep's torchrun launches: run.launches per world size, each as many at once as it packs into
    (run.pack: its slots, at most one per unit a slot takes whole)."""
    from bench.run import packing, schedule

    r, count = config.run, 0
    for ws, cells in by_launch(runnable).items():
        n = packing.launches_at_once(r, ws, gpus)
        units = len(schedule.units(cells, schema.search(r.search).races)) if n > 1 else 1
        count += min(n, units) * r.launches
    return count


def packed_words(config, runnable: list[Cell], gpus: int) -> str | None:
    """`--dry-run`: the world sizes run in several launches at once (run.pack), or None."""
    from bench.run import packing

    r = config.run
    counts = {ws: packing.launches_at_once(r, ws, gpus)
              for ws in by_launch(runnable)}
    packed = [f"world size {ws} in {n} launches at once" for ws, n in counts.items() if n > 1]
    if not packed:
        return None
    where = f"each on its own {'GPUs' if r.device == 'cuda' else 'cores'} and share of the host's CPUs"
    return (f"packed (run.pack = {r.pack}): {', '.join(packed)}, {where}; each slot takes whole groups "
            f"(bench/run/packing.py)")


def wall_words(config, cells: list[Cell], gpus: int = 0) -> str:
    """'estimated wall time ~5.8 min' (a range where the device's step-time noise is not measured yet); the
    world sizes packed on a node of `gpus` GPUs (run.pack) at their longest slot."""
    from bench.run.estimate import RATES, estimate_range, estimate_seconds

    r = config.run
    grid = " as a grid" if schema.search(r.search).races else ""
    if r.adaptive and RATES[r.device].half_width_sqrt_n_pct is None:
        low, high = estimate_range(config, cells, gpus=gpus)
        return (f"estimated wall time{grid} {low / 60:.1f}-{high / 60:.1f} min (every adaptive group "
                f"stopping at its minimum rounds … running to its cap: this device's step-time noise is not "
                f"measured yet)")
    return f"estimated wall time{grid} ~{estimate_seconds(config, cells, gpus=gpus) / 60:.1f} min"


def estimate_line(plan: Plan, todo: list[Cell] | None = None) -> str:
    """A sweep's first line: what `--dry-run` estimates for the cells it will run (`todo`: those a resumed
    folder has no record of; default every runnable cell)."""
    fresh = todo is None or len(todo) == len(plan.runnable)
    cells = list(plan.cells) if fresh else todo  # as --dry-run counts them (the skipped ones cost nothing)
    n = len(plan.runnable) if fresh else len(todo)
    line = (f"estimate: {n} cells on {plan.config.run.device}, {wall_words(plan.config, cells, plan.gpus)} "
            f"(`--dry-run` lists them; bench/run/estimate.py)")
    if schema.search(plan.config.run.search).races and cells:
        line += f"; {race_line(plan.config, cells, plan.gpus)}"
    return line


def race_line(config, cells: list[Cell], gpus: int = 0) -> str:
    """`--dry-run` of a racing search: its wall-time range and what the range assumes."""
    from bench.run.estimate_race import race_looks, race_seconds

    r = config.run
    low, high = race_seconds(config, cells, gpus=gpus)
    firsts = sorted({looks[0][0] for looks in race_looks(config, [c for c in cells if not c.skip_reason])
                     if looks})
    at = f"round {firsts[0]}" + (f"-{firsts[-1]}" if len(firsts) > 1 and firsts[-1] != firsts[0] else "") \
        if firsts else "no round (too few candidates or rounds to eliminate any)"
    carry = ("; a configuration raced out in every recipe of a world size not launched at larger ones (from "
             "one rank: its precision and accumulation only)" if schema.search(r.search).carries_over else "")
    return (f"racing (run.search = {r.search}): ~{low / 60:.1f}-{high / 60:.1f} min: every candidate "
            f"stepped to its recipe's first look ({at}, by its number of candidates), then from one "
            f"survivor per recipe (low) to every configuration the rates cannot tell from its recipe's "
            f"fastest within ±{r.target_ci_pct:g} % (high; they give every engine and bucket size the same "
            f"step){carry}")
