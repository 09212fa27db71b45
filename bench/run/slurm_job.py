"""What a SLURM job asks for (`bench slurm`'s flags as a Job), checked before anything is made: each flag's
value, the nodes the plan cannot use, the time limit from the plan's estimate, and warnings about what the
nodes may not have (a run folder, an interpreter or a clone on a filesystem only this machine sees; this
machine's torch without CUDA for a GPU job). bench/run/slurm.py prepares and follows the job.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.config import ConfigError
from bench.run.schedule import JobSchedule, Step

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


def time_limit(seconds: float) -> str:
    """The job's --time for an estimate of `seconds`: TIME_MARGIN more, rounded up to TIME_STEP_S."""
    total = max(TIME_STEP_S, math.ceil(seconds * TIME_MARGIN / TIME_STEP_S) * TIME_STEP_S)
    days, rest = divmod(int(total), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


def check_nodes(steps: list[Step], schedule: JobSchedule, job: Job, per_node: int,
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
