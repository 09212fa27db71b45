"""A run on a SLURM cluster (`python -m bench slurm`, parsed in bench/run/cli.py): the plan and a filled-in
sbatch script in the run folder (`prepare`), and the job submitted, followed and collected
(`submit_and_follow`).

    python -m bench slurm --config NAME|PATH --nodes N [--ranks-per-node R | --gpus-per-node G]
                          [--cpus-per-node C] [--time HH:MM:SS] [--partition P] [--account A]
                          [--set SECTION.KEY=VALUE ...] [--python PATH] [--chdir DIR] [--submit] [--out DIR]
                          [--resume]

The script runs one `srun torchrun` step per world size of the plan (W ranks: W / R nodes × R ranks, or one
node × W ranks when W ≤ R; the one-node ones in lanes at the same time, one a node: Schedule; a one-node
W that packs (run.pack: bench/run/packing.py) as several steps at once on its node, each on its own GPUs
and CPUs with its share of the cells: `packed_shares`), then `bench run --collect`. Its workers run in
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
import math
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from bench import run_folder
from bench.config import ConfigError, config_from_dict, read_tables
from bench.run import packing, results
from bench.run.checks import machine
from bench.run.collector import collect
from bench.run.folder import open_run
from bench.run.planner import plan
from bench.run.runner import write_plan_only

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_CANCELLED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
# SLURM's job states (squeue(1) "JOB STATE CODES") → this command's exit code, once the job has ended
END_STATES = {"COMPLETED": 0, "CANCELLED": EXIT_CANCELLED, "TIMEOUT": EXIT_TIMEOUT, "DEADLINE": EXIT_TIMEOUT,
              "FAILED": EXIT_FAILED, "NODE_FAIL": EXIT_FAILED, "OUT_OF_MEMORY": EXIT_FAILED,
              "BOOT_FAIL": EXIT_FAILED, "PREEMPTED": EXIT_FAILED}
POLL_S = 2.0              # how often the job's state and the events are read
# The rendezvous port of a step over several nodes: one the first node's kernel hands out as free, asked for
# by the batch script, which SLURM runs on that node (sbatch(1): "on the first node in the set of allocated
# nodes"); such a step starts there (srun --relative 0). A port derived from the job id could be in use. A
# one-node step (its lane on node i) makes its own there: torchrun --standalone, c10d on a free local port.
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
# Time limit from the plan's estimate: its upper end (every group at its cap) plus TIME_MARGIN for what
# the estimate does not see (node start-up, a slower filesystem; the estimate is checked within 25 %),
# rounded up to TIME_STEP_S.
TIME_MARGIN = 1.25
TIME_STEP_S = 15 * 60
# Filesystems a node has to itself: a run folder there is not seen by the job's other nodes (nor, from a
# login node, by any compute node). /proc/mounts' type names.
LOCAL_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs", "overlay", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs")
# [D-]HH:MM:SS, hours below 24 after "D-"
TIME = re.compile(r"^(?:\d{1,3}-(?:[01]?\d|2[0-3])|\d{1,4}):[0-5]\d:[0-5]\d$")
MAX_CPUS_PER_NODE = 8192  # Linux's most CPUs in one machine (CONFIG_NR_CPUS with MAXSMP)
NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")                   # a partition or account: one word, no quoting
PLAIN = re.compile(r"^[A-Za-z0-9_./%+=:,@-]+$")            # an #SBATCH value that needs no quotes


@dataclass(frozen=True)
class Job:
    """What the sbatch script asks SLURM for: nodes, ranks or GPUs per node, the time limit, where to run."""

    nodes: int
    time: str | None = None   # None: from the plan's estimate (time_limit)
    ranks_per_node: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    account: str | None = None
    cpus_per_node: int | None = None  # None: GPU jobs take whole nodes (--exclusive); CPU ranks one core each
    python: str | None = None  # the interpreter on the nodes (None: this one, sys.executable)
    chdir: str | None = None   # the clone on the nodes, where the steps start (None: the working directory)

    def check(self, submit: bool = False) -> None:
        """The values that need no config, each named with its value (ConfigError)."""
        for flag, value in (("--nodes", self.nodes), ("--ranks-per-node", self.ranks_per_node),
                            ("--gpus-per-node", self.gpus_per_node), ("--cpus-per-node", self.cpus_per_node)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag}={value}: must be at least 1")
        if self.cpus_per_node is not None and self.cpus_per_node > MAX_CPUS_PER_NODE:
            raise ConfigError(f"--cpus-per-node={self.cpus_per_node}: must be at most {MAX_CPUS_PER_NODE} "
                              "(the most CPUs a Linux node has)")
        if self.time is not None and not TIME.match(self.time):
            raise ConfigError(f"--time={self.time!r}: must be HH:MM:SS or D-HH:MM:SS, hours below 24 after "
                              "'D-' (e.g. 02:00:00)")
        for flag, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not NAME.match(value):
                raise ConfigError(f"--{flag.lstrip('-')}={value!r}: must be one word of letters, digits, "
                                  "'_', '.', '+' or '-'")
        if submit and shutil.which("sbatch") is None:
            raise ConfigError("--submit: sbatch is not on PATH (run it on the cluster's login node, or leave "
                              "out --submit and submit the script yourself)")


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
    return steps  # nodes no step uses: check_nodes


Step = tuple[int, int, int]  # (world size, nodes, ranks per node): launch_steps


@dataclass(frozen=True)
class Schedule:
    """When and where each step runs. The steps on one node run in `lanes`, lane i on the job's node i, the
    lanes at the same time (eight 1-GPU and 2-GPU world sizes need not wait on one node while the others
    idle); a lane shares nothing with another but the filesystem, each on a node of its own. The steps over
    several nodes (`spanning`) run after every lane has ended, one after another, from node 0."""

    lanes: tuple[tuple[Step, ...], ...]
    spanning: tuple[Step, ...]
    # one-node world sizes packed on their node (bench/run/packing.py): (world size, launches at once), each
    # launch its own srun step on its own GPUs and CPUs, all at once (`packed_shares`)
    packed: tuple[tuple[int, int], ...] = ()

    def at_once(self, ws: int) -> int:
        """How many launches of world size `ws` run at once on its node (1: not packed)."""
        return dict(self.packed).get(ws, 1)

    def seconds(self, per_step: dict[int, float]) -> float:
        """The job's wall time for each world size's `per_step` seconds: the longest lane, then the rest."""
        lane = max((sum(per_step[ws] for ws, _, _ in steps) for steps in self.lanes), default=0.0)
        return lane + sum(per_step[ws] for ws, _, _ in self.spanning)

    def nodes_used(self) -> int:
        return max([len(self.lanes), *(n for _, n, _ in self.spanning)])

    def words(self) -> str:
        """'world sizes 1, 8 on node 0 | 2, 4 on node 1 (at the same time); then 16 on 2 nodes × 8'."""
        parts = []
        if self.lanes:
            parts.append(" | ".join(f"world size{'s' * (len(steps) > 1)} "
                                    f"{', '.join(self._size(w) for w, _, _ in steps)} on node {i}"
                                    for i, steps in enumerate(self.lanes))
                         + (" (at the same time)" if len(self.lanes) > 1 else ""))
        parts += [f"world size {w} on {n} nodes × {r}" for w, n, r in self.spanning]
        return "; then ".join(parts)

    def _size(self, ws: int) -> str:
        return f"{ws} ({self.at_once(ws)} launches at once)" if self.at_once(ws) > 1 else str(ws)


def spread(steps: list[Step], nodes: int, per_step: dict[int, float]) -> Schedule:
    """The one-node steps spread over min(nodes, their count) lanes, the longest first onto the lane that
    ends soonest (by each world size's estimated seconds, `per_step`; a lane's steps run smallest world
    size first), the spanning steps after them in order."""
    single = sorted((s for s in steps if s[1] == 1), key=lambda s: (-per_step[s[0]], s[0]))
    lanes: list[list[Step]] = [[] for _ in range(min(nodes, len(single)))]
    for step in single:
        min(lanes, key=lambda lane: (sum(per_step[w] for w, _, _ in lane), len(lane))).append(step)
    return Schedule(lanes=tuple(tuple(sorted(lane)) for lane in lanes),
                    spanning=tuple(s for s in steps if s[1] > 1))


def directive(value: str) -> str:
    """A value as an #SBATCH line carries it: sbatch reads directives itself, not through a shell (Slurm's
    src/sbatch/opt.c get_argument: whitespace ends an argument, quotes group, a backslash escapes the next
    character, an unquoted '#' starts a comment), so anything beyond plain path characters is put in double
    quotes with '"' and '\\' escaped. A newline cannot be carried: ConfigError."""
    if "\n" in value or "\r" in value:
        raise ConfigError(f"{value!r}: a path with a line break cannot go into an #SBATCH line")
    if PLAIN.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_script(run_dir: Path, schedule: Schedule, job: Job, gpus_per_node: int | None,
                  ranks_per_node: int, command: list[str]) -> str:
    """README's sbatch script, filled in: one `srun torchrun` step per world size (the one-node ones in
    their lanes at the same time, each lane on its own node: Schedule), then --collect."""
    run = run_dir.resolve()
    py, plan_file = shlex.quote(job.python or sys.executable), shlex.quote(str(run / run_folder.PLAN))
    directives = [f"--job-name={directive(f'ddpbench-{run.name}'[:64])}", f"--nodes={job.nodes}",
                  "--ntasks-per-node=1", f"--time={job.time or '01:00:00'}",
                  f"--output={directive(str(run / run_folder.LOGS / run_folder.SLURM_OUTPUT))}",
                  f"--chdir={directive(job.chdir or str(Path.cwd()))}"]
    # The one task per node (torchrun) gets the node's CPUs for its ranks: a GPU job the whole node unless
    # --cpus-per-node says how many; CPU ranks a core each. srun is told again (it does not inherit it).
    if gpus_per_node:
        directives.append(f"--gpus-per-node={gpus_per_node}")
    cpus = job.cpus_per_node or (None if gpus_per_node else ranks_per_node)
    directives.append(f"--cpus-per-task={cpus}" if cpus else "--exclusive")
    step_cpus = str(cpus) if cpus else '"$SLURM_CPUS_ON_NODE"'
    directives += [f"--partition={job.partition}"] * bool(job.partition)
    directives += [f"--account={job.account}"] * bool(job.account)
    nccl = []
    if gpus_per_node:  # NCCL's INFO log per world size, for --collect's nccl_transport; the user's own kept
        log = shlex.quote(str(run / run_folder.LOGS / run_folder.nccl_plan_log_file("@WS@")))
        nccl = ['BENCH_NCCL_LOG=""',
                'if [ -z "${NCCL_DEBUG+x}${NCCL_DEBUG_SUBSYS+x}${NCCL_DEBUG_FILE+x}" ]; then',
                '    export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH',
                f"    BENCH_NCCL_LOG={log}",
                "fi"]
    # a comment: a line break in an argument would end it and start a command line
    written_by = shlex.join(command).replace("\n", "\\n").replace("\r", "\\r")
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives),
             f"# written by: {written_by}",
             "# A torchrun per world size (a launch runs the plan's cells of its WORLD_SIZE), then collect.",
             "# Re-running this script skips the cells that finished (plan mode: bench/worker/plan_mode.py).",
             'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)  # this node: the batch host',
             *nccl,
             "rc=0",
             "step() {  # world size, nodes, ranks per node, its first node (0: this one), launches at once",
             '    if [ "${5:-1}" -gt 1 ]; then packed "$@"; return; fi',
             '    echo "== world size $1: $2 node(s) x $3 rank(s) from node $4"',
             '    if [ "$2" -eq 1 ]; then  # one node: a rendezvous of its own there, on a port free there',
             "        RDZV=(--standalone)",
             "    else  # from node 0, this one: the rendezvous here",
             f'        PORT=$({py} -c "{FREE_PORT}")  # free on this node now',
             '        RDZV=(--nnodes "$2" --rdzv-id "$SLURM_JOB_ID-ws$1" --rdzv-backend c10d '
             '--rdzv-endpoint "$HEAD:$PORT")',
             "    fi",
             *(['    [ -n "$BENCH_NCCL_LOG" ] && export NCCL_DEBUG_FILE="${BENCH_NCCL_LOG/@WS@/$1}"']
               if nccl else []),
             '    srun --nodes "$2" --ntasks "$2" --ntasks-per-node 1 --relative "$4" \\',
             f"        --cpus-per-task {step_cpus} \\",
             f'        {py} -m torch.distributed.run "${{RDZV[@]}}" --nproc-per-node "$3" \\',
             f"        -m bench.worker --plan {plan_file} || rc=$?",
             "}",
             "packed() {  # world size, 1, ranks, node, launches at once: each its share (--slot)",
             "    # of the cells, its own GPUs (--gres: SLURM gives a step its own, in CUDA_VISIBLE_DEVICES)",
             "    # and CPUs (--exact), the job's memory shared (--mem=0: srun(1) --mem-per-cpu), at once",
             f'    local i cpus=$(( {cpus or "SLURM_CPUS_ON_NODE"} / $5 )) steps=()',
             '    [ "$cpus" -ge 1 ] || cpus=1',
             '    echo "== world size $1: $5 launches at once on node $4, $3 rank(s) and $cpus CPUs each"',
             *(['    [ -n "$BENCH_NCCL_LOG" ] && export NCCL_DEBUG_FILE="${BENCH_NCCL_LOG/@WS@/$1}"']
               if nccl else []),
             '    for ((i = 0; i < $5; i++)); do',
             '        srun --nodes 1 --ntasks 1 --relative "$4" --exact --mem=0 --cpus-per-task "$cpus" \\',
             *(['            --gres=gpu:"$1" \\'] if gpus_per_node else []),
             f'            {py} -m torch.distributed.run --standalone --nproc-per-node "$3" \\',
             f'            -m bench.worker --plan {plan_file} --slot "$i" &',
             '        steps+=($!)',
             "    done",
             '    for s in "${steps[@]}"; do wait "$s" || rc=$?; done',
             "}",
             *lane_lines(schedule),
             f"{py} -m bench run --collect {shlex.quote(str(run))} || rc=$?",
             "exit $rc"]
    return "\n".join(lines) + "\n"


def lane_lines(schedule: Schedule) -> list[str]:
    """The script's step calls: one lane's in a row; several lanes each in a background subshell on its
    node, waited for (a failed step's code kept) before the spanning steps."""
    if len(schedule.lanes) <= 1:
        lines = [step_call(schedule, st, 0) for lane in schedule.lanes for st in lane]
    else:
        lines = ["# one lane a node, at the same time: they share nothing but the filesystem", "LANES=()"]
        for i, steps in enumerate(schedule.lanes):
            lines.append(f"( {'; '.join(step_call(schedule, st, i) for st in steps)}; exit $rc ) & "
                         "LANES+=($!)")
        lines.append('for lane in "${LANES[@]}"; do wait "$lane" || rc=$?; done')
    return lines + [step_call(schedule, st, 0) for st in schedule.spanning]


def step_call(schedule: Schedule, step: Step, node: int) -> str:
    """The script's call of one step on its node: `step W N R NODE`, and the launches at once when packed."""
    ws, n, r = step
    at_once = schedule.at_once(ws)
    return f"step {ws} {n} {r} {node}" + (f" {at_once}" if at_once > 1 else "")


def packed_shares(config, steps: list[Step], runnable: list, gpus: int | None,
                  cpus: int | None) -> dict[int, list[list]]:
    """The one-node world sizes a node runs in several launches at once (run.pack, bench/run/packing.py:
    `gpus` GPUs a node, or on CPU (`on` only) `cpus` cores, None when unknown: whole nodes), each one's
    share of its cells (estimate.slot_shares, the split `bench run` makes); world sizes that do not pack
    are left out. A step over several nodes never packs: it has its nodes to itself."""
    from bench.run.estimate import slot_shares

    r, out = config.run, {}
    for ws, nodes, _ in steps:
        if nodes > 1 or (r.device == "cpu" and not cpus):
            continue
        n = packing.slot_count(r.pack, r.device, ws, gpus or 0, cpus or 0, r.threads_per_rank)
        parts = slot_shares(config, [c for c in runnable if c.world_size == ws], n) if n > 1 else []
        if len(parts) > 1:
            out[ws] = parts
    return out


def time_limit(seconds: float) -> str:
    """The job's --time for an estimate of `seconds`: TIME_MARGIN more, rounded up to TIME_STEP_S."""
    total = max(TIME_STEP_S, math.ceil(seconds * TIME_MARGIN / TIME_STEP_S) * TIME_STEP_S)
    days, rest = divmod(int(total), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


def filesystem_of(path: Path, mounts: str | None = None) -> tuple[str, str] | None:
    """(type, mount point) of the filesystem holding `path`: the longest mount point above it in `mounts`
    (/proc/mounts' text; None where that is not readable: not Linux)."""
    try:
        mounts = Path("/proc/mounts").read_text() if mounts is None else mounts
    except OSError:
        return None
    target, best = path.resolve(), None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = Path(parts[1].replace("\\040", " "))
        if (target == point or point in target.parents) and (best is None or len(str(point)) > len(best[1])):
            best = (parts[2], str(point))
    return best


def shared_fs_warning(run_dir: Path) -> str | None:
    """A warning when the run folder sits on a filesystem only this machine has (LOCAL_FILESYSTEMS): the
    compute nodes read plan.json and write their events there."""
    found = filesystem_of(run_dir)
    if found is None or found[0] not in LOCAL_FILESYSTEMS:
        return None
    return (f"warning: the run folder {run_dir} is on a {found[0]} filesystem mounted at {found[1]}, which "
            "other machines do not see: unless the job runs on this very machine, its nodes cannot read "
            "plan.json nor write their events there. Put --out on a filesystem every node mounts "
            "(your cluster's shared home or scratch).")


def nodes_warnings(job: Job, gpus: int | None) -> list[str]:
    """What the script would run on the nodes that may not be there: this machine's interpreter (its torch
    without CUDA for a GPU job), an interpreter or a clone on a filesystem only this machine has."""
    out = []
    if gpus and job.python is None:
        import torch

        if not torch.version.cuda:
            out.append(f"warning: the script runs {sys.executable} (this machine's Python), whose torch "
                       f"{torch.__version__} has no CUDA, on {gpus}-GPU nodes: every cell would fail there. "
                       f"Give the nodes' interpreter with --python PATH (e.g. the venv of your clone on the "
                       f"shared filesystem)")
    for flag, what, path in (("--python", "the interpreter", job.python or sys.executable),
                             ("--chdir", "the clone", job.chdir or str(Path.cwd()))):
        found = filesystem_of(Path(path)) if Path(path).exists() else None
        if found is not None and found[0] in LOCAL_FILESYSTEMS:
            out.append(f"warning: the script runs {what} {path}, on a {found[0]} filesystem mounted at "
                       f"{found[1]} that other machines do not see: give its path on the nodes' shared "
                       f"filesystem with {flag}")
    return out


@dataclass(frozen=True)
class Prepared:
    """A written job: its run folder, sbatch script, the steps it runs, how many cells it plans, its time
    limit and where that came from, and warnings for the user."""

    run_dir: Path
    script: Path
    steps: list[Step]
    schedule: Schedule
    cells: int
    time: str = ""
    time_source: str = ""
    warnings: tuple[str, ...] = ()


def check_nodes(steps: list[Step], schedule: Schedule, job: Job, per_node: int,
                overrides: list[str]) -> str | None:
    """Nodes the job would hold idle: a ConfigError when the preset's world sizes need fewer than --nodes
    (an 8-node job for world sizes up to 8 on 8 GPUs a node: 4 lanes, 4 nodes booked for nothing), a
    warning when the user chose those world sizes (--set matrix.world_size) and may mean it."""
    used = schedule.nodes_used()
    if used >= job.nodes:
        return None
    sizes = ",".join(str(ws) for ws, _, _ in steps)
    text = (f"--nodes={job.nodes}: the world sizes {sizes} use at most {used} node(s) of {per_node} ranks, "
            f"so {job.nodes - used} node(s) would sit idle for the whole job")
    if any(o.split("=", 1)[0].strip() == "matrix.world_size" for o in overrides):
        return f"warning: {text}"
    raise ConfigError(f"{text}; ask for --nodes {used}, or add world sizes that span them "
                      f"(--set matrix.world_size={sizes},{job.nodes * per_node})")


def prepare(config: str, job: Job, overrides: list[str] = (), out: Path | None = None, resume: bool = False,
            submit: bool = False, command: list[str] | None = None) -> Prepared:
    """The run folder of a SLURM job (`bench run --plan-only`'s: folder, env.json, skipped cells, plan.json)
    and its filled-in sbatch script; ConfigError naming the key and the value, before anything is created."""
    job.check(submit)
    for path in (out, Path(job.chdir) if job.chdir else Path.cwd()):  # named by #SBATCH lines: refused
        if path is not None:                                           # before anything is made
            directive(str(path))
    if resume and out is None:
        raise ConfigError("--resume: needs --out DIR (the run folder to continue)")
    gpus = job.gpus_per_node
    # a GPU-less login node plans for its compute nodes: "auto" means cuda once --gpus-per-node is given
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
    per_node = job.ranks_per_node or gpus or 1
    steps = launch_steps(list(planned.config.matrix.world_size), job.nodes, per_node)
    from bench.run.estimate import estimate_range

    # each world size's (fewest, most) seconds: the lanes are spread by the most, and the job's time is its
    # critical path (the longest lane, then the spanning steps), not the sum. A plan run times each cell in
    # one launch (plan mode has no launcher to repeat it), whatever run.launches asks of `bench run`.
    once = replace(planned.config, run=replace(planned.config.run, launches=1))
    node_gpus = gpus if once.run.device == "cuda" else None
    node_cpus = job.cpus_per_node or (None if gpus else per_node)  # None: whole nodes, counted by the script
    shares = packed_shares(once, steps, planned.runnable, node_gpus, node_cpus)
    # a packed world size costs its longest launch (each one's fixed and cell seconds)
    per_step = {ws: tuple(max(part) for part in zip(*(estimate_range(once, share) for share in
                                                      shares.get(ws) or [[c for c in planned.runnable
                                                                          if c.world_size == ws]])))
                for ws, _, _ in steps}
    schedule = replace(spread(steps, job.nodes, {ws: high for ws, (_, high) in per_step.items()}),
                       packed=tuple((ws, len(parts)) for ws, parts in sorted(shares.items())))
    warnings = [w for w in (check_nodes(steps, schedule, job, per_node, list(overrides)),) if w]
    time_limit_, time_source = job.time, "--time"
    if time_limit_ is None:
        low = schedule.seconds({ws: lo for ws, (lo, _) in per_step.items()})
        high = schedule.seconds({ws: hi for ws, (_, hi) in per_step.items()})
        time_limit_ = time_limit(high)
        how = [w for w, applies in (("its lanes at the same time", len(schedule.lanes) > 1),
                                    ("one launch a cell (run.launches is bench run's)",
                                     planned.config.run.launches > 1)) if applies]
        time_source = (f"the plan's estimate, {low / 60:.0f}-{high / 60:.0f} min"
                       f"{' with ' + ' and '.join(how) if how else ''}, + "
                       f"{TIME_MARGIN - 1:.0%} (bench.run.estimate; --time sets it)")
    folder = open_run(planned, out, resume)
    try:
        if resume:  # a resubmitted plan packs what is left: no launch for a share that finished
            todo = {c.cell_id for c in folder.todo(planned)}
            shares = packed_shares(once, steps, [c for c in planned.runnable if c.cell_id in todo],
                                   node_gpus, node_cpus)
            schedule = replace(schedule, packed=tuple((ws, len(p)) for ws, p in sorted(shares.items())))
        write_plan_only(folder, planned, quiet=True,
                        slots={ws: [[c.cell_id for c in share] for share in parts]
                               for ws, parts in shares.items()})
    finally:
        folder.lock.close()
    run_dir = folder.path
    cells = len(json.loads((run_dir / run_folder.PLAN).read_text())["cells"])
    script = run_dir / run_folder.SBATCH
    (run_dir / run_folder.LOGS).mkdir(exist_ok=True)  # the job's --output goes there: SLURM makes no folder
    gpus = gpus if planned.config.run.device == "cuda" else None
    script.write_text(sbatch_script(run_dir, schedule, replace(job, time=time_limit_), gpus, per_node,
                                    command or ["python", "-m", "bench", "slurm", "..."]))
    warnings += [w for w in (shared_fs_warning(run_dir),) if w] + nodes_warnings(job, gpus)
    return Prepared(run_dir=run_dir, script=script, steps=steps, schedule=schedule, cells=cells,
                    time=time_limit_, time_source=time_source, warnings=tuple(warnings))


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
    from bench.run.launch import summary_line
    from bench.run.progress import Progress
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
