"""A launch's groups on this rank, one after another (`run_groups`), each run and told through the events
file: rank 0 writes "start", "progress" and per cell "finish" (status, error, the measured row); a rank whose
group raises writes "error" (see bench/worker/events.py).

Under `bench run`'s launcher (`run_watched`) a group that raises ends the launch (torchrun tears it down and
the launcher relaunches the remaining cells); a cell that fails on one rank only (bench/worker/guard.py
Peers) ends it within seconds: that rank writes the cell's "error" (`alone`) and exits, every other rank
exits as soon as it hears of it (the failure watch, bench/worker/watch.py), and the launcher records that
cell and relaunches the group's others. In plan mode (`run_agreeing`: the user's own torchrun or srun) a
failed group is recorded on every rank and the next one runs (bench/worker/plan_mode.py).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch.distributed as dist

from bench import anatomy
from bench.matrix import Cell
from bench.worker import plan_mode, process
from bench.worker.cell import Outcome, run_group
from bench.worker.context import Launch
from bench.worker.groups import plan_groups
from bench.worker.guard import FailedAlone, GroupBroken, PeerFailed, Peers, failure
from bench.worker.trainer import release
from bench.worker.watch import FailureWatch

# How a worker of a launch ends when a cell failed on one rank only (guard.Peers): the launcher reads why
# from the events, not from these; they tell the launch's log apart from a crash.
EXIT_FAILED_ALONE = 3  # this rank's cell failed alone: its "error" event says why
EXIT_PEER_FAILED = 4   # another rank's did


@dataclass(frozen=True)
class Ended:
    """What a group left behind for the launch's profiled passes: the cells a race eliminated and those that
    failed alone (bench/worker/guard.py); neither is profiled."""

    raced_out: frozenset[str] = frozenset()
    failed_alone: frozenset[str] = frozenset()


def run_groups(cells: list[Cell], launch: Launch) -> frozenset[str] | None:
    """Collective. The launch's cells in groups side by side (bench/worker/groups.py), each as the launch
    runs it (`run_watched` or, in plan mode, `run_agreeing`). Returns the cells no profiled pass may follow
    (raced out, failed alone); None when this rank must stop (the launcher is gone; in plan mode, the ranks
    could not agree on a group)."""
    not_profiled: set[str] = set()
    seen: set[str] = set()  # cells an earlier group ran: a later group steps them for pairing only
    store, ws = dist.distributed_c10d._get_default_store(), launch.world_size
    # Collective: every rank plans from the smallest free memory over the ranks, so all build the
    # same trainers and their collectives pair up.
    for i, group in enumerate(plan_groups(cells, launch.config, launch.device)):
        if not process.launcher_alive(launch.launcher_pid, launch.device):
            print("bench.worker: the launcher is gone; stopping", file=sys.stderr)
            return None
        companions = frozenset(c.cell_id for c in group if c.cell_id in seen)
        seen |= {c.cell_id for c in group}
        peers = Peers(store, f"bench/ws{ws}/group{i}", launch.rank, ws)
        ended = (run_agreeing(f"ws{ws}-group{i}", group, launch, companions, peers) if launch.plan_run
                 else run_watched(group, launch, companions, peers))
        if ended is None:
            return None
        not_profiled |= ended.raced_out | ended.failed_alone
    return frozenset(not_profiled)


def run_watched(group: list[Cell], launch: Launch, companions: frozenset[str], peers: Peers) -> Ended:
    """Under the launcher: run one group while the failure watch listens to `peers` (under NCCL a rank left
    inside a collective with the departed rank would otherwise wait for the process-group timeout, 450 s on
    the GPU presets; on gloo its collective breaks when the departed rank's sockets close, and the guard
    ends it alike: PeerFailed); a group broken by a one-rank failure ends this process."""
    try:
        with FailureWatch(lambda: peers.other_failed_alone() is not None, lambda: os._exit(EXIT_PEER_FAILED),
                          name="bench-peer-watch"):
            return run_and_emit(group, launch, companions, peers)
    except GroupBroken as e:  # the launcher relaunches the group's other cells
        os._exit(EXIT_FAILED_ALONE if isinstance(e, FailedAlone) else EXIT_PEER_FAILED)


def run_and_emit(group: list[Cell], launch: Launch, companions: frozenset[str] = frozenset(),
                 peers: Peers | None = None) -> Ended:
    """Run one group of cells on this rank and write its events; a failure of the whole group is re-raised
    after its "error" event. `companions`: cells of the group an earlier one measured (cell.run_group):
    stepped for the pairing, not reported again."""
    t_group = time.perf_counter()
    outcomes = measure_group(group, launch, companions, peers)
    group, outcomes = reported(group, outcomes, companions)
    emit_finish(group, outcomes, launch, time.perf_counter() - t_group)
    release(launch.device)
    return ended(group, outcomes)


def run_agreeing(key: str, group: list[Cell], launch: Launch, companions: frozenset[str] = frozenset(),
                 peers: Peers | None = None) -> Ended | None:
    """Plan mode: run one group; a failure on any rank is recorded on every rank (the failing rank's own
    "error" event says why; the others' say `peer`) and the run goes on. None when the ranks could not
    agree (plan_mode.group_failed): the process group is unusable and this rank must stop."""
    t_group, device = time.perf_counter(), launch.device
    posted = plan_mode.FailureKey(dist.distributed_c10d._get_default_store(), key, launch.rank)
    with FailureWatch(posted, plan_mode.abort_for(device)):
        try:
            outcomes = measure_group(group, launch, companions, peers)
        except Exception:  # measure_group wrote the "error" event
            outcomes = None
            posted.post()  # the peers stop waiting for this rank now (NCCL: their watch aborts)
    failed = plan_mode.group_failed(key, outcomes is None, launch.config.run.process_group_timeout_s, device)
    if failed is None:
        return None
    if failed and outcomes is not None:
        launch.events.emit(event="error", cell_ids=[c.cell_id for c in group], rank=launch.rank,
                           status="failed", phase="cell", peer=True,
                           error="the group failed on another rank (its error event says why)")
    elif not failed:
        group, outcomes = reported(group, outcomes, companions)
        emit_finish(group, outcomes, launch, time.perf_counter() - t_group)
    release(device)
    return Ended() if failed else ended(group, outcomes)


def reported(group: list[Cell], outcomes: list[Outcome], companions: frozenset[str]
             ) -> tuple[list[Cell], list[Outcome]]:
    """The group's cells and outcomes less its companions (their rows are an earlier group's)."""
    kept = [(c, o) for c, o in zip(group, outcomes, strict=True) if c.cell_id not in companions]
    return [c for c, _ in kept], [o for _, o in kept]


def ended(group: list[Cell], outcomes: list[Outcome]) -> Ended:
    """The group's cells a race eliminated (status raced_out), and those that left it with a failure of
    their own (not ok, not diverged)."""
    statuses = [(c.cell_id, status) for c, (status, _, _) in zip(group, outcomes)]
    return Ended(frozenset(i for i, status in statuses if status == "raced_out"),
                 frozenset(i for i, status in statuses if status not in ("ok", "diverged", "raced_out")))


def measure_group(group: list[Cell], launch: Launch, companions: frozenset[str] = frozenset(),
                  peers: Peers | None = None) -> list[Outcome]:
    """Collective. Run one group of cells on this rank (rank 0 writes "start" and "progress"); a failure is
    re-raised after this rank's "error" event. With the launch's RaceBook the group is a race."""
    ids = [c.cell_id for c in group]
    if launch.rank == 0:
        launch.events.emit(event="start", cell_ids=ids)
    try:
        return run_group(group, launch, companions, peers)
    except FailedAlone as e:  # this rank's cell, alone: its own cause; the group's others are run again
        launch.events.emit(event="error", cell_ids=[e.cell_id], rank=launch.rank, status=e.status,
                           phase="cell", error=e.error, alone=True)
        raise
    except PeerFailed:  # another rank's cell failed alone: that rank says why
        raise
    except Exception as e:
        emit_error(launch, ids, e, "cell")
        raise


def emit_finish(group: list[Cell], outcomes: list[Outcome], launch: Launch, wall_s: float) -> None:
    """Rank 0: a "finish" event per cell of the group, its wall time shared evenly, and the timed-rounds
    budget the groups so far left unspent (`carried_s`: the launcher hands it to the next launch)."""
    if launch.rank != 0:
        return
    carried = {} if launch.budget is None else {"carried_s": launch.budget.carried_s}
    # the group's time its cells' phases do not hold (events, releases, agreements): anatomy's "other"
    timed = [row["anatomy_s"] for _, _, row in outcomes if "anatomy_s" in row]
    other = max(0.0, wall_s - sum(sum(parts.values()) for parts in timed)) / max(1, len(timed))
    for cell, (status, error, row) in zip(group, outcomes, strict=True):
        row |= launch.facts | {"cell_wall_s": wall_s / len(group)}
        if "anatomy_s" in row:
            anatomy.add(row["anatomy_s"], "other", other)
        launch.events.emit(event="finish", cell_id=cell.cell_id, status=status, error=error, row=row,
                           **carried)


def emit_error(launch: Launch, cell_ids: list[str], error: Exception, phase: str) -> None:
    """An "error" event: status oom or failed, the exception first, then the traceback's tail."""
    status, text = failure(error, ",".join(cell_ids))
    launch.events.emit(event="error", cell_ids=cell_ids, rank=launch.rank, status=status, phase=phase,
                       error=text)
