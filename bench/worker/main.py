"""One rank of a launch, from start to end: set the process up, build the launch context once
(bench/worker/context.py), run the plan's cells whose world size is this launch's WORLD_SIZE in groups side
by side (bench/worker/launch_groups.py), then the profiled passes of the plan's `profile` cells, telling the
launcher through the events file.

Rank 0 writes "start" (a group), "progress", "finish" (per cell: status, error, the measured row),
"profile" and "traced"; a rank whose group raises writes "error" and exits non-zero, so torchrun tears the
launch down and the launcher relaunches the remaining cells (see bench/worker/events.py); a cell that fails
on one rank only ends the launch within seconds (bench/worker/launch_groups.py). Every profiled pass runs
after the last timed step of the launch: no timed step follows the profiler in a process.

A plan run by the user's own torchrun or srun (no launcher) continues past a failed group instead, skips the
cells an earlier run of the plan finished, and describes each node (bench/worker/plan_mode.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench import run_folder
from bench.config import BenchConfig, config_from_dict
from bench.lifetime import die_with_parent, watch_launcher
from bench.matrix import Cell
from bench.schema import PASSES, Passes, search
from bench.worker import hangs, plan_mode, process
from bench.worker.context import Launch
from bench.worker.events import Events
from bench.worker.launch_groups import emit_error, run_groups
from bench.worker.profiling import profile_cell
from bench.worker.racing import RaceBook
from bench.worker.rounds import Budget
from bench.worker.trainer import release


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = json.loads(args.plan.read_text())
    config, run_dir = config_from_dict(plan["config"]), Path(plan["run_dir"])
    die_with_parent()  # torchrun SIGKILLed (its launcher died): this rank goes too, even inside a collective
    watch_launcher(plan.get("launcher_pid"))
    process.ranks_from_slurm()
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host = socket.gethostname()
    events = Events(args.events or run_dir / run_folder.EVENTS / f"{host}-{os.getpid()}.jsonl")
    hangs.register(rank)  # before "hello": the launcher may ask for this rank's stack from then on
    events.emit(event="hello", rank=rank, pid=os.getpid(), pgid=os.getpgid(0), ppid=os.getppid())
    plan_run = plan.get("launcher_pid") is None  # the user's own torchrun/srun: see plan_mode
    if plan_run:
        plan_mode.write_node_env(run_dir, config, [sys.executable, "-m", "bench.worker", *sys.argv[1:]])
    share, packed = slot_share(plan, ws, args.slot)  # before the threads: a packed step may bind its CPUs
    device, facts = set_up_process(config, packed)
    cells, to_profile = ([Cell.from_dict(c) for c in plan.get(key, [])
                          if c["world_size"] == ws and c["cell_id"] in share] for key in ("cells", "profile"))
    form_process_group(config, device, events, cells if plan_run else [])
    hangs.arm(rank, config.run.process_group_timeout_s, events.emit)
    try:
        if plan_run:  # an earlier run of this plan finished some: continue after them
            cells, to_profile = plan_mode.unfinished(run_dir, cells, to_profile)
        launch = launch_context(plan, config, device, events, facts, cells)
        not_profiled = run_groups(cells, launch)
        if not_profiled is None:
            return 1
        profile_passes([c for c in to_profile if c.cell_id not in not_profiled], launch)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan JSON written by `bench run`")
    parser.add_argument("--events", type=Path, default=None,
                        help="events file (default: <run_dir>/events/<host>-<pid>.jsonl)")
    parser.add_argument("--slot", type=int, default=None,
                        help="one of the launches at once of this world size (the plan's `slots`, written by "
                             "`bench slurm`): run only its share of the cells")
    return parser.parse_args(argv)


def set_up_process(config: BenchConfig, packed: dict) -> tuple[torch.device, dict]:
    """This rank's threads (pinned to its CPUs where the config says) and device, and the facts of its
    process that go into every row it finishes."""
    local_rank, local_ws = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    threads = config.run.threads_for(local_ws)
    pinned = (process.pin_cpus(threads, local_rank, local_ws)
              if config.run.pin_cpus and config.run.device == "cpu" else None)
    torch.set_num_threads(threads)
    device = process.pick_device(config.run.device, local_rank)
    facts = {"threads_per_rank": threads, "hostname": socket.gethostname(), "rank0_cpus": pinned,
             # the launches at once beside this one and its GPUs (bench/run/packing.py); alone: 1, None
             "packed_launches": packed.get("packed_launches", 1), "slot_gpus": packed.get("slot_gpus"),
             "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    return device, facts


def form_process_group(config: BenchConfig, device: torch.device, events: Events, cells: list[Cell]) -> None:
    """The default process group; when a peer never comes (env:// rendezvous under srun), an "error" event
    for each of `cells` (plan mode's: nobody else records them) before the error is re-raised."""
    timeout_s = config.run.process_group_timeout_s
    try:
        process.init_process_group(device, timeout_s)
    except RuntimeError as e:
        if cells:
            events.emit(event="error", cell_ids=[c.cell_id for c in cells], rank=int(os.environ["RANK"]),
                        status="failed", phase="start", error=f"the process group of WORLD_SIZE="
                        f"{os.environ['WORLD_SIZE']} did not form within {timeout_s:g} s (run.pg_timeout_s): "
                        f"{type(e).__name__}: {str(e).strip()[:2000]}")
        raise


def launch_context(plan: dict, config: BenchConfig, device: torch.device, events: Events, facts: dict,
                   cells: list[Cell]) -> Launch:
    """Collective-free, after the process group formed: this rank's launch (bench/worker/context.py), with
    a racing search's RaceBook over the cells it runs and the run's timed-rounds budget (what a quiet group
    leaves, the next may use, across launches too: the plan's `carried_s`)."""
    plan_run = plan.get("launcher_pid") is None
    return Launch(config=config, device=device, rank=dist.get_rank(), world_size=dist.get_world_size(),
                  # a repeat launch (run.launches): REPEAT_PASSES; a plan run has no repeats: every pass
                  passes=PASSES if plan_run else Passes(tuple(plan.get("passes", PASSES))),
                  events=events, run_dir=Path(plan["run_dir"]), facts=facts,
                  budget=Budget(plan.get("carried_s", 0.0)),
                  book=RaceBook.of(cells) if search(config.run.search).races else None,
                  plan_run=plan_run, launcher_pid=plan.get("launcher_pid"))


def profile_passes(cells: list[Cell], launch: Launch) -> None:
    """Collective. The profiled pass of each cell, after every timed step of the launch; a cell whose pass
    fails costs its own traces only (its "error" event says why), unless the process group itself failed."""
    for cell in cells:
        try:
            profile_and_emit(cell, launch)
        except dist.DistError:  # the process group is broken: nothing after this can pair up
            raise
        except Exception:  # noqa: BLE001 - its "error" event says why; it costs this cell's traces only
            release(launch.device)


def profile_and_emit(cell: Cell, launch: Launch) -> None:
    """The cell's profiled pass (its row is already recorded); a failure is re-raised after its "error"
    event (the caller goes on with the next cell's pass unless the process group itself failed)."""
    if launch.rank == 0:
        launch.events.emit(event="profile", cell_id=cell.cell_id)
    t0 = time.perf_counter()
    try:
        trace_dir = profile_cell(cell, launch.config, launch.device, launch.rank, launch.world_size,
                                 launch.run_dir)
    except Exception as e:
        emit_error(launch, [cell.cell_id], e, "profile")
        raise
    if launch.rank == 0:  # profile_s: the anatomy's "profile" part of the cell (anatomy.PARTS)
        launch.events.emit(event="traced", cell_id=cell.cell_id, trace_dir=trace_dir,
                           profile_s=time.perf_counter() - t0)
    release(launch.device)


class _Every:
    """Holds every cell id: a launch that runs all of its world size's cells."""

    def __contains__(self, cell_id: str) -> bool:
        return True


def slot_share(plan: dict, ws: int, slot: int | None) -> tuple[object, dict]:
    """The cell ids this launch runs and its packing facts (bench/run/packing.py Slot.facts). A launch of
    `bench run` has its share in its own plan file (`slot`: the facts); a packed SLURM step (`--slot I`)
    takes share I of the plan's `slots` for its world size, and its GPUs are those SLURM gave the step
    (CUDA_VISIBLE_DEVICES, set per step by SLURM's GRES plugin)."""
    if slot is None:
        return _Every(), plan.get("slot", {})
    shares = plan.get("slots", {}).get(str(ws))
    if not shares or not 0 <= slot < len(shares):
        print(f"bench.worker: --slot {slot}: the plan has {len(shares or [])} launches at once for world "
              f"size {ws} (its `slots`, written by bench slurm)", file=sys.stderr)
        raise SystemExit(2)
    bind_share(slot, int(os.environ.get("SLURM_CPUS_PER_TASK") or 0))
    return set(shares[slot]), {"packed_launches": len(shares),
                               "slot_gpus": os.environ.get("CUDA_VISIBLE_DEVICES") or None}


def bind_share(slot: int, cpus_per_launch: int) -> None:
    """A packed step's CPUs: SLURM binds them where its task plugin does (task/affinity, task/cgroup: the
    affinity mask is then the step's --cpus-per-task); where it does not (task/none: the mask is still the
    whole node), the launch binds itself to the slot-th block of that many, as `bench run` binds a packed
    launch (bench/run/packing.py), so its ranks' threads (threads_for) are sized from its own share."""
    cpus = sorted(os.sched_getaffinity(0))
    if 0 < cpus_per_launch < len(cpus):
        block = cpus[slot * cpus_per_launch:(slot + 1) * cpus_per_launch] or cpus[-cpus_per_launch:]
        os.sched_setaffinity(0, block)
