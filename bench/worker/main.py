"""One rank of a launch: set the process up, run the plan's cells whose world size is this launch's
WORLD_SIZE (in groups side by side, bench/worker/groups.py), then the profiled passes of the plan's
`profile` cells, telling the launcher through the events file.

Rank 0 writes "start" (a group), "progress", "finish" (per cell: status, error, the measured row),
"profile" and "traced"; a rank whose group raises writes "error" and exits non-zero, so torchrun tears the
launch down and the launcher relaunches the remaining cells (see bench/worker/events.py). A cell that fails
on one rank only (bench/worker/guard.py Peers) ends the launch within seconds: that rank writes the cell's
"error" (`alone`) and exits, every other rank exits as soon as it hears of it (PeerWatch), and the launcher
records that cell and relaunches the group's others. Every profiled pass runs after the last timed step of
the launch: no timed step follows the profiler in a process.

A plan run by the user's own torchrun or srun (no launcher) continues past a failed group instead, skips the
cells an earlier run of the plan finished, and describes each node (bench/worker/plan_mode.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench import run_folder, schema
from bench.config import BenchConfig, config_from_dict
from bench.lifetime import die_with_parent, watch_launcher
from bench.matrix import Cell
from bench.schema import PASSES, search
from bench.worker import hangs, plan_mode, process
from bench.worker.cell import Budget, release, run_group
from bench.worker.events import Events
from bench.worker.groups import plan_groups
from bench.worker.guard import FailedAlone, GroupBroken, PeerFailed, Peers, failure
from bench.worker.profiling import profile_cell
from bench.worker.racing import RaceBook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan JSON written by `bench run`")
    parser.add_argument("--events", type=Path, default=None,
                        help="events file (default: <run_dir>/events/<host>-<pid>.jsonl)")
    parser.add_argument("--slot", type=int, default=None,
                        help="one of the launches at once of this world size (the plan's `slots`, written by "
                             "`bench slurm`): run only its share of the cells")
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    config = config_from_dict(plan["config"])
    run_dir = Path(plan["run_dir"])
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
    local_rank, local_ws = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    share, packed = slot_share(plan, ws, args.slot)  # before the threads: a packed step may bind its CPUs
    threads = config.run.threads_for(local_ws)
    pinned = (process.pin_cpus(threads, local_rank, local_ws)
              if config.run.pin_cpus and config.run.device == "cpu" else None)
    torch.set_num_threads(threads)
    device = process.pick_device(config.run.device, local_rank)
    cells = [Cell.from_dict(c) for c in plan["cells"] if c["world_size"] == ws and c["cell_id"] in share]
    to_profile = [Cell.from_dict(c) for c in plan.get("profile", [])
                  if c["world_size"] == ws and c["cell_id"] in share]
    try:
        process.init_process_group(device, config.run.process_group_timeout_s)
    except RuntimeError as e:  # a peer never came (env:// rendezvous under srun): say so for every cell
        if plan_run and cells:
            events.emit(event="error", cell_ids=[c.cell_id for c in cells], rank=rank, status="failed",
                        phase="start", error=f"the process group of WORLD_SIZE={ws} did not form within "
                        f"{config.run.process_group_timeout_s:g} s (run.pg_timeout_s): {type(e).__name__}: "
                        f"{str(e).strip()[:2000]}")
        raise
    hangs.arm(rank, config.run.process_group_timeout_s, events.emit)
    # Facts of this rank's process that go into every row it finishes.
    facts = {"threads_per_rank": threads, "hostname": host, "rank0_cpus": pinned,
             # the launches at once beside this one and its GPUs (bench/run/packing.py); alone: 1, None
             "packed_launches": packed.get("packed_launches", 1), "slot_gpus": packed.get("slot_gpus"),
             "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    try:
        if plan_run:  # an earlier run of this plan finished these: continue after them
            timed, traced = plan_mode.agreed_finished(run_dir)
            cells = [c for c in cells if c.cell_id not in timed]
            to_profile = [c for c in to_profile if c.cell_id not in traced]
        # a racing search's shared state: each recipe's candidates here and its earlier groups' survivors
        book = RaceBook.of(cells) if search(config.run.search).races else None
        raced_out: set[str] = set()  # eliminated by a race: no profiled pass
        left: set[str] = set()  # cells that failed alone (bench/worker/guard.py): none is profiled
        # the run's timed-rounds budget: what a quiet group leaves, the next may use, across launches too
        budget = Budget(plan.get("carried_s", 0.0))
        passes = frozenset(plan.get("passes", PASSES))  # a repeat launch (run.launches): REPEAT_PASSES
        seen: set[str] = set()  # cells an earlier group ran: a later group steps them for pairing only
        store = dist.distributed_c10d._get_default_store()
        # Collective: every rank plans from the smallest free memory over the ranks, so all build the
        # same trainers and their collectives pair up.
        for i, group in enumerate(plan_groups(cells, config, device)):
            if not process.launcher_alive(plan.get("launcher_pid"), device):
                print("bench.worker: the launcher is gone; stopping", file=sys.stderr)
                return 1
            companions = frozenset(c.cell_id for c in group if c.cell_id in seen)
            seen |= {c.cell_id for c in group}
            peers = Peers(store, f"bench/ws{ws}/group{i}", rank, ws)
            if not plan_run:
                try:
                    with PeerWatch(peers):
                        raced_out |= run_and_emit(group, config, device, events, facts, left, book, budget,
                                                  passes, companions, peers)
                except GroupBroken as e:  # the launcher relaunches the group's other cells
                    os._exit(EXIT_FAILED_ALONE if isinstance(e, FailedAlone) else EXIT_PEER_FAILED)
            else:
                agreed = run_agreeing(f"ws{ws}-group{i}", group, config, device, events, facts, left, book,
                                      budget, companions, peers)
                if agreed is None:
                    return 1
                raced_out |= agreed
        for cell in to_profile:
            if cell.cell_id in left or cell.cell_id in raced_out:  # failed alone (its row says why), raced
                continue
            try:
                profile_and_emit(cell, config, device, run_dir, events)
            except dist.DistError:  # the process group is broken: nothing after this can pair up
                raise
            except Exception:  # noqa: BLE001 - its "error" event says why; it costs this cell's traces only
                release(device)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


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


# How a worker of a launch ends when a cell failed on one rank only (guard.Peers): the launcher reads why
# from the events, not from these; they tell the launch's log apart from a crash.
EXIT_FAILED_ALONE = 3  # this rank's cell failed alone: its "error" event says why
EXIT_PEER_FAILED = 4   # another rank's did


class PeerWatch:
    """While a group runs in a launch, a thread that ends this process as soon as the store says another
    rank's cell failed alone (guard.Peers): under NCCL a rank left inside a collective with the departed
    rank would otherwise wait for the process-group timeout (450 s on the GPU presets); on gloo its
    collective breaks when the departed rank's sockets close, and the guard ends it alike (PeerFailed)."""

    def __init__(self, peers: Peers, poll_s: float = 0.5):
        self.peers, self.poll_s = peers, poll_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bench-peer-watch", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            if self.peers.other_failed_alone() is not None:
                os._exit(EXIT_PEER_FAILED)


def run_and_emit(group: list[Cell], config: BenchConfig, device: torch.device, events: Events,
                 facts: dict, left: set[str], book: RaceBook | None = None, budget: Budget | None = None,
                 passes: frozenset[str] = frozenset(PASSES), companions: frozenset[str] = frozenset(),
                 peers: Peers | None = None) -> set[str]:
    """Run one group of cells on this rank and write its events, adding to `left` the cells that failed
    alone; a failure of the whole group is re-raised after its "error" event. Returns the cells a race
    eliminated. `companions`: cells of the group an earlier one measured (cell.run_group): stepped for the
    pairing, not reported again."""
    t_group = time.perf_counter()
    outcomes = measure_group(group, config, device, events, book, budget, passes, companions, peers)
    group, outcomes = reported(group, outcomes, companions)
    emit_finish(group, outcomes, events, facts, time.perf_counter() - t_group, budget)
    left |= failed_alone(group, outcomes)
    release(device)
    return raced(group, outcomes)


def reported(group: list[Cell], outcomes: list, companions: frozenset[str]) -> tuple[list[Cell], list]:
    """The group's cells and outcomes less its companions (their rows are an earlier group's)."""
    kept = [(c, o) for c, o in zip(group, outcomes, strict=True) if c.cell_id not in companions]
    return [c for c, _ in kept], [o for _, o in kept]


def failed_alone(group: list[Cell], outcomes: list) -> set[str]:
    """The cells of a group that left it with a failure of their own (not ok, not diverged)."""
    return {c.cell_id for c, (status, _, _) in zip(group, outcomes)
            if status not in ("ok", "diverged", "raced_out")}


def run_agreeing(key: str, group: list[Cell], config: BenchConfig, device: torch.device, events: Events,
                 facts: dict, left: set[str], book: RaceBook | None = None,
                 budget: Budget | None = None, companions: frozenset[str] = frozenset(),
                 peers: Peers | None = None) -> set[str] | None:
    """Plan mode: run one group; a failure on any rank is recorded on every rank (the failing rank's own
    "error" event says why; the others' say `peer`) and the run goes on. Returns the cells a race
    eliminated; None when the ranks could not agree (plan_mode.group_failed): the process group is
    unusable and this rank must stop."""
    t_group = time.perf_counter()
    store = dist.distributed_c10d._get_default_store()
    with plan_mode.FailureWatch(store, key, dist.get_rank(), plan_mode.abort_for(device)) as watch:
        try:
            outcomes = measure_group(group, config, device, events, book, budget, companions=companions,
                                     peers=peers)
        except Exception:  # measure_group wrote the "error" event
            outcomes = None
            watch.failed()  # the peers stop waiting for this rank now (NCCL: FailureWatch)
    failed = plan_mode.group_failed(key, outcomes is None, config.run.process_group_timeout_s, device)
    if failed is None:
        return None
    if failed and outcomes is not None:
        events.emit(event="error", cell_ids=[c.cell_id for c in group], rank=dist.get_rank(),
                    status="failed", phase="cell", peer=True,
                    error="the group failed on another rank (its error event says why)")
    elif not failed:
        group, outcomes = reported(group, outcomes, companions)
        emit_finish(group, outcomes, events, facts, time.perf_counter() - t_group, budget)
        left |= failed_alone(group, outcomes)
    release(device)
    return set() if failed else raced(group, outcomes)


def raced(group: list[Cell], outcomes: list[tuple[str, str | None, dict]]) -> set[str]:
    """The group's cells a race eliminated (status raced_out)."""
    return {c.cell_id for c, (status, _, _) in zip(group, outcomes) if status == "raced_out"}


def measure_group(group: list[Cell], config: BenchConfig, device: torch.device, events: Events,
                  book: RaceBook | None = None, budget: Budget | None = None,
                  passes: frozenset[str] = frozenset(PASSES),
                  companions: frozenset[str] = frozenset(),
                  peers: Peers | None = None) -> list[tuple[str, str | None, dict]]:
    """Collective. Run one group of cells on this rank (rank 0 writes "start" and "progress"); a failure is
    re-raised after this rank's "error" event. With a RaceBook the group is a race; `budget` and
    `passes`: see cell.run_group."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    ids = [c.cell_id for c in group]
    if rank == 0:
        events.emit(event="start", cell_ids=ids)
    try:
        progress = (lambda phase: events.emit(event="progress", cell_ids=ids, phase=phase)) if rank == 0 \
            else (lambda phase: None)
        return run_group(group, config, device, rank, ws, progress, book, budget, passes, companions,
                         peers)
    except FailedAlone as e:  # this rank's cell, alone: its own cause; the group's others are run again
        events.emit(event="error", cell_ids=[e.cell_id], rank=rank, status=e.status, phase="cell",
                    error=e.error, alone=True)
        raise
    except PeerFailed:  # another rank's cell failed alone: that rank says why
        raise
    except Exception as e:
        emit_error(events, ids, e, "cell")
        raise


def emit_finish(group: list[Cell], outcomes: list, events: Events, facts: dict, wall_s: float,
                budget: Budget | None = None) -> None:
    """Rank 0: a "finish" event per cell of the group, its wall time shared evenly, and the timed-rounds
    budget the groups so far left unspent (`carried_s`: the launcher hands it to the next launch)."""
    if dist.get_rank() != 0:
        return
    carried = {} if budget is None else {"carried_s": budget.carried_s}
    # the group's time its cells' phases do not hold (events, releases, agreements): anatomy's "other"
    timed = [row["anatomy_s"] for _, _, row in outcomes if "anatomy_s" in row]
    other = max(0.0, wall_s - sum(sum(parts.values()) for parts in timed)) / max(1, len(timed))
    for cell, (status, error, row) in zip(group, outcomes, strict=True):
        row |= facts | {"cell_wall_s": wall_s / len(group)}
        if "anatomy_s" in row:
            schema.anatomy_add(row["anatomy_s"], "other", other)
        events.emit(event="finish", cell_id=cell.cell_id, status=status, error=error, row=row, **carried)


def profile_and_emit(cell: Cell, config: BenchConfig, device: torch.device, run_dir: Path,
                     events: Events) -> None:
    """The cell's profiled pass (its row is already recorded); a failure is re-raised after its "error"
    event (the caller goes on with the next cell's pass unless the process group itself failed)."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        events.emit(event="profile", cell_id=cell.cell_id)
    t0 = time.perf_counter()
    try:
        trace_dir = profile_cell(cell, config, device, rank, ws, run_dir)
    except Exception as e:
        emit_error(events, [cell.cell_id], e, "profile")
        raise
    if rank == 0:  # profile_s: the anatomy's "profile" part of the cell (schema.ANATOMY_PARTS)
        events.emit(event="traced", cell_id=cell.cell_id, trace_dir=trace_dir,
                    profile_s=time.perf_counter() - t0)
    release(device)


def emit_error(events: Events, cell_ids: list[str], error: Exception, phase: str) -> None:
    """An "error" event: status oom or failed, the exception first, then the traceback's tail."""
    status, text = failure(error, ",".join(cell_ids))
    events.emit(event="error", cell_ids=cell_ids, rank=dist.get_rank(), status=status, phase=phase,
                error=text)
