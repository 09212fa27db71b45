"""What a rank does differently when the user's own torchrun or srun runs the plan (no `bench run` launcher
watching): there is nobody to relaunch after a failure, to remember which cells finished, or to describe the
compute nodes, so the ranks do it themselves.

- Each node's local rank 0 writes `env-<host>.json` (the compute node's fingerprint; `bench run --collect`
  merges them into env.json, which `--plan-only` wrote on the machine that planned, maybe a login node).
- Cells that already have a "finish" event in the run folder's events/ are skipped: re-running a plan
  continues it. Rank 0 reads them and broadcasts the set, so every rank skips the same cells.
- A group that raises on some rank is recorded on every rank that saw it fail, and the ranks agree that it
  failed: first through the c10d store (every rank posts its outcome under the group's key and waits for
  the others' — no collective of the process group can pair up wrongly with one still pending on a peer),
  then, on a process group rebuilt on the same store, through an all-reduce of the failed flag, which also
  proves the group works. Then the next group runs. When the agreement cannot complete (a peer died, the
  store is gone), the rank stops: re-running the plan continues from the first unfinished cell.
- Under NCCL the failing rank also says so at once through the store (FailureKey): every other rank
  watches that key while it runs the group (bench/worker/watch.py) and aborts its communicator when it
  appears, so a peer left inside a collective with the failed rank raises within a second instead of
  waiting out the process-group timeout (450 s on the GPU presets), after which NCCL's watchdog would
  have killed it and the rest of its world size. gloo's abort does not end a collective in progress
  (checked: torch 2.13), so on gloo the peers still wait for run.pg_timeout_s, and then carry on.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from bench import run_folder
from bench.config import BenchConfig
from bench.matrix import Cell
from bench.worker import process
from bench.worker.events import EventReader


def write_node_env(run_dir: Path, config: BenchConfig, argv: list[str]) -> Path | None:
    """Local rank 0: env-<host>.json, the fingerprint of this node (once per node and run folder; written
    to a temporary name and renamed, so a reader never sees half a file)."""
    if int(os.environ.get("LOCAL_RANK", 0)) != 0:
        return None
    from bench import envinfo
    from bench.schema import backend_for

    host = socket.gethostname()
    path = run_dir / run_folder.node_env(host)
    if path.exists():
        return path
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    info = envinfo.collect(config.run.device, backend_for(config.run.device), argv,
                           extra={"node_rank": node_rank(), "local_world_size": local_ws,
                                  "threads_per_rank": config.run.threads_for(local_ws)})
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def node_rank() -> int:
    """This node's index: torchrun's GROUP_RANK, SLURM's SLURM_NODEID, else RANK // LOCAL_WORLD_SIZE."""
    for key in ("GROUP_RANK", "SLURM_NODEID"):
        if key in os.environ:
            return int(os.environ[key])
    return int(os.environ.get("RANK", 0)) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def finished_cells(run_dir: Path) -> tuple[set[str], set[str]]:
    """Cell ids with a "finish" event, and with a "traced" event, in run_dir/events/*.jsonl (a torn line,
    from a rank killed while writing, is ignored)."""
    timed, traced = set(), set()
    for path in sorted((run_dir / run_folder.EVENTS).glob("*.jsonl")):
        for event in EventReader(path).read():  # complete lines only: a torn last one is never parsed
            if event.get("event") == "finish":
                timed.add(event["cell_id"])
            elif event.get("event") == "traced":
                traced.add(event["cell_id"])
    return timed, traced


def agreed_finished(run_dir: Path) -> tuple[set[str], set[str]]:
    """Collective: rank 0's finished_cells, the same sets on every rank."""
    box = [finished_cells(run_dir) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def unfinished(run_dir: Path, cells: list[Cell], to_profile: list[Cell]) -> tuple[list[Cell], list[Cell]]:
    """Collective: the cells to time and the cells to profile less those an earlier run of the plan
    finished (agreed_finished: the same on every rank)."""
    timed, traced = agreed_finished(run_dir)
    return [c for c in cells if c.cell_id not in timed], [c for c in to_profile if c.cell_id not in traced]


def failure_key(key: str) -> str:
    """The store key the first failing rank of group `key` sets (its rank) the moment it fails."""
    return f"bench/{key}/failed"


class FailureKey:
    """Plan mode's source of "another rank failed this group" for the watch (bench/worker/watch.py): the
    group's failure key in the store. `post()` sets it for this rank's own failure; calling the value asks
    whether another rank set it (None once the store is gone or the failure is this rank's own)."""

    def __init__(self, store, key: str, rank: int):
        self.store, self.key, self.rank = store, failure_key(key), rank

    def post(self) -> None:
        """This rank failed the group: say so to the others now (the first to fail names itself)."""
        try:
            self.store.compare_set(self.key, "", str(self.rank))
        except (RuntimeError, dist.DistError):
            pass  # the store is gone: the agreement that follows finds out and stops this rank

    def __call__(self) -> bool | None:
        try:
            if not self.store.check([self.key]):
                return False
            return None if self.store.get(self.key) == str(self.rank).encode() else True
        except (RuntimeError, dist.DistError):
            return None


def abort_for(device: torch.device):
    """What the failure watch calls on this rank in plan mode: under NCCL, abort the default group's
    communicators (ProcessGroup.abort: ncclCommAbort ends the collectives in flight, which then raise),
    leaving c10d's bookkeeping to the main thread (group_failed destroys and rebuilds the group); nothing on
    gloo, whose abort leaves a collective in flight waiting (its timeout ends it)."""
    if device.type != "cuda":
        return lambda: None
    group = dist.distributed_c10d._get_default_group()
    return group.abort


def group_failed(key: str, failed: bool, timeout_s: float, device: torch.device) -> bool | None:
    """Collective. Whether the group `key` failed on any rank: True/False when every rank agrees and the
    process group works, None when they cannot (a peer gone, the store unreachable): stop then.

    After a failure the process group is rebuilt on the same store before the agreeing all-reduce: a rank
    that failed alone left its peers in a collective that then timed out (run.pg_timeout_s), and gloo
    closes the pairs of a timed-out collective. The rebuilt group is the default group the next cells use.
    (On NCCL a timed-out collective aborts its process, so there the agreement fails and the ranks stop.)
    """
    rank, ws = dist.get_rank(), dist.get_world_size()
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"bench/{key}/{rank}", "1" if failed else "0")
        keys = [f"bench/{key}/{r}" for r in range(ws)]
        # a peer still inside a collective of the failed group posts once that collective times out
        store.wait(keys, timedelta(seconds=2 * timeout_s))
        if any(store.get(k) == b"1" for k in keys):
            dist.destroy_process_group()
            process.init_process_group(device, timeout_s, store=dist.PrefixStore(f"bench/{key}/pg", store),
                                       rank=rank, world_size=ws)
        flag = torch.tensor([1 if failed else 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    except (RuntimeError, dist.DistError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"bench.worker: rank {rank}: the ranks could not agree on {key} ({type(e).__name__}: {first}); "
              "stopping (re-run the plan to continue with its unfinished cells)", file=sys.stderr)
        return None
