"""One guard per cell of a side-by-side group: a cell whose trainer raises (its engine's `wrap`, a model
that cannot run under it, a loss that is not finite) leaves the group with its own error, and the other
cells of the group go on and keep their rows.

Every rank must keep the same trainers, or their collectives pair up wrongly. So a phase runs each trainer's
part under its cell's guard (`with guard.cell(cell_id)`: the exception is kept, not raised) and ends with
`agree`, one all_gather_object of what failed on which rank, after which every rank drops the same cells
(`each` returns those left). A cell that failed on any rank fails on all, with the lowest rank's error.

What this cannot rescue: a failure of the process group itself (`dist.DistError`, re-raised: the group's
"error" event ends the launch as before), and a failure on some ranks only, in the middle of a collective
the other ranks have entered: those wait in it until the process group's timeout, and the launcher's
watchdog records the group `timeout`. A deterministic failure (a bug, a refusal, a NaN from the first
step) happens on every rank at the same point, and is what the guards are for.
"""

from __future__ import annotations

import math
import traceback
from contextlib import contextmanager

import torch
import torch.distributed as dist

from bench.schema import error_text


class NonFiniteLoss(RuntimeError):
    """A trainer's loss is NaN or inf: its cell fails with this message alone (no traceback: the model's
    arithmetic, not the suite's code, is the cause)."""


def failure(error: BaseException) -> tuple[str, str]:
    """(status, error) of an exception: `oom` for a device out of memory, else `failed`; the error is the
    exception's line first, then its traceback's tail (bench.schema.error_text)."""
    if isinstance(error, NonFiniteLoss):
        return "failed", str(error)
    status = "oom" if isinstance(error, torch.OutOfMemoryError) else "failed"
    lines = "".join(traceback.format_exception(error)).strip().splitlines()
    return status, error_text(f"{type(error).__name__}: {error}", lines)


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
    rank: cell id → (status, error))."""

    def __init__(self):
        self.local: dict[str, tuple[str, str]] = {}
        self.failed: dict[str, tuple[str, str]] = {}

    @contextmanager
    def cell(self, cell_id: str):
        """Run the body for one cell: an exception is kept as that cell's failure, not raised. A cell that
        already failed here runs nothing more (its trainer may be half-built or half-stepped)."""
        if cell_id in self.local:
            yield False
            return
        try:
            yield True
        except dist.DistError:  # the process group failed (a peer gone, a timeout): no cell's own fault, and
            raise               # nothing after it can pair up; the group's "error" event says so
        except Exception as e:  # noqa: BLE001 - any other failure of one cell's trainer is that cell's
            self.local[cell_id] = failure(e)

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
        """Collective. Every rank's failures so far, merged (the lowest rank's error for a cell that failed on
        several); returns them all (`failed`)."""
        gathered = [None] * dist.get_world_size() if dist.is_initialized() else [self.local]
        if dist.is_initialized():
            dist.all_gather_object(gathered, self.local)
        for local in gathered:  # rank order: the lowest rank's error wins
            for cell_id, outcome in local.items():
                self.failed.setdefault(cell_id, outcome)
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
