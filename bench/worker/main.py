"""One rank of a launch: set the process up, run the plan's cells whose world size is this launch's
WORLD_SIZE (in groups side by side, bench/worker/groups.py), then the profiled passes of the plan's
`profile` cells, telling the launcher through the events file.

Rank 0 writes "start" (a group), "progress", "finish" (per cell: status, error, the measured row),
"profile" and "traced"; a rank whose group raises writes "error" and exits non-zero, so torchrun tears the
launch down and the launcher relaunches the remaining cells (see bench/worker/events.py). Every profiled
pass runs after the last timed step of the launch: no timed step follows the profiler in a process.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from bench.config import BenchConfig, config_from_dict
from bench.lifetime import die_with_parent, watch_launcher
from bench.matrix import Cell
from bench.schema import error_text
from bench.worker import process
from bench.worker.cell import release, run_group
from bench.worker.events import Events
from bench.worker.groups import plan_groups
from bench.worker.profiling import profile_cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan JSON written by `bench run`")
    parser.add_argument("--events", type=Path, default=None,
                        help="events file (default: <run_dir>/events/<host>-<pid>.jsonl)")
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    config = config_from_dict(plan["config"])
    run_dir = Path(plan["run_dir"])
    die_with_parent()  # torchrun SIGKILLed (its launcher died): this rank goes too, even inside a collective
    watch_launcher(plan.get("launcher_pid"))
    process.ranks_from_slurm()
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host = socket.gethostname()
    events = Events(args.events or run_dir / "events" / f"{host}-{os.getpid()}.jsonl")
    events.emit(event="hello", rank=rank, pid=os.getpid(), pgid=os.getpgid(0))

    threads = config.run.threads_for(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    torch.set_num_threads(threads)
    device = process.pick_device(config.run.device, int(os.environ.get("LOCAL_RANK", 0)))
    process.init_process_group(device, config.run.process_group_timeout_s)
    # Facts of this rank's process that go into every row it finishes.
    facts = {"threads_per_rank": threads, "hostname": host,
             "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    cells = [Cell.from_dict(c) for c in plan["cells"] if c["world_size"] == ws]
    to_profile = [Cell.from_dict(c) for c in plan.get("profile", []) if c["world_size"] == ws]
    try:
        # Collective: every rank plans from the smallest free memory over the ranks, so all build the
        # same trainers and their collectives pair up.
        for group in plan_groups(cells, config, device):
            if not process.launcher_alive(plan.get("launcher_pid"), device):
                print("bench.worker: the launcher is gone; stopping", file=sys.stderr)
                return 1
            run_and_emit(group, config, device, events, facts)
        for cell in to_profile:
            profile_and_emit(cell, config, device, run_dir, events)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def run_and_emit(group: list[Cell], config: BenchConfig, device: torch.device, events: Events,
                 facts: dict) -> None:
    """Run one group of cells on this rank and write its events; a failure is re-raised after its "error"
    event."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    ids = [c.cell_id for c in group]
    if rank == 0:
        events.emit(event="start", cell_ids=ids)
    t_group = time.perf_counter()
    try:
        for cell in group:
            inject_fault(config.debug.fault_for(cell.cell_id), cell, rank, ws)
        progress = (lambda phase: events.emit(event="progress", cell_ids=ids, phase=phase)) if rank == 0 \
            else (lambda phase: None)
        outcomes = run_group(group, config, device, rank, ws, progress)
    except Exception as e:
        emit_error(events, ids, e, "cell")
        raise
    if rank == 0:
        wall = (time.perf_counter() - t_group) / len(group)
        for cell, (status, error, row) in zip(group, outcomes, strict=True):
            row |= facts | {"cell_wall_s": wall}
            events.emit(event="finish", cell_id=cell.cell_id, status=status, error=error, row=row)
    release(device)


def profile_and_emit(cell: Cell, config: BenchConfig, device: torch.device, run_dir: Path,
                     events: Events) -> None:
    """The cell's profiled pass (its row is already recorded); a failure is re-raised after its "error"
    event."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        events.emit(event="profile", cell_id=cell.cell_id)
    try:
        trace_dir = profile_cell(cell, config, device, rank, ws, run_dir)
    except Exception as e:
        emit_error(events, [cell.cell_id], e, "profile")
        raise
    if rank == 0:
        events.emit(event="traced", cell_id=cell.cell_id, trace_dir=trace_dir)
    release(device)


def emit_error(events: Events, cell_ids: list[str], error: Exception, phase: str) -> None:
    """An "error" event: status oom or failed, the exception first, then the traceback's tail."""
    status = "oom" if isinstance(error, torch.OutOfMemoryError) else "failed"
    text = error_text(f"{type(error).__name__}: {error}", traceback.format_exc().strip().splitlines())
    events.emit(event="error", cell_ids=cell_ids, rank=dist.get_rank(), status=status, phase=phase,
                error=text)


def inject_fault(fault: str | None, cell: Cell, rank: int, ws: int) -> None:
    """Test-only faults (debug.fault) on the last rank: hang (the other ranks then wait in their next
    collective, as behind a hung collective) or crash."""
    if fault == "hang" and rank == ws - 1:
        while True:
            time.sleep(1)
    if fault == "crash" and rank == ws - 1:
        raise RuntimeError(f"injected crash in {cell.cell_id} on rank {rank} (debug.fault)")
