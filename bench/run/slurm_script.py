"""The sbatch script of a SLURM job (`bench slurm`), written from its JobSchedule (bench/run/schedule.py): the
#SBATCH directives, NCCL's INFO log per world size, a shell function per kind of step (one torchrun over
its nodes; a packed world size's launches at once, each its own srun step), the lanes' calls, then
`bench run --collect`. tests/test_slurm.py pins its text and runs it against a fake srun.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import run_folder
from bench.config import ConfigError
from bench.run.schedule import JobSchedule, Step
from bench.run.slurm_job import Job

# The rendezvous port of a step over several nodes: one the first node's kernel hands out as free, asked for
# by the batch script, which SLURM runs on that node (sbatch(1): "on the first node in the set of allocated
# nodes"); such a step starts there (srun --relative 0). A port derived from the job id could be in use. A
# one-node step (its lane on node i) makes its own there: torchrun --standalone, c10d on a free local port.
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
PLAIN = re.compile(r"^[A-Za-z0-9_./%+=:,@-]+$")            # an #SBATCH value that needs no quotes


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


@dataclass(frozen=True)
class Steps:
    """What the script's step functions are filled in with: the nodes' interpreter and the plan (both
    quoted), the CPUs a node's task gets (None: the whole node, $SLURM_CPUS_ON_NODE), and whether it is a
    GPU job (NCCL's log per world size; a packed step's GPUs asked for with --gres)."""

    py: str
    plan_file: str
    cpus: int | None
    gpus: bool


def directives(run: Path, job: Job, gpus_per_node: int | None, cpus: int | None) -> list[str]:
    """The #SBATCH directives: name, nodes, one task a node, time, output, working directory, GPUs, CPUs
    (or the whole node), partition and account."""
    out = [f"--job-name={directive(f'ddpbench-{run.name}'[:64])}", f"--nodes={job.nodes}",
           "--ntasks-per-node=1", f"--time={job.time or '01:00:00'}",
           f"--output={directive(str(run / run_folder.LOGS / run_folder.SLURM_OUTPUT))}",
           f"--chdir={directive(job.chdir or str(Path.cwd()))}"]
    if gpus_per_node:
        out.append(f"--gpus-per-node={gpus_per_node}")
    out.append(f"--cpus-per-task={cpus}" if cpus else "--exclusive")
    out += [f"--partition={job.partition}"] * bool(job.partition)
    out += [f"--account={job.account}"] * bool(job.account)
    return out


def nccl_lines(run: Path) -> list[str]:
    """NCCL's INFO log per world size, for --collect's nccl_transport; the user's own NCCL_DEBUG kept."""
    log = shlex.quote(str(run / run_folder.LOGS / run_folder.nccl_plan_log_file("@WS@")))
    return ['BENCH_NCCL_LOG=""',
            'if [ -z "${NCCL_DEBUG+x}${NCCL_DEBUG_SUBSYS+x}${NCCL_DEBUG_FILE+x}" ]; then',
            '    export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH',
            f"    BENCH_NCCL_LOG={log}",
            "fi"]


def step_function(s: Steps) -> list[str]:
    """`step W N R NODE [AT_ONCE]`: one torchrun over N nodes from node NODE (a packed one: `packed`)."""
    step_cpus = str(s.cpus) if s.cpus else '"$SLURM_CPUS_ON_NODE"'
    return ["step() {  # world size, nodes, ranks per node, its first node (0: this one), launches at once",
            '    if [ "${5:-1}" -gt 1 ]; then packed "$@"; return; fi',
            '    echo "== world size $1: $2 node(s) x $3 rank(s) from node $4"',
            '    if [ "$2" -eq 1 ]; then  # one node: a rendezvous of its own there, on a port free there',
            "        RDZV=(--standalone)",
            "    else  # from node 0, this one: the rendezvous here",
            f'        PORT=$({s.py} -c "{FREE_PORT}")  # free on this node now',
            '        RDZV=(--nnodes "$2" --rdzv-id "$SLURM_JOB_ID-ws$1" --rdzv-backend c10d '
            '--rdzv-endpoint "$HEAD:$PORT")',
            "    fi",
            *(['    [ -n "$BENCH_NCCL_LOG" ] && export NCCL_DEBUG_FILE="${BENCH_NCCL_LOG/@WS@/$1}"']
              if s.gpus else []),
            '    srun --nodes "$2" --ntasks "$2" --ntasks-per-node 1 --relative "$4" \\',
            f"        --cpus-per-task {step_cpus} \\",
            f'        {s.py} -m torch.distributed.run "${{RDZV[@]}}" --nproc-per-node "$3" \\',
            f"        -m bench.worker --plan {s.plan_file} || rc=$?",
            "}"]


def packed_function(s: Steps) -> list[str]:
    """`packed W 1 R NODE AT_ONCE`: a packed world size's launches at once, each its own srun step."""
    return ["packed() {  # world size, 1, ranks, node, launches at once: each its share (--slot)",
            "    # of the cells, its own GPUs (--gres: SLURM gives a step its own, in CUDA_VISIBLE_DEVICES)",
            "    # and CPUs (--exact), the job's memory shared (--mem=0: srun(1) --mem-per-cpu), at once",
            f'    local i cpus=$(( {s.cpus or "SLURM_CPUS_ON_NODE"} / $5 )) steps=()',
            '    [ "$cpus" -ge 1 ] || cpus=1',
            '    echo "== world size $1: $5 launches at once on node $4, $3 rank(s) and $cpus CPUs each"',
            *(['    [ -n "$BENCH_NCCL_LOG" ] && export NCCL_DEBUG_FILE="${BENCH_NCCL_LOG/@WS@/$1}"']
              if s.gpus else []),
            '    for ((i = 0; i < $5; i++)); do',
            '        srun --nodes 1 --ntasks 1 --relative "$4" --exact --mem=0 --cpus-per-task "$cpus" \\',
            *(['            --gres=gpu:"$1" \\'] if s.gpus else []),
            f'            {s.py} -m torch.distributed.run --standalone --nproc-per-node "$3" \\',
            f'            -m bench.worker --plan {s.plan_file} --slot "$i" &',
            '        steps+=($!)',
            "    done",
            '    for s in "${steps[@]}"; do wait "$s" || rc=$?; done',
            "}"]


def sbatch_script(run_dir: Path, schedule: JobSchedule, job: Job, gpus_per_node: int | None,
                  ranks_per_node: int, command: list[str]) -> str:
    """README's sbatch script, filled in: one `srun torchrun` step per world size (the one-node ones in
    their lanes at the same time, each lane on its own node: JobSchedule), then --collect."""
    run = run_dir.resolve()
    # The one task per node (torchrun) gets the node's CPUs for its ranks: a GPU job the whole node unless
    # --cpus-per-node says how many; CPU ranks a core each. srun is told again (it does not inherit it).
    cpus = job.cpus_per_node or (None if gpus_per_node else ranks_per_node)
    steps = Steps(py=shlex.quote(job.python or sys.executable),
                  plan_file=shlex.quote(str(run / run_folder.PLAN)), cpus=cpus, gpus=bool(gpus_per_node))
    # a comment: a line break in an argument would end it and start a command line
    written_by = shlex.join(command).replace("\n", "\\n").replace("\r", "\\r")
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives(run, job, gpus_per_node, cpus)),
             f"# written by: {written_by}",
             "# A torchrun per world size (a launch runs the plan's cells of its WORLD_SIZE), then collect.",
             "# Re-running this script skips the cells that finished (plan mode: bench/worker/plan_mode.py).",
             'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)  # this node: the batch host',
             *(nccl_lines(run) if gpus_per_node else []),
             "rc=0",
             *step_function(steps),
             *packed_function(steps),
             *lane_lines(schedule),
             f"{steps.py} -m bench run --collect {shlex.quote(str(run))} || rc=$?",
             "exit $rc"]
    return "\n".join(lines) + "\n"


def lane_lines(schedule: JobSchedule) -> list[str]:
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


def step_call(schedule: JobSchedule, step: Step, node: int) -> str:
    """The script's call of one step on its node: `step W N R NODE`, and the launches at once when packed."""
    ws, n, r = step
    at_once = schedule.at_once(ws)
    return f"step {ws} {n} {r} {node}" + (f" {at_once}" if at_once > 1 else "")
