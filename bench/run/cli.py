"""`python -m bench run` and `python -m bench slurm`: their arguments, parsed into calls of bench.run's
functions (planner.plan, folder.open_run, runner.sweep / write_plan_only, collector.collect, slurm.prepare
/ submit_and_follow), and after a sweep with --report, pipeline.after_run (analyze → project → advise →
report). Nothing here decides anything the functions do not.

    python -m bench run --config NAME|PATH [--set section.key=value ...] [--out DIR] [--resume]
                        [--search grid|race|race-all-sizes] [--memory-gb GIB]
                        [--dry-run] [--report] [--plan-only [--nnodes N] [--gpus-per-node G]]
                        [--collect DIR]
    python -m bench slurm --config NAME|PATH --nodes N [--ranks-per-node R | --gpus-per-node G]
                          [--cpus-per-node C] [--time HH:MM:SS] [--partition P] [--account A]
                          [--set SECTION.KEY=VALUE ...] [--submit] [--out DIR] [--resume]

`run` exit codes: 0 done (failed cells are recorded, not fatal), 2 bad configuration or folder, 130
interrupted. `slurm`'s: bench/run/slurm.py.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench import run_folder
from bench.config import ConfigError
from bench.run import slurm
from bench.run.collector import collect
from bench.run.folder import RETRYABLE, check_retry, open_run
from bench.run.planner import describe, plan
from bench.run.runner import sweep, write_plan_only
from bench.schema import SEARCHES


def _error(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def run_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="preset name in bench/configs/ (cpu-smoke, default, gpu-node, ...)"
                        " or a path to a TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a key (repeatable; lists comma-separated: matrix.world_size=1,2)")
    parser.add_argument("--out", type=Path, help="run folder (default: results/<preset>-<host>-<timestamp>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out: skip the cells already in its cells.jsonl")
    parser.add_argument("--retry", default="", metavar="STATUS[,STATUS]",
                        help=f"with --resume: run again the recorded cells with these statuses "
                             f"(of {', '.join(RETRYABLE)}); their new record supersedes the old")
    parser.add_argument("--search", choices=SEARCHES, default=None,
                        help="grid: measure every cell fully (the preset's run.search, grid unless it says "
                             "otherwise); race: race each recipe's configurations side by side and eliminate "
                             "the significantly slower ones, world sizes smallest first, not launching at "
                             "larger sizes what a size >= 2 raced out everywhere; race-all-sizes: race every "
                             "world size in full (sets run.search)")
    parser.add_argument("--memory-gb", type=float, default=None, metavar="GIB",
                        help="skip before launch the cells whose per-rank state (parameters, gradients, "
                             "AdamW moments by the engine's layout) exceeds GIB GiB")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the cells and a time estimate; run nothing")
    parser.add_argument("--report", action="store_true", help="build the report (bench.report) at the end")
    parser.add_argument("--plan-only", action="store_true",
                        help="write the run folder and plan.json for your own torchrun/srun, run nothing")
    parser.add_argument("--nnodes", type=int, default=1,
                        help="with --plan-only: nodes the plan will run on (GPU-count check)")
    parser.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                        help="with --plan-only: GPUs on each node the plan will run on (default: this "
                             "machine's); lets a GPU-less login node plan a CUDA run. World sizes above "
                             "--nnodes x G are skipped with the reason (refused unless the preset sets "
                             "run.skip_world_sizes_above_gpus)")
    parser.add_argument("--collect", type=Path, metavar="DIR",
                        help="build cells.jsonl/results.csv of DIR from its workers' events/*.jsonl")


def run_main(args: argparse.Namespace) -> int:
    if args.collect:
        try:
            found = collect(args.collect)
        except ConfigError as e:
            return _error(str(e))
        print(f"collected {found.added} cells into {args.collect / run_folder.RESULTS}; {found.missing} not "
              f"run yet"
              + (f"; env.json describes {len(found.nodes)} node(s): {', '.join(found.nodes)}"
                 if found.nodes else ""))
        return 0
    if not args.config:
        return _error("--config NAME|PATH is required")
    retry = {s.strip() for s in args.retry.split(",") if s.strip()}
    try:
        check_retry(retry, args.resume)  # before the config is loaded: the flags alone are wrong
        planned = plan(args.config, args.set, plan_only=args.plan_only, nnodes=args.nnodes,
                       gpus_per_node=args.gpus_per_node, search=args.search, memory_gb=args.memory_gb)
        if args.dry_run:
            print("\n".join(describe(planned)))
            return 0
        folder = open_run(planned, args.out, args.resume, retry)
    except ConfigError as e:
        return _error(str(e))
    with folder.lock:  # held until the sweep and its report end
        if args.plan_only:
            write_plan_only(folder, planned)
            return 0
        code = sweep(folder, planned)
        if code:
            return code
        from bench.run import pipeline  # pandas and matplotlib load only when a report is asked for

        if not args.report:
            print(f"no report (run without --report); build it with: {pipeline.commands(folder.path)}")
            return 0
        return pipeline.after_run(folder.path)


def slurm_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="preset name or TOML path (as for `bench run`)")
    parser.add_argument("--nodes", type=int, required=True, help="nodes the job asks for")
    per_node = parser.add_mutually_exclusive_group()
    per_node.add_argument("--ranks-per-node", type=int, metavar="R",
                          help="ranks on each node (the CPU form; on GPUs it defaults to --gpus-per-node)")
    per_node.add_argument("--gpus-per-node", type=int, metavar="G",
                          help="GPUs on each node, one rank each (default: this machine's GPUs)")
    parser.add_argument("--cpus-per-node", type=int, metavar="C",
                        help="CPUs of each node for its ranks, passed to every step (default: GPU jobs the "
                             "whole node, --exclusive; CPU ranks one core each)")
    parser.add_argument("--time", default=None, help="the job's time limit, [D-]HH:MM:SS (default: the "
                        "plan's estimate + 25 %%, rounded up to 15 min)")
    parser.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    parser.add_argument("--account", help="SLURM account to charge")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a key (repeatable), as for `bench run`")
    parser.add_argument("--python", metavar="PATH", default=None,
                        help="the Python the nodes run (default: this one; bench slurm warns when its torch "
                             "has no CUDA for a GPU job or it sits on a local filesystem)")
    parser.add_argument("--chdir", metavar="DIR", default=None,
                        help="the clone on the nodes, where the job starts (default: the working directory)")
    parser.add_argument("--submit", action="store_true",
                        help="submit the job (sbatch), follow it, collect its cells when it ends")
    parser.add_argument("--out", type=Path, help="run folder (default: results/<preset>-<host>-<timestamp>)")
    parser.add_argument("--resume", action="store_true",
                        help="re-plan the cells of --out that have no record yet, and rewrite the script")


def slurm_main(args: argparse.Namespace) -> int:
    job = slurm.Job(nodes=args.nodes, time=args.time, ranks_per_node=args.ranks_per_node,
                    gpus_per_node=args.gpus_per_node, partition=args.partition, account=args.account,
                    cpus_per_node=args.cpus_per_node, python=args.python, chdir=args.chdir)
    command = [sys.executable, "-m", "bench", *sys.argv[1:]] if sys.argv[1:2] == ["slurm"] else None
    try:
        written = slurm.prepare(args.config, job, args.set, args.out, args.resume, args.submit, command)
    except ConfigError as e:
        return _error(str(e), slurm.EXIT_BAD_INPUT)
    print(f"run folder: {written.run_dir}  ({written.cells} cells to run in {len(written.steps)} step(s): "
          f"{written.schedule.words()})")
    print(f"sbatch script: {written.script}  (time limit {written.time}: {written.time_source})")
    for warning in written.warnings:
        print(warning, file=sys.stderr)
    if not args.submit:
        print(f"submit it: sbatch {shlex.quote(str(written.script))}    then: python -m bench run --collect "
              f"{shlex.quote(str(written.run_dir))}")
        return 0
    return slurm.submit_and_follow(written.script, written.run_dir, written.cells)
