"""A run on a SLURM cluster (`python -m bench slurm`, parsed in bench/run/cli.py): the plan and a filled-in
sbatch script in the run folder (`prepare`), and the job submitted, followed and collected
(`submit_and_follow`).

    python -m bench slurm --config NAME|PATH --nodes N [--ranks-per-node R | --gpus-per-node G]
                          [--cpus-per-node C] [--time HH:MM:SS] [--partition P] [--account A]
                          [--set SECTION.KEY=VALUE ...] [--python PATH] [--chdir DIR] [--submit] [--out DIR]
                          [--resume]

The script runs one `srun torchrun` step per world size of the plan (W ranks: W / R nodes × R ranks, or one
node × W ranks when W ≤ R; the one-node ones in lanes at the same time, one a node; a one-node W that
packs (run.pack: bench/run/packing.py) as several steps at once on its node, each on its own GPUs and
CPUs with its share of the cells: `packed_shares`), then `bench run --collect`. Where each step runs is
the scheduler's (bench/run/schedule.py job_schedule); the job's flags are checked in
bench/run/slurm_job.py and the script is written by bench/run/slurm_script.py. Its workers run in
plan mode (bench/worker/plan_mode.py): a failed cell is recorded and the next runs, and a resubmitted plan
(--resume) runs only what is left. While the job runs, --submit shows `bench run`'s progress line from the
workers' events on the shared filesystem; when it ends, it collects the cells and prints the totals.

What a new user would otherwise learn the hard way: the job asks for CPUs and hands them to every step
(since SLURM 22.05 srun does not inherit sbatch's --cpus-per-task, so 8 ranks would share one core); the
rendezvous port is a free one on the first node; NCCL's INFO log is written per world size for --collect's
`nccl_transport`; the time limit comes from the plan's estimate; nodes the plan cannot use are refused;
and a run folder on a filesystem the nodes do not share is warned about. The script runs the nodes'
interpreter and clone (`--python`, `--chdir`; default this machine's own): it warns when that interpreter
is this machine's and its torch has no CUDA for a GPU job, or when either sits on a local filesystem.

Exit codes: 0 written (or the job completed), 1 the job failed, 2 bad input (nothing created) or sbatch
refused the job, 3 the job was cancelled, 4 it hit its time limit, 130 interrupted (the job keeps running).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from bench import run_folder
from bench.config import ConfigError, config_from_dict, read_tables
from bench.run import results
from bench.run.checks import machine
from bench.run.collector import collect
from bench.run.folder import open_run
from bench.run.planner import Plan, plan
from bench.run.runner import write_plan_only
from bench.run.schedule import JobSchedule, Step, job_schedule, launch_steps, slot_count
from bench.run.slurm_job import TIME_MARGIN, Job, check_nodes, nodes_warnings, shared_fs_warning, time_limit
from bench.run.slurm_script import directive, sbatch_script

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_CANCELLED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
# SLURM's job states (squeue(1) "JOB STATE CODES") → this command's exit code, once the job has ended
END_STATES = {"COMPLETED": 0, "CANCELLED": EXIT_CANCELLED, "TIMEOUT": EXIT_TIMEOUT, "DEADLINE": EXIT_TIMEOUT,
              "FAILED": EXIT_FAILED, "NODE_FAIL": EXIT_FAILED, "OUT_OF_MEMORY": EXIT_FAILED,
              "BOOT_FAIL": EXIT_FAILED, "PREEMPTED": EXIT_FAILED}
POLL_S = 2.0              # how often the job's state and the events are read


@dataclass(frozen=True)
class Prepared:
    """A written job: its run folder, sbatch script, the steps it runs, how many cells it plans, its time
    limit and where that came from, and warnings for the user."""

    run_dir: Path
    script: Path
    steps: list[Step]
    schedule: JobSchedule
    cells: int
    time: str = ""
    time_source: str = ""
    warnings: tuple[str, ...] = ()


def check_input(job: Job, out: Path | None, resume: bool, submit: bool) -> None:
    """What needs no config, refused before anything is made (ConfigError): the job's flags and the paths
    the #SBATCH lines name."""
    job.check(submit)
    for path in (out, Path(job.chdir) if job.chdir else Path.cwd()):
        if path is not None:
            directive(str(path))
    if resume and out is None:
        raise ConfigError("--resume: needs --out DIR (the run folder to continue)")


def job_plan(config: str, job: Job, overrides: list[str]) -> tuple[Plan, int | None]:
    """The plan for the job's nodes and their GPUs (None: a CPU job): a GPU-less login node plans for its
    compute nodes, "auto" meaning cuda once --gpus-per-node is given; without it, this machine's GPUs."""
    gpus = job.gpus_per_node
    planned = plan(config, overrides, plan_only=True, nnodes=job.nodes, gpus_per_node=gpus) if gpus else None
    if planned is None:
        planned = plan(config, overrides, plan_only=True, nnodes=job.nodes)
        if planned.config.run.device == "cuda":
            gpus = machine(planned.config)[0] or None
            if gpus is None:
                raise ConfigError("run.device='cuda': this machine has no CUDA device; pass --gpus-per-node "
                                  "G (the GPUs of each compute node)")
            planned = plan(config, overrides, plan_only=True, nnodes=job.nodes, gpus_per_node=gpus)
    if planned.config.run.device == "cpu" and job.gpus_per_node:
        raise ConfigError(f"--gpus-per-node={job.gpus_per_node}: run.device is 'cpu'; use --ranks-per-node R "
                          "for CPU ranks")
    return planned, gpus


@dataclass(frozen=True)
class Node:
    """One node of the job as the packing sees it: its GPUs (None on CPU) and CPUs (None: whole nodes,
    counted by the script)."""

    gpus: int | None
    cpus: int | None


def packed_shares(config, steps: list[Step], runnable: list, node: Node) -> dict[int, list[list]]:
    """The one-node world sizes a node runs in several launches at once (run.pack, bench/run/packing.py:
    its GPUs, or on CPU (`on` only) its cores, None when unknown: whole nodes), each one's share of its
    cells (estimate.slot_shares, the split `bench run` makes); world sizes that do not pack are left out. A
    step over several nodes never packs: it has its nodes to itself."""
    from bench.run.estimate import slot_shares

    r, out = config.run, {}
    for ws, nodes, _ in steps:
        if nodes > 1 or (r.device == "cpu" and not node.cpus):
            continue
        n = slot_count(r.pack, r.device, ws, node.gpus or 0, node.cpus or 0, r.threads_per_rank)
        parts = slot_shares(config, [c for c in runnable if c.world_size == ws], n) if n > 1 else []
        if len(parts) > 1:
            out[ws] = parts
    return out


def step_seconds(once, steps: list[Step], shares: dict[int, list[list]],
                 runnable: list) -> dict[int, tuple[float, float]]:
    """Each world size's (fewest, most) seconds by the estimate: a packed world size costs its longest
    launch (each one's fixed and cell seconds)."""
    from bench.run.estimate import estimate_range

    return {ws: tuple(max(part) for part in zip(*(estimate_range(once, share) for share in
                                                  shares.get(ws) or [[c for c in runnable
                                                                      if c.world_size == ws]])))
            for ws, _, _ in steps}


def job_time(job: Job, schedule: JobSchedule, per_step: dict[int, tuple[float, float]],
             launches: int) -> tuple[str, str]:
    """The job's --time and where it came from: the user's, or the estimate's critical path (the longest
    lane, then the spanning steps) with TIME_MARGIN."""
    if job.time is not None:
        return job.time, "--time"
    low = schedule.seconds({ws: lo for ws, (lo, _) in per_step.items()})
    high = schedule.seconds({ws: hi for ws, (_, hi) in per_step.items()})
    how = [w for w, applies in (("its lanes at the same time", len(schedule.lanes) > 1),
                                ("one launch a cell (run.launches is bench run's)", launches > 1)) if applies]
    return time_limit(high), (f"the plan's estimate, {low / 60:.0f}-{high / 60:.0f} min"
                              f"{' with ' + ' and '.join(how) if how else ''}, + "
                              f"{TIME_MARGIN - 1:.0%} (bench.run.estimate; --time sets it)")


def prepare(config: str, job: Job, overrides: list[str] = (), out: Path | None = None, resume: bool = False,
            submit: bool = False, command: list[str] | None = None) -> Prepared:
    """The run folder of a SLURM job (`bench run --plan-only`'s: folder, env.json, skipped cells, plan.json)
    and its filled-in sbatch script; ConfigError naming the key and the value, before anything is created."""
    check_input(job, out, resume, submit)
    planned, gpus = job_plan(config, job, overrides)
    per_node = job.ranks_per_node or gpus or 1
    steps = launch_steps(list(planned.config.matrix.world_size), job.nodes, per_node)
    # each world size's (fewest, most) seconds: the lanes are spread by the most, and the job's time is its
    # critical path (the longest lane, then the spanning steps), not the sum. A plan run times each cell in
    # one launch (plan mode has no launcher to repeat it), whatever run.launches asks of `bench run`.
    once = replace(planned.config, run=replace(planned.config.run, launches=1))
    node = Node(gpus=gpus if once.run.device == "cuda" else None,
                cpus=job.cpus_per_node or (None if gpus else per_node))
    shares = packed_shares(once, steps, planned.runnable, node)
    per_step = step_seconds(once, steps, shares, planned.runnable)
    most = {ws: high for ws, (_, high) in per_step.items()}
    schedule = job_schedule(steps, job.nodes, most, {ws: len(parts) for ws, parts in shares.items()})
    warnings = [w for w in (check_nodes(steps, schedule, job, per_node, list(overrides)),) if w]
    time_limit_, time_source = job_time(job, schedule, per_step, planned.config.run.launches)
    folder = open_run(planned, out, resume)
    try:
        if resume:  # a resubmitted plan packs what is left: no launch for a share that finished
            todo = {c.cell_id for c in folder.todo(planned)}
            shares = packed_shares(once, steps, [c for c in planned.runnable if c.cell_id in todo], node)
            schedule = job_schedule(steps, job.nodes, most, {ws: len(parts) for ws, parts in shares.items()})
        write_plan_only(folder, planned, quiet=True,
                        slots={ws: [[c.cell_id for c in share] for share in parts]
                               for ws, parts in shares.items()})
    finally:
        folder.lock.close()
    gpus = gpus if planned.config.run.device == "cuda" else None
    script = write_script(folder.path, schedule, replace(job, time=time_limit_), gpus, per_node, command)
    warnings += [w for w in (shared_fs_warning(folder.path),) if w] + nodes_warnings(job, gpus)
    cells = len(json.loads((folder.path / run_folder.PLAN).read_text())["cells"])
    return Prepared(run_dir=folder.path, script=script, steps=steps, schedule=schedule, cells=cells,
                    time=time_limit_, time_source=time_source, warnings=tuple(warnings))


def write_script(run_dir: Path, schedule: JobSchedule, job: Job, gpus: int | None, per_node: int,
                 command: list[str] | None) -> Path:
    """The job's sbatch script in its run folder (and the logs folder its --output goes to: SLURM makes no
    folder)."""
    script = run_dir / run_folder.SBATCH
    (run_dir / run_folder.LOGS).mkdir(exist_ok=True)
    script.write_text(sbatch_script(run_dir, schedule, job, gpus, per_node,
                                    command or ["python", "-m", "bench", "slurm", "..."]))
    return script


def submit_and_follow(script: Path, run_dir: Path, n_cells: int) -> int:
    """sbatch the script, follow the job to its end with the progress line, collect, report; the exit code
    says how the job ended (END_STATES)."""
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if submitted.returncode != 0:
        print(f"error: sbatch refused {script}: {submitted.stderr.strip()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job = submitted.stdout.strip().split(";")[0]
    (run_dir / run_folder.LOGS / run_folder.SLURM_JOB_ID).write_text(job + "\n")
    print(f"submitted job {job}; following it (Ctrl-C stops following, not the job)")
    try:
        state = follow(job, run_dir, n_cells)
    except KeyboardInterrupt:
        print(f"\ninterrupted: job {job} keeps running; scancel {job} stops it; "
              f"python -m bench run --collect {shlex.quote(str(run_dir))} collects what finished",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        collect(run_dir)
        collected = ""
    except ConfigError as e:
        collected = str(e)
    counts = Counter(r["status"] for r in results.read_records(run_dir))
    totals = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"job {job} {state}: {sum(counts.values())} cells recorded of {n_cells} planned"
          + (f": {totals}" if totals else ""))
    print(f"results: {run_dir / run_folder.RESULTS}   job log: {run_dir / run_folder.LOGS}/slurm-{job}.out")
    if collected:
        print(f"warning: --collect {run_dir} failed: {collected}", file=sys.stderr)
    code = END_STATES.get(state, EXIT_FAILED)
    if code:
        print(f"continue it: python -m bench slurm --resume --out {shlex.quote(str(run_dir))} --submit (with "
              "the same --config, --set and --nodes)", file=sys.stderr)
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
    from bench.matrix import Cell
    from bench.run.progress import Progress, summary_line
    from bench.worker.events import EventReader

    config = config_from_dict(read_tables(run_dir / run_folder.CONFIG))
    planned = json.loads((run_dir / run_folder.PLAN).read_text())
    cells = {c["cell_id"]: Cell.from_dict(c) for c in planned["cells"]}
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
