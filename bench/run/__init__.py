"""The launcher side of `bench run` and `bench slurm`: everything that runs outside the ranks to plan a
sweep, open its run folder, launch it world size by world size, follow it and record every cell.

    planner   the preset → a checked `Plan` (config, cells); `describe` for --dry-run
    estimate  the --dry-run wall-time estimate (per-device rates, expected adaptive rounds)
    estimate_race  the same for a racing search: its (low, high) range
    schedule  the pure scheduler: launch order, launches at once and their shares, a SLURM job's lanes
    packing   the node's side of launches at once: each slot's GPUs, CPUs and environment
    checks    what needs the machine: GPUs present, precisions, CPU ranks per core, usable CUDA
    folder    the run folder opened: created or resumed, locked, env.json, skipped cells recorded
    runner    the sweep into it, or plan.json for the user's own torchrun
    sweep     the launches in the scheduler's order, each world size's lanes at once, every outcome recorded
    launch    one torchrun launch: its command, its events followed, the watchdog, relaunch after faults
    launch_log  a launch's capped logs and what they say about how it ended
    plan_file plan.json, the worker's input (LaunchWork: cells, profiled cells, passes, budget, slot)
    merge     a cell's launches merged into its record (LaunchRecords)
    results   a cell's record (cells.jsonl, the source of truth) and results.csv
    progress  the progress line, and the line per finished cell
    collector `--collect`: records from a plan run's events, env.json merged from its nodes
    slurm     `bench slurm`: the job prepared (plan, packing, time limit), submitted, followed, collected
    slurm_job the job's flags checked, its time limit, the nodes it would leave idle, warnings
    slurm_script  the sbatch script written from the job's schedule
    nccl_log  NCCL's debug variables per launch and the transports its log says it chose
    pipeline  after a sweep with --report: analyze → project → advise → report, as functions
    cli       `python -m bench run` / `slurm`: arguments parsed into the calls above

The ranks (bench/worker/) import nothing from here; the launcher reads their events through
bench.worker.events, the one module of the worker it imports. The API, in a sweep's order:

    planned = plan("cpu-smoke", ["matrix.world_size=1,2"])   # Plan (ConfigError: nothing created)
    folder = open_run(planned, Path("results/x"))            # RunFolder (created, locked)
    sweep(folder, planned)                                   # exit code (or write_plan_only(folder, planned))
    pipeline.after_run(folder.path)                          # analyze, project, advise, report
    collect(Path("results/x"))                               # a plan run's records
"""

from __future__ import annotations


def __getattr__(name: str):
    """The API above, imported on first use (the submodules import torch-free but heavy config code)."""
    places = {"plan": "planner", "Plan": "planner", "describe": "planner", "open_run": "folder",
              "RunFolder": "folder", "sweep": "runner", "write_plan_only": "runner", "collect": "collector"}
    if name in places:
        import importlib

        return getattr(importlib.import_module(f"bench.run.{places[name]}"), name)
    raise AttributeError(f"module 'bench.run' has no attribute {name!r}")
