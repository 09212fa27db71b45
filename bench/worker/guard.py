"""One guard per cell of a side-by-side group: a cell whose trainer raises (its engine's `wrap`, a model
that cannot run under it, a loss that is not finite) leaves the group with its own error, and the other
cells of the group go on and keep their rows.

Every rank must keep the same trainers, or their collectives pair up wrongly. So a phase runs each trainer's
part under its cell's guard (`with guard.cell(cell_id)`: the exception is kept, not raised) and ends with
`agree`, one all_gather_object of what failed on which rank, after which every rank drops the same cells
(`each` returns those left). A cell that failed on any rank fails on all, with the earliest failure's error
(a loss that is not finite: the earliest step's; else the lowest rank's).

A failure on some ranks only (an out-of-memory error near the limit, a fault on one rank) leaves the other
ranks inside a collective of that trainer, which no later collective can pair with. `Peers` finds it out
through the c10d store: the failing rank posts its failure and waits GRACE_S for every rank to post the same
(a deterministic failure happens on every rank at the same point: the guard then goes on as above); when
they do not, the rank raises FailedAlone, and the group is over on every rank within seconds — the failing
rank records its cell's own cause and leaves, the others (their collective broken, or told by the store)
leave without a word of their own (PeerFailed), the launcher relaunches the group's other cells
(bench/worker/launch_groups.py, bench/run/launch.py) — instead of waiting for the process group's timeout
(0.75 × run.cell_timeout_s) and recording the whole group `timeout` with the cause lost. A failure of the
process group itself (`dist.DistError`) is re-raised as before: the group's "error" event ends the launch.
"""

from __future__ import annotations

import json
import math
import re
import time
import traceback
from contextlib import contextmanager

import torch
import torch.distributed as dist

from bench.schema import error_text
from bench.worker import hangs

# How long a rank whose step raised waits for every rank to report the same failure before it calls the
# failure its own: the ranks of a group are at most one step apart (every step ends in collectives), and a
# deterministic failure (a model an engine cannot run) reaches them all within milliseconds; the wait is
# what a one-rank failure costs before its group ends (the goal: within 10 s). Too short a wait only costs
# a relaunch of the group's other cells, never a wrong result.
GRACE_S = 3.0
POLL_S = 0.05


class GroupBroken(Exception):
    """The group's collectives can no longer pair up: it ends on every rank (guard.Peers)."""


class FailedAlone(GroupBroken):
    """A cell failed on this rank only, inside a step its peers are still in: its own cause."""

    def __init__(self, cell_id: str, status: str, error: str):
        super().__init__(f"{cell_id} failed on this rank only: {error}")
        self.cell_id, self.status, self.error = cell_id, status, error


class PeerFailed(GroupBroken):
    """Another rank's cell failed alone: this rank's collective broke, or the store said so."""


class Peers:
    """The ranks of one group, learning of each other's failures through the c10d store (module docstring).
    `key` names the group (unique in the launch); `rank`, `world_size` this process's."""

    def __init__(self, store, key: str, rank: int, world_size: int, grace_s: float = GRACE_S):
        self.store, self.key, self.rank, self.world_size, self.grace_s = store, key, rank, world_size, grace_s

    def _alone_key(self) -> str:
        return f"{self.key}/alone"

    def failed(self, cell_id: str, status: str, error: str) -> None:
        """This rank's step of `cell_id` raised: post it and wait for every rank to post the same. Returns
        when they all do (the guard goes on); raises FailedAlone when they have not within grace_s (this
        rank is the first to declare it), PeerFailed when another rank declared its own failure first."""
        mine = [f"{self.key}/fail/{cell_id}/{r}" for r in range(self.world_size)]
        self.store.set(mine[self.rank], "1")
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            if self.other_failed_alone() is not None:
                raise PeerFailed(f"another rank's cell failed alone while {cell_id} failed here")
            if self.store.check(mine):
                return
            time.sleep(POLL_S)
        claim = json.dumps({"rank": self.rank, "cell_id": cell_id})
        if self.store.compare_set(self._alone_key(), "", claim).decode() != claim:
            raise PeerFailed(f"another rank's cell failed alone while {cell_id} failed here")
        raise FailedAlone(cell_id, status, error)

    def other_failed_alone(self, unreachable: dict | None = None) -> dict | None:
        """Another rank's declared one-rank failure ({rank, cell_id}), or None (none, or this rank's).
        `unreachable`: what an unreachable store counts as (the guard, after a step raised: the rank that held
        the store is gone with its group; the watch thread: nothing, it asks again)."""
        try:
            if not self.store.check([self._alone_key()]):
                return None
            declared = json.loads(self.store.get(self._alone_key()))
        except (RuntimeError, dist.DistError, ValueError):
            return unreachable
        return None if declared.get("rank") == self.rank else declared


class NonFiniteLoss(RuntimeError):
    """A trainer's loss is NaN or inf: its cell fails with this message alone (no traceback: the model's
    arithmetic, not the suite's code, is the cause)."""


def failure(error: BaseException, cell_id: str = "") -> tuple[str, str]:
    """(status, error) of an exception: `oom` for a device out of memory; `timeout` for a collective that
    outlived the process group's timeout (its rank's record written: bench/worker/hangs.py), its error
    opening with which collective and since when, and for one whose peer left it after such a timeout
    (gloo: "Connection closed by peer", hangs.peer_timed_out); else `failed`. Then the exception's line and
    its traceback's tail (bench.schema.error_text)."""
    if isinstance(error, NonFiniteLoss):
        return "failed", str(error)
    lines = "".join(traceback.format_exception(error)).strip().splitlines()
    if hangs.timed_out(error):
        return "timeout", error_text(f"{hangs.record_timeout(error, cell_id)}; {type(error).__name__}: "
                                     f"{error}", lines)
    if (peer := hangs.peer_timed_out(error)) is not None:   # its peer timed out first and left it
        return "timeout", error_text(f"{hangs.record_lost_peer(error, cell_id, peer)}; "
                                     f"{type(error).__name__}: {error}", lines)
    status = "oom" if isinstance(error, torch.OutOfMemoryError) else "failed"
    return status, error_text(f"{type(error).__name__}: {error}", lines)


def nonfinite_step(error: str) -> float:
    """The step a NonFiniteLoss error names ("loss is NaN at step k"), inf for any other error."""
    match = re.search(r"^loss is \S+ at step (\d+) ", error)
    return int(match.group(1)) if match else math.inf


def check_losses(losses: list[torch.Tensor]) -> None:
    """Raise NonFiniteLoss ("loss is NaN at step k", or inf; k counts the trainer's optimizer steps from 1)
    when a loss of `losses` (one per step, on the device) is not finite. A device→host sync: called between
    phases, never inside a timed step."""
    if not losses:
        return
    values = torch.stack([loss.detach().float().reshape(()) for loss in losses]).cpu()
    bad = (~torch.isfinite(values)).nonzero()
    if not len(bad):
        return
    k = int(bad[0, 0])
    value = float(values[k])
    word = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    rank = dist.get_rank() if dist.is_initialized() else 0
    raise NonFiniteLoss(f"loss is {word} at step {k + 1} (rank {rank}, {len(losses)} steps run): the "
                        "model's loss is not finite, so its step times and throughput are not recorded")


class Guard:
    """The failed cells of one group: `local` (this rank's, not yet agreed) and `failed` (agreed by every
    rank: cell id → (status, error)); `peers` (None: one process alone, as in tests) finds a failure on
    some ranks only."""

    def __init__(self, peers: Peers | None = None):
        self.local: dict[str, tuple[str, str]] = {}
        self.failed: dict[str, tuple[str, str]] = {}
        self.peers = peers

    @contextmanager
    def cell(self, cell_id: str):
        """Run the body for one cell: an exception is kept as that cell's failure, not raised. A cell that
        already failed here runs nothing more (its trainer may be half-built or half-stepped)."""
        if cell_id in self.local:
            yield False
            return
        try:
            yield True
        except (dist.DistError, GroupBroken):  # the process group failed (a peer gone, a timeout), or a
            raise                              # peer's failure ended the group: no cell's own fault
        except Exception as e:  # noqa: BLE001 - any other failure of one cell's trainer is that cell's
            if self.peers is not None and self.peers.other_failed_alone(unreachable={}) is not None:
                raise PeerFailed(f"{cell_id}: {type(e).__name__} after another rank's cell failed alone"
                                 ) from e
            self.step_failed(cell_id, *failure(e, cell_id))

    def step_failed(self, cell_id: str, status: str, error: str) -> None:
        """A step of `cell_id` raised on this rank: keep it as the cell's failure, and (with peers) find out
        whether the other ranks failed alike (Peers.failed: else FailedAlone ends the group)."""
        self.local.setdefault(cell_id, (status, error))
        if self.peers is not None:
            self.peers.failed(cell_id, status, error)

    def fail(self, cell_id: str, status: str, error: str) -> None:
        """Record a failure found without an exception (a loss that is not finite, a known refusal)."""
        self.local.setdefault(cell_id, (status, error))

    def step(self, trainer):
        """`trainer.step` under its cell's guard, for the timed rounds: once it has raised it does nothing
        (the other trainers' rounds go on; the failed one leaves at the next `agree`)."""
        def run():
            with self.cell(trainer.cell.cell_id) as live:
                if live:
                    trainer.step()
        return run

    def agree(self) -> dict[str, tuple[str, str]]:
        """Collective. Every rank's failures so far, merged (for a cell that failed on several ranks, the
        earliest: a loss not finite at the earliest step — a NaN on one rank reaches the others' parameters
        through the gradient all-reduce and their losses a step later — else the lowest rank's error);
        returns them all (`failed`)."""
        gathered = [None] * dist.get_world_size() if dist.is_initialized() else [self.local]
        if dist.is_initialized():
            dist.all_gather_object(gathered, self.local)
        new: dict[str, list[tuple[str, str]]] = {}
        for local in gathered:  # rank order
            for cell_id, outcome in local.items():
                if cell_id not in self.failed:
                    new.setdefault(cell_id, []).append(outcome)
        for cell_id, outcomes in new.items():
            self.failed[cell_id] = min(outcomes, key=lambda o: nonfinite_step(o[1]))  # stable: rank order
        self.local.update({k: v for k, v in self.failed.items() if k not in self.local})
        return self.failed

    def each(self, items: list, fn, cell_of=lambda item: item.cell) -> tuple[list, dict]:
        """Collective (`agree`). `fn(item)` for each item (a trainer, or a cell: `cell_of` says which cell an
        item is) under its cell's guard → (the items whose cell has failed on no rank, fn's result by their
        cell id)."""
        results = {}
        for item in items:
            with self.cell(cell_of(item).cell_id) as live:
                if live:
                    results[cell_of(item).cell_id] = fn(item)
        failed = self.agree()
        return ([item for item in items if cell_of(item).cell_id not in failed],
                {cell_id: out for cell_id, out in results.items() if cell_id not in failed})

    def outcome(self, cell_id: str) -> tuple[str, str, dict]:
        """A failed cell's (status, error, row): nothing measured."""
        status, error = self.failed[cell_id]
        return status, error, {}
