"""The launcher's check of a user model before anything is created: built on the meta device, then one
forward and backward of a two-sample batch there, so no weight is allocated and no arithmetic is done.

`bench run` (bench/run/planner.py) calls `check_user_model` for a user spec; each problem is a
UserModelError, one line naming the spec (file and class) and the cause — the error's last line — which
the CLI reports with exit 2 before a run folder exists:

- build_model raises, or cannot run under `torch.device("meta")` (a model that reads its own values
  while it is built): the estimate counts parameters on meta only (bench/run/estimate.py), never with a
  real build in the launcher;
- build_model returns something other than an nn.Module, or a model with no trainable parameter;
- make_dataset, batch or loss raises; loss returns anything but a one-element tensor with a gradient
  (a model whose forward returns a tuple, a dict or None fails here, in the loss that reads it);
- backward leaves trainable parameters without a gradient (unused parameters: torch's DDP fails on them
  and every engine would all-reduce dead gradients).

What meta cannot decide is left to the ranks, with a note on stderr: an operation with no meta kernel or
that needs values (`.item()`, boolean masks), or a forward that needs the process group. A failure that
depends on the rank or the data (a forward raising on one rank only) is only seen there: the cell's row
names it (bench/worker/guard.py) and the other cells keep theirs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from .base import WorkloadOptions
from .user import UserModelError, build_user_workload

SAMPLES = 2   # the pre-flight batch: enough for batch-norm-like layers, nothing to compute on meta
MAX_NAMES = 5  # unused parameters named in the message


@dataclass(frozen=True)
class Counts:
    """Trainable parameters (elements) and parameter tensors of the model built on meta."""

    params: int
    tensors: int


_CHECKED: dict[tuple[str, str, str], Counts] = {}  # (spec, size, options) → counts: one check per process


def last_line(error: BaseException) -> str:
    """'TypeError: the error's last non-empty line' (a traceback-like message keeps only its end)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1]}" if lines else type(error).__name__


def _undecidable_on_meta(error: BaseException) -> bool:
    """An error meta cannot tell from a broken model: no meta kernel, a value read from a meta tensor,
    or a forward that asks for the process group (which only the ranks have)."""
    text = str(error).lower()
    return (isinstance(error, NotImplementedError) or "meta" in text
            or "process group" in text or "data-dependent" in text)


def check_user_model(spec: str, size: str, options: WorkloadOptions | None = None) -> Counts:
    """Raise UserModelError for a model the ranks could not run (module docstring); else its counts."""
    key = (spec, size, repr(options))
    if key not in _CHECKED:
        _CHECKED[key] = _check(spec, size, options or WorkloadOptions())
    return _CHECKED[key]


def _fail(spec: str, what: str, error: BaseException | None = None) -> UserModelError:
    return UserModelError(f"model={spec!r}: {what}" + (f" raised {last_line(error)}" if error else ""))


def _check(spec: str, size: str, options: WorkloadOptions) -> Counts:
    workload = build_user_workload(spec, size, options)
    name = type(workload).__name__
    try:
        with torch.device("meta"):
            model = workload.build_model()
    except Exception as e:  # the user's build: its own error, one line
        raise _fail(spec, f"{name}.build_model() on the meta device (how the launcher sizes it without "
                          "allocating; a model must not read its own values while it is built)", e) from None
    if not isinstance(model, nn.Module):
        raise _fail(spec, f"{name}.build_model() returned {type(model).__name__}, not a torch.nn.Module")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise _fail(spec, f"{name}.build_model() has no trainable parameters (requires_grad=True): there is "
                          "nothing to train or all-reduce")
    counts = Counts(sum(p.numel() for _, p in trainable), len(trainable))
    try:
        _run_once(spec, name, workload, model, trainable)
    except _Undecided as e:
        print(f"note: model={spec!r}: not checked before launch ({e}); its cells check it", file=sys.stderr)
    return counts


class _Undecided(Exception):
    """Meta cannot run this model's step; the ranks will."""


def _run_once(spec: str, name: str, workload, model: nn.Module, trainable: list) -> None:
    """One forward and backward of a SAMPLES batch on meta; raises UserModelError or _Undecided."""
    meta = torch.device("meta")
    try:
        batch = workload.make_dataset(SAMPLES, meta, 0).batch(torch.arange(SAMPLES))
    except Exception as e:  # noqa: BLE001 - the user's dataset
        if _undecidable_on_meta(e):
            raise _Undecided(last_line(e)) from None
        raise _fail(spec, f"{name}.make_dataset({SAMPLES}, meta, seed=0).batch(...)", e) from None
    try:
        loss = workload.loss(model, batch)
    except Exception as e:  # noqa: BLE001 - the user's forward and loss
        if _undecidable_on_meta(e):
            raise _Undecided(last_line(e)) from None
        raise _fail(spec, f"{name}.loss(model, batch) (the model's forward and the loss)", e) from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
               else "None" if loss is None else f"a {type(loss).__name__}")
        raise _fail(spec, f"{name}.loss(model, batch) returned {got}, not a one-element loss tensor "
                          "(a forward that returns a tuple or dict needs the loss to pick the tensor)")
    if loss.grad_fn is None:
        raise _fail(spec, f"{name}.loss(model, batch) returned a loss with no gradient (computed without "
                          "the model's parameters, or under no_grad)")
    try:
        loss.backward()
    except Exception as e:  # noqa: BLE001 - the user's custom autograd, if any
        if _undecidable_on_meta(e):
            raise _Undecided(last_line(e)) from None
        raise _fail(spec, f"{name}: backward of the loss", e) from None
    unused = [n for n, p in trainable if p.grad is None]
    if unused:
        shown = ", ".join(unused[:MAX_NAMES]) + (f" and {len(unused) - MAX_NAMES} more"
                                                 if len(unused) > MAX_NAMES else "")
        raise _fail(spec, f"{len(unused)} of {len(trainable)} trainable parameters get no gradient from "
                          f"the loss ({shown}): remove them or set requires_grad_(False) on them (torch's "
                          "DDP fails on unused parameters)")
