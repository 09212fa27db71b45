"""A sweep into an open run folder: one launch per world size (bench/run/sweep.py), a progress line per cell,
the totals at the end; or, for the user's own torchrun or srun, the plan file instead of the launches.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from bench import anatomy, run_folder
from bench.run import results
from bench.run.folder import RunFolder
from bench.run.planner import Plan, estimate_line
from bench.schema import TRACE_GLOB, MiB, search


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def counts_words(plan: Plan, todo: list) -> str:
    """'32 cells to run, 2 skipped' on a fresh run; a resumed one adds how many it has already done."""
    skipped = len(plan.cells) - len(plan.runnable)
    done = len(plan.runnable) - len(todo)
    parts = [f"{len(todo)} cell{'' if len(todo) == 1 else 's'} to run"]
    parts += ([f"{done} done before"] if done else []) + ([f"{skipped} skipped"] if skipped else [])
    return ", ".join(parts)


def nothing_raced_out(records: list[dict]) -> str:
    """Why a race eliminated nothing: no recipe had two configurations that finished, or none was slower
    than another beyond the race's test (bench/race.py) in the rounds it ran."""
    from bench.race import RACE_ALPHA, recipe

    ok = Counter(recipe(r) for r in records if r.get("status") == "ok")
    raced = sum(1 for n in ok.values() if n >= 2)
    if not raced:
        return ("race: nothing raced out, as no recipe (global batch at a world size) had two configurations "
                "that finished to race against each other")
    each = "the recipe" if raced == 1 else f"each of the {raced} recipes"
    return (f"race: nothing raced out: in {each} with two or more configurations, none was slower than "
            f"another beyond the race's test ({RACE_ALPHA * 100:g} % family-wise per recipe) in the rounds "
            f"it ran, so every configuration was measured fully, as the grid would")


def sweep(folder: RunFolder, plan: Plan) -> int:
    """Run the plan's cells that `folder` has no record of and print the totals. The exit code: 0 done
    (failed cells are recorded, not fatal), 1 the folder stopped taking writes, 130 interrupted (Ctrl-C or
    SIGTERM)."""
    from bench.run.progress import Progress
    from bench.run.sweep import Sweep

    t_entry = time.perf_counter()
    run_dir, config, todo = folder.path, plan.config, folder.todo(plan)
    print(estimate_line(plan, todo), flush=True)  # first: how long this will take, before it starts
    print(f"run folder: {run_dir}  ({counts_words(plan, todo)})")
    progress = Progress(total=0, profiled=len(plan.profiled(todo)),
                        unit="cells" if config.run.launches == 1 else "cell launches")
    runner = Sweep(config, run_dir, progress, fresh=folder.retried, gpus=plan.gpus)
    progress.total = runner.measurements(todo)
    t0 = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops as cleanly as Ctrl-C
    try:
        stats = runner.run(todo)
    except OSError as e:  # the run folder stopped taking writes (disk full, read-only): keep what finished
        progress.close()
        print(f"error: cannot write to {e.filename or run_dir} ({e.strerror or e}); the cells finished "
              f"before it are in {run_dir / run_folder.CELLS}. Free space, then continue with --resume --out "
              f"{run_dir} (--retry failed,timeout also re-runs those)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.close()
        print(f"interrupted: finished cells are in {run_dir / run_folder.CELLS}; "
              f"continue with --resume --out {run_dir}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    progress.close()
    wall = time.perf_counter() - t0
    records = results.read_records(run_dir)
    age = process_age_s(t_entry)
    first = runner.first_spawn if runner.first_spawn is not None else time.perf_counter()
    write_anatomy(run_dir, runner, records, wall + (t0 - t_entry) + age, age + first - t_entry)
    counts = Counter(r["status"] for r in records)
    print(f"done in {wall:.1f} s, {stats.launches} launches: "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if search(config.run.search).races and not counts.get("raced_out"):
        print(nothing_raced_out(records))
    if stats.cells:
        beyond_steps, beyond_timed = stats.wall_s - stats.steps_s, stats.wall_s - stats.timed_s
        print(f"overhead per cell beyond its measured steps: mean {beyond_steps / stats.cells:.2f} s"
              f" (beyond the timed steps only: {beyond_timed / stats.cells:.2f} s;"
              f" launch start-up amortised; {stats.cells} {progress.unit})")
    print_anatomy(run_dir)
    print(f"results: {run_dir / run_folder.RESULTS}")
    if config.profile.enabled:
        traces = list((run_dir / run_folder.TRACES).glob(f"*/{TRACE_GLOB}"))
        print(f"traces: {len(traces)} files, {sum(t.stat().st_size for t in traces) / MiB:.1f} MiB "
              f"in {run_dir / run_folder.TRACES}")
    return 0


def process_age_s(at: float) -> float:
    """Seconds this process had run at perf_counter() `at` (Linux: /proc/self/stat's start time), the
    launcher's start-up, planning and folder included; 0 where it cannot be read."""
    try:
        import os

        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK") - (time.perf_counter() - at))
    except (OSError, ValueError, IndexError):
        return 0.0


def write_anatomy(run_dir: Path, runner, records: list[dict], wall_s: float, start_s: float) -> dict:
    """RUN/anatomy.json: this `bench run`'s wall time and where it went (anatomy.PARTS): its run and
    launch parts, its cells' parts summed (each cell's own in its row's `anatomy_s`), and what none
    covers. `start` is the wall time before the first launch (the process's own start included)."""
    import json


    launches = runner.launch_anatomy
    run_parts = {"start": max(0.0, start_s)} | dict(runner.anatomy)
    cells = anatomy.total(r.get("anatomy_s") or {} for r in records)
    parts = anatomy.total([run_parts, *(x["parts"] for x in launches), cells])
    out = {"wall_s": wall_s, "parts": parts, "run": run_parts, "launches": launches, "cells": len(records),
           "part_scopes": {p: anatomy.PARTS[p][0] for p in parts}}
    (run_dir / run_folder.ANATOMY).write_text(json.dumps(out, indent=1) + "\n")
    return out


def print_anatomy(run_dir: Path) -> None:
    """The measured anatomy, as the dry run printed the estimate's parts."""
    import json


    data = json.loads((run_dir / run_folder.ANATOMY).read_text())
    print(f"where the time went ({run_folder.ANATOMY}; per cell: each row's anatomy_s):")
    for line in anatomy.table(data["parts"], data["wall_s"]):
        print(line)


def write_plan_only(folder: RunFolder, plan: Plan, quiet: bool = False,
                    slots: dict[int, list[list[str]]] | None = None) -> Path:
    """plan.json for the user's own torchrun/srun (bench/worker/plan_mode.py): the cells without a record,
    to run on every node; prints how to launch it and collect it unless `quiet`. `slots`: per packed world
    size, the cell ids of each of its launches at once (bench slurm's packed steps; `--slot I` runs the
    I-th)."""
    from bench.run.plan_file import LaunchWork, write_plan

    todo = folder.todo(plan)
    path = folder.path / run_folder.PLAN
    write_plan(path, plan.config, folder.path, LaunchWork(todo, plan.profiled(todo)), launcher_pid=None,
               slots=slots)
    if quiet:
        return path
    if plan.config.run.launches > 1:  # nobody here runs the plan again: the between-launch spread is unknown
        print(f"note: run.launches={plan.config.run.launches} does not apply to a plan run: your torchrun or "
              "srun times each cell once, and its rows say their between-launch variance is unknown")
    print(f"wrote {path} ({len(todo)} cells to run; re-running it skips the cells that finished). "
          "On every node, per world size N = nodes × GPUs per node:")
    print(f"  torchrun --nnodes $NNODES --nproc-per-node $GPUS --rdzv-backend c10d "
          f"--rdzv-endpoint $HEAD:29500 -m bench.worker --plan {path}")
    print(f"then: python -m bench run --collect {shlex.quote(str(folder.path))}")
    return path
