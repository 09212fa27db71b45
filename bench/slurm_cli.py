"""`python -m bench slurm`: a run on a SLURM cluster — the plan and a filled-in sbatch script in the run
folder, and with --submit the job submitted, followed and collected.

    python -m bench slurm --config NAME|PATH --nodes N [--ranks-per-node R | --gpus-per-node G]
                          [--time HH:MM:SS] [--partition P] [--account A] [--set SECTION.KEY=VALUE ...]
                          [--submit] [--out DIR] [--resume]

The script runs one `srun torchrun` step per world size of the plan (W ranks: W / R nodes × R ranks, or one
node × W ranks when W ≤ R), then `bench run --collect`. Its workers run in plan mode
(bench/worker/plan_mode.py): a failed cell is recorded and the next runs, and a resubmitted plan (--resume)
runs only what is left. While the job runs, --submit shows `bench run`'s progress line from the workers'
events on the shared filesystem; when it ends, it collects the cells and prints the totals.

Exit codes: 0 written (or the job completed), 1 the job failed, 2 bad input (nothing created) or sbatch
refused the job, 3 the job was cancelled, 4 it hit its time limit, 130 interrupted (the job keeps running).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench import results, run_folder
from bench.config import ConfigError, config_from_dict, load_config, read_tables

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_CANCELLED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
# SLURM's job states (squeue(1) "JOB STATE CODES") → this command's exit code, once the job has ended
END_STATES = {"COMPLETED": 0, "CANCELLED": EXIT_CANCELLED, "TIMEOUT": EXIT_TIMEOUT, "DEADLINE": EXIT_TIMEOUT,
              "FAILED": EXIT_FAILED, "NODE_FAIL": EXIT_FAILED, "OUT_OF_MEMORY": EXIT_FAILED,
              "BOOT_FAIL": EXIT_FAILED, "PREEMPTED": EXIT_FAILED}
POLL_S = 2.0              # how often the job's state and the events are read
RDZV_BASE_PORT = 29500    # torchrun's default; the script adds SLURM_JOB_ID % RDZV_PORT_SPREAD
RDZV_PORT_SPREAD = 1000   # so that two jobs whose first nodes are the same machine use different ports
TIME = re.compile(r"^(?:\d+-)?\d{1,3}:[0-5]\d:[0-5]\d$")   # [D-]HH:MM:SS
NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")                   # a partition or account: one word, no quoting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="preset name or TOML path (as for `bench run`)")
    parser.add_argument("--nodes", type=int, required=True, help="nodes the job asks for")
    per_node = parser.add_mutually_exclusive_group()
    per_node.add_argument("--ranks-per-node", type=int, metavar="R",
                          help="ranks on each node (the CPU form; on GPUs it defaults to --gpus-per-node)")
    per_node.add_argument("--gpus-per-node", type=int, metavar="G",
                          help="GPUs on each node, one rank each (default: this machine's GPUs)")
    parser.add_argument("--time", default="01:00:00", help="the job's time limit, [D-]HH:MM:SS (default "
                        "01:00:00)")
    parser.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    parser.add_argument("--account", help="SLURM account to charge")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a key (repeatable), as for `bench run`")
    parser.add_argument("--submit", action="store_true",
                        help="submit the job (sbatch), follow it, collect its cells when it ends")
    parser.add_argument("--out", type=Path, help="run folder (default: results/<preset>-<host>-<timestamp>)")
    parser.add_argument("--resume", action="store_true",
                        help="re-plan the cells of --out that have no record yet, and rewrite the script")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def check_arguments(args: argparse.Namespace) -> None:
    """The values that need no config, each named with its value (ConfigError)."""
    for flag, value in (("--nodes", args.nodes), ("--ranks-per-node", args.ranks_per_node),
                        ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}={value}: must be at least 1")
    if not TIME.match(args.time):
        raise ConfigError(f"--time={args.time!r}: must be HH:MM:SS or D-HH:MM:SS (e.g. 02:00:00)")
    for flag, value in (("--partition", args.partition), ("--account", args.account)):
        if value is not None and not NAME.match(value):
            raise ConfigError(f"--{flag.lstrip('-')}={value!r}: must be one word of letters, digits, '_', "
                              "'.', '+' or '-'")
    if args.resume and args.out is None:
        raise ConfigError("--resume: needs --out DIR (the run folder to continue)")
    if args.submit and shutil.which("sbatch") is None:
        raise ConfigError("--submit: sbatch is not on PATH (run it on the cluster's login node, or leave out "
                          "--submit and submit the script yourself)")


def launch_steps(world_sizes: list[int], nodes: int, per_node: int) -> list[tuple[int, int, int]]:
    """Per world size W, the step that runs it: (W, nodes, ranks per node) — one node × W ranks when
    W ≤ per_node, else W / per_node nodes × per_node ranks. ConfigError for a W the job cannot form."""
    steps = []
    for ws in sorted(set(world_sizes)):
        if ws <= per_node:
            steps.append((ws, 1, ws))
        elif ws % per_node:
            raise ConfigError(f"matrix.world_size={ws}: not a multiple of {per_node} ranks per node (a "
                              f"launch above one node puts {per_node} ranks on each of its nodes)")
        elif ws // per_node > nodes:
            raise ConfigError(f"matrix.world_size={ws}: above the {nodes * per_node} ranks of "
                              f"--nodes={nodes} × {per_node} per node")
        else:
            steps.append((ws, ws // per_node, per_node))
    return steps


def sbatch_script(run_dir: Path, steps: list[tuple[int, int, int]], args: argparse.Namespace,
                  gpus_per_node: int | None, ranks_per_node: int, command: list[str]) -> str:
    """README's sbatch script, filled in: one `srun torchrun` step per world size, then --collect."""
    run = run_dir.resolve()
    py, plan = shlex.quote(sys.executable), shlex.quote(str(run / "plan.json"))
    directives = [f"--job-name=ddpbench-{run.name}"[:64], f"--nodes={args.nodes}", "--ntasks-per-node=1",
                  f"--time={args.time}", f"--output={run / run_folder.LOGS / 'slurm-%j.out'}",
                  f"--chdir={Path.cwd()}"]
    # GPUs: one rank each; CPU ranks: a core each for the one task that torchrun starts them from
    directives.append(f"--gpus-per-node={gpus_per_node}" if gpus_per_node
                      else f"--cpus-per-task={ranks_per_node}")
    directives += [f"--partition={args.partition}"] * bool(args.partition)
    directives += [f"--account={args.account}"] * bool(args.account)
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives),
             f"# written by: {shlex.join(command)}",
             "# A torchrun per world size (a launch runs the plan's cells of its WORLD_SIZE), then collect.",
             "# Re-running this script skips the cells that finished (plan mode: bench/worker/plan_mode.py).",
             'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
             f"PORT=$(({RDZV_BASE_PORT} + SLURM_JOB_ID % {RDZV_PORT_SPREAD}))",
             "rc=0",
             "step() {  # world size, nodes, ranks per node",
             '    echo "== world size $1: $2 node(s) x $3 rank(s)"',
             '    srun --nodes "$2" --ntasks "$2" --ntasks-per-node 1 '
             f'{py} -m torch.distributed.run --nnodes "$2" --nproc-per-node "$3" \\',
             '        --rdzv-id "$SLURM_JOB_ID-ws$1" --rdzv-backend c10d --rdzv-endpoint "$HEAD:$PORT" \\',
             f"        -m bench.worker --plan {plan} || rc=$?",
             "}",
             *(f"step {ws} {n} {r}" for ws, n, r in steps),
             f"{py} -m bench run --collect {shlex.quote(str(run))} || rc=$?",
             "exit $rc"]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    from bench import run_cli

    try:
        check_arguments(args)
        gpus = args.gpus_per_node
        config = load_config(args.config, args.set,
                             cuda_available=(lambda: True) if gpus else run_cli.cuda_for_auto)
        if config.run.device == "cuda" and gpus is None:
            gpus = run_cli._machine(config)[0] or None
            if gpus is None:
                raise ConfigError("run.device='cuda': this machine has no CUDA device; pass --gpus-per-node "
                                  "G (the GPUs of each compute node)")
        if config.run.device == "cpu" and args.gpus_per_node:
            raise ConfigError(f"--gpus-per-node={args.gpus_per_node}: run.device is 'cpu'; use "
                              "--ranks-per-node R for CPU ranks")
        per_node = args.ranks_per_node or gpus or 1
        steps = launch_steps(list(config.matrix.world_size), args.nodes, per_node)
    except ConfigError as e:
        return _error(str(e))
    # `bench run --plan-only` makes the folder, env.json, the skipped cells' records and plan.json
    plan_args = argparse.Namespace(
        config=args.config, set=args.set, out=args.out, resume=args.resume, retry="", dry_run=False,
        report=False, plan_only=True, nnodes=args.nodes, gpus_per_node=gpus, collect=None)
    if plan_args.out is None:
        plan_args.out = run_cli.default_run_dir(run_cli.resolve_path(args.config).stem)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        rc = run_cli.main(plan_args)
    if rc:
        return rc
    run_dir = plan_args.out
    plan = json.loads((run_dir / "plan.json").read_text())
    command = [sys.executable, "-m", "bench", *sys.argv[1:]] if sys.argv[1:2] == ["slurm"] else \
        ["python", "-m", "bench", "slurm", "..."]
    script = run_dir / run_folder.SBATCH
    (run_dir / run_folder.LOGS).mkdir(exist_ok=True)  # the job's --output goes there: SLURM makes no folder
    script.write_text(sbatch_script(run_dir, steps, args, gpus if config.run.device == "cuda" else None,
                                    per_node, command))
    print(f"run folder: {run_dir}  ({len(plan['cells'])} cells to run in {len(steps)} step(s): "
          + ", ".join(f"world size {w} on {n} node(s) x {r}" for w, n, r in steps) + ")")
    print(f"sbatch script: {script}")
    if not args.submit:
        print(f"submit it: sbatch {script}    then: python -m bench run --collect {run_dir}")
        return 0
    return submit_and_follow(script, run_dir, len(plan["cells"]))


def submit_and_follow(script: Path, run_dir: Path, n_cells: int) -> int:
    """sbatch the script, follow the job to its end with the progress line, collect, report; the exit code
    says how the job ended (END_STATES)."""
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if submitted.returncode != 0:
        return _error(f"sbatch refused {script}: {submitted.stderr.strip()}")
    job = submitted.stdout.strip().split(";")[0]
    (run_dir / run_folder.LOGS / "slurm-job-id").write_text(job + "\n")
    print(f"submitted job {job}; following it (Ctrl-C stops following, not the job)")
    try:
        state = follow(job, run_dir, n_cells)
    except KeyboardInterrupt:
        print(f"\ninterrupted: job {job} keeps running; scancel {job} stops it; "
              f"python -m bench run --collect {run_dir} collects what finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    from bench import run_cli

    with contextlib.redirect_stdout(io.StringIO()):
        collected = run_cli.main(argparse.Namespace(collect=run_dir))
    counts = Counter(r["status"] for r in results.read_records(run_dir))
    totals = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"job {job} {state}: {sum(counts.values())} cells recorded of {n_cells} planned"
          + (f": {totals}" if totals else ""))
    print(f"results: {run_dir / results.CSV_FILE}   job log: {run_dir / run_folder.LOGS}/slurm-{job}.out")
    if collected:
        print(f"warning: --collect {run_dir} exited with {collected}", file=sys.stderr)
    code = END_STATES.get(state, EXIT_FAILED)
    if code:
        print(f"continue it: python -m bench slurm --resume --out {run_dir} --submit (with the same "
              "--config, --set and --nodes)", file=sys.stderr)
    return code


def job_state(job: str) -> str | None:
    """The job's state from `scontrol show job` (None once slurmctld has forgotten it)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    found = re.search(r"\bJobState=(\S+)", out.stdout)
    return found.group(1) if found else None


def outcome_ids(event: dict) -> list[str]:
    """The cells an event ends: a "finish", or an "error" outside a profiled pass."""
    if event["event"] == "finish":
        return [event["cell_id"]]
    if event["event"] == "error" and event.get("phase") != "profile":
        return event.get("cell_ids", [])
    return []


def follow(job: str, run_dir: Path, n_cells: int) -> str:
    """Poll the job's state and the workers' events until the job ends; returns its end state."""
    from bench.launch import EventReader, summary_line
    from bench.matrix import Cell
    from bench.progress import Progress

    config = config_from_dict(read_tables(run_dir / run_folder.CONFIG))
    plan = json.loads((run_dir / "plan.json").read_text())
    cells = {c["cell_id"]: Cell.from_dict(c) for c in plan["cells"]}
    progress = Progress(total=n_cells)
    readers: dict[Path, EventReader] = {}
    seen: set[str] = set()
    state = last = None
    try:
        while True:
            state = job_state(job) or "UNKNOWN"
            if state != last:
                progress.note(f"job {job}: {state}")
                last = state
            for path in sorted((run_dir / run_folder.EVENTS).glob("*.jsonl")):
                for ev in readers.setdefault(path, EventReader(path)).read():
                    if ev["event"] == "start":
                        progress.start("running " + ", ".join(ev["cell_ids"]))
                    for cell_id in outcome_ids(ev):
                        if cell_id in cells and cell_id not in seen:
                            seen.add(cell_id)
                            record = results.record_from_event(cells[cell_id], config, ev)
                            progress.finish(summary_line(record))
            if state in END_STATES or state == "UNKNOWN":
                return state
            time.sleep(POLL_S)
    finally:
        progress.close()
