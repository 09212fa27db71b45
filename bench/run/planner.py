"""What a run will measure, decided before anything is created: the preset loaded with its overrides,
checked against the machine (or, for a plan made on a login node, against the nodes it names), and expanded
into cells. Everything here raises ConfigError (one line naming the key and the value, exit 2) and writes
nothing.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from bench.config import BenchConfig, ConfigError, load_config, resolve_path
from bench.matrix import Cell, by_launch, expand
from bench.run import checks


@dataclass(frozen=True)
class Plan:
    """A validated run: its resolved config, every cell of its matrix in sweep order (skipped ones carry
    their reason), and the preset's name, which names the run folder."""

    config: BenchConfig
    cells: tuple[Cell, ...]
    preset: str

    @property
    def runnable(self) -> list[Cell]:
        return [c for c in self.cells if not c.skip_reason]

    def profiled(self, cells: list[Cell] | None = None) -> list[Cell]:
        """The cells (of `cells`, default the runnable ones) that get a profiled pass."""
        cells = self.runnable if cells is None else cells
        return [c for c in cells if self.config.profile.covers(c.cell_id)]


def plan(config: str, overrides: list[str] = (), *, plan_only: bool = False, nnodes: int = 1,
         gpus_per_node: int | None = None) -> Plan:
    """Load the preset `config` (a name or a TOML path) with `--set` overrides, check it against the machine
    and expand its cells. With `plan_only` and `gpus_per_node`, the check is against `nnodes` × that many
    GPUs rather than this machine's (a GPU-less login node planning a CUDA run). Warnings that do not stop
    the run (CPU ranks sharing cores, timing-relevant variables) go to stderr."""
    for flag, value in (("--nnodes", nnodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}={value}: must be at least 1")
    if gpus_per_node is not None and not plan_only:
        raise ConfigError(f"--gpus-per-node={gpus_per_node}: only with --plan-only (a run uses this "
                          "machine's GPUs)")
    # --plan-only --gpus-per-node G plans for the compute nodes, not for this (maybe GPU-less) machine:
    # "auto" resolves to cuda, and the world sizes are checked against --nnodes × G.
    planned_gpus = gpus_per_node if plan_only else None
    resolved = load_config(config, list(overrides),
                           cuda_available=(lambda: True) if planned_gpus else checks.cuda_for_auto)
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
    cells = expand(resolved, bf16_supported=bf16_ok, gpu_count=None if plan_only else gpu_count)
    return Plan(config=resolved, cells=tuple(cells), preset=resolve_path(config).stem)


def describe(plan: Plan) -> list[str]:
    """`--dry-run`: a line per cell, then the totals and the time estimate (bench/run/estimate.py)."""
    from bench.run.estimate import estimate_seconds, expected_rounds

    config, cells = plan.config, list(plan.cells)
    runnable, profiled = plan.runnable, {c.cell_id for c in plan.profiled()}
    lines = [f"{'skip' if cell.skip_reason else 'run ':4}  {cell.cell_id}"
             + (f"  ({cell.skip_reason})" if cell.skip_reason else "")
             + ("  [profiled]" if cell.cell_id in profiled else "") for cell in cells]
    est = estimate_seconds(config, cells)
    r = config.run
    lines.append(f"each cell timed in {r.launches} launches (run.launches), in an order shuffled with "
                 "run.seed; the intervals hold the variance between them" if r.launches > 1 else
                 "each cell timed in one launch (run.launches = 1): the variance between launches stays "
                 "unknown")
    lines.append(f"{len(runnable)} cells to run ({len(profiled)} profiled), {len(cells) - len(runnable)} "
                 f"skipped, {len(by_launch(runnable)) * config.run.launches} launches; "
                 f"estimated wall time ~{est / 60:.1f} min "
                 f"(bench.run.estimate.RATES: calibrated on a 2-core CPU and one H100; GPU all-reduce speed "
                 f"assumed)")
    if r.adaptive and runnable:
        rounds = sorted(expected_rounds(config, cells))
        median = rounds[len(rounds) // 2]
        lines.append(f"timed rounds per cell expected: {rounds[0]}-{rounds[-1]} (median {median}), "
                     f"until ±{r.target_ci_pct:g} % (run.target_ci_pct), at most {r.max_timed_steps} rounds "
                     f"or {r.max_group_s:g} s a group")
    return lines
