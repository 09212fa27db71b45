"""The cost anatomy: where a run's wall time goes (docs/design.md "Cost anatomy").

The list of its parts (PARTS, defined here only), the arithmetic that shares a group's or a
launch's seconds among its cells, and the table every stage prints. The ranks (bench/worker/cell.py,
main.py) measure the cell parts, the launcher (bench/run/launch.py, runner.py) the launch and run parts
(RUN/anatomy.json), the --dry-run estimate (bench/run/estimate.py) predicts them by the same names, and
the report reads them back (each row's `anatomy_s` in cells.jsonl).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

# name → (scope, what it holds). Scope: "run" (once per bench run, the launcher's), "launch" (per torchrun
# launch), "cell" (per cell, measured on rank 0 around each phase of its group: a phase the cells of a group
# run side by side is shared among those that entered it, `share`).
PARTS: dict[str, tuple[str, str]] = {
    "start": ("run", "the launcher before its first launch: the plan, the run folder, env.json"),
    "spawn": ("launch", "torchrun started, every rank's Python, torch and bench imported (until its hello)"),
    "rendezvous": ("launch", "the process group formed, the ranks' free memory agreed, the groups planned"),
    "build": ("cell", "its trainer built: model, engine wrap, optimizer, data staged"),
    "warmup": ("cell", "run.warmup_steps rounds (a compiled cell's compile included)"),
    "timed": ("cell", "the timed rounds (a race's up to its elimination)"),
    "analysis": ("cell", "the rank-0 statistics between rounds: warm-up test, stopping rule, race looks"),
    "phase": ("cell", "the checks after the rounds: the phase pass, losses, the row's timed columns"),
    "gate": ("cell", "the parity gates (bench/worker/parity.py), their references built"),
    "compute_only": ("cell", "the compute-only rounds (no gradient sync)"),
    "probe": ("cell", "the all-reduce probe, work per step, the engine's buckets"),
    "memory": ("cell", "its peak-memory pass: a fresh trainer alone, MEMORY_STEPS steps"),
    "profile": ("cell", "its profiled pass: a fresh trainer, warm-up, profiled steps, the trace export"),
    "other": ("cell", "the rest of its group's time: events written, trainers released, agreements"),
    "teardown": ("launch", "from the launch's last event to its processes' exit"),
    "writing": ("run", "the launcher writing cells.jsonl and results.csv after each cell (while the ranks "
                       "go on: not added to the total)"),
}
# parts the launcher spends while the ranks work: they overlap the others and are not added to a total
CONCURRENT = ("writing",)
CELL_PARTS = tuple(p for p, (scope, _) in PARTS.items() if scope == "cell")
LAUNCH_PARTS = tuple(p for p, (scope, _) in PARTS.items() if scope == "launch")
RUN_PARTS = tuple(p for p, (scope, _) in PARTS.items() if scope == "run")


def known(name: str) -> str:
    """`name`, checked to be one of PARTS (a misspelt part would be a part of its own)."""
    if name not in PARTS:
        raise KeyError(f"anatomy part {name!r} is not one of {', '.join(PARTS)}")
    return name


def share(seconds: float, ids: Sequence[str], weights: Sequence[float] | None = None) -> dict[str, float]:
    """A shared phase's seconds among the cells that ran it: in proportion to `weights` (a race's timed
    rounds: the rounds each stepped), evenly without (or when every weight is 0). Worked: 6 s over a, b, c
    with rounds 10, 10, 40 → 1, 1, 4."""
    if not ids:
        return {}
    if weights is None or not sum(weights):
        return {i: seconds / len(ids) for i in ids}
    total = float(sum(weights))
    return {i: seconds * w / total for i, w in zip(ids, weights, strict=True)}


def add(into: dict[str, float], part: str, seconds: float) -> dict[str, float]:
    """`into[part] += seconds` (part checked against PARTS); returns `into`."""
    into[known(part)] = into.get(part, 0.0) + seconds
    return into


def total(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The parts of several cells or launches summed, in PARTS order."""
    out: dict[str, float] = {}
    for one in parts:
        for part, seconds in (one or {}).items():
            add(out, part, seconds)
    return {p: out[p] for p in PARTS if p in out}


def table(parts: Mapping[str, float], wall_s: float | None = None) -> list[str]:
    """The anatomy as lines: 'part  seconds  share of the total (of the wall time when given)', in
    PARTS order, then the total, and with `wall_s` what the parts do not cover."""
    summed = added(parts)
    whole = wall_s if wall_s else summed
    lines = []
    for part in PARTS:
        if parts.get(part):
            pct = f"{100 * parts[part] / whole:5.1f} %" if whole else ""
            lines.append(f"  {part:<13}{parts[part]:8.1f} s  {pct}" + ("  (meanwhile, not in the total)"
                                                                       if part in CONCURRENT else ""))
    lines.append(f"  {'total':<13}{summed:8.1f} s" + (f"  of {wall_s:.1f} s wall (unaccounted "
                                                       f"{wall_s - summed:.1f} s)" if wall_s else ""))
    return lines


def added(parts: Mapping[str, float]) -> float:
    """The seconds the parts add up to: all but the CONCURRENT ones."""
    return sum(v for p, v in parts.items() if p not in CONCURRENT)


def words(parts: Mapping[str, float]) -> str:
    """One line: 'build 3.1 s, warmup 5.0 s, ...' in PARTS order (what the dry run prints)."""
    return ", ".join(f"{p} {parts[p]:.1f} s" for p in PARTS if parts.get(p))
