"""The parity gates beyond "every rank holds the same parameters" (cell.py): a cell whose numerics
legitimately differ from torch DDP's is compared with an eager, uncompressed torch DDP trainer of the
same configuration that stepped the same batches from the same weights.

- a sharded engine (fsdp2) or a compiled cell: its parameters, gathered, must match DDP's within
  `tolerance(precision, steps)` (docs/design.md "Parity gates" derives it); else the cell is `diverged`;
- a lossy comm hook (PowerSGD): no pass/fail; the row carries `loss_rel_distance`, the largest relative
  gap between its loss trajectory and DDP's.
"""

from __future__ import annotations

import dataclasses

import torch

from bench import engines
from bench.matrix import Cell, option_defaults
from bench.schema import DEFAULT_BUCKET_MB, ENGINE_OPTION_NAMES, LOSSY_COMM_HOOKS
from bench.worker import measure
from bench.worker.trainer import ADAMW_LR

# Relative error of one gradient element that the gate allows, by precision: fp32/tf32: the sum over
# ranks taken in another order and divided by the world size before (DDP) or after (FSDP2) it, a few fp32
# ulps (2^-23 ≈ 1.2e-7), given a margin of 2^5 for AdamW's division by √v; bf16/fp16: the gradient's
# rounding to the 8 (bf16) or 11 (fp16) bits of mantissa, 2^-8 ≈ 3.9e-3 and 2^-11, where an engine casts
# at a different place (FSDP2's MixedPrecisionPolicy casts parameters per block, autocast per op).
GRADIENT_REL_ERROR = {"fp32": 2.0**-18, "tf32": 2.0**-18, "bf16": 2.0**-8, "fp16": 2.0**-11}
# A compiled cell's kernels fuse and reorder floating-point sums in forward and backward too: measured
# (CPU, mlp.small, ws 2, 15 steps, inductor, torch and fsdp2 alike) 4.28e-8, i.e. e ≈ 2.9e-5 ≈ 2^-15;
# allowed 2^-12 (8× margin). Low precisions keep their rounding figure, which is larger.
COMPILED_REL_ERROR = 2.0**-12


def tolerance(precision: str, steps: int, compiled: bool = False) -> float:
    """Largest |parameter − DDP's| the gate accepts after `steps` AdamW steps: AdamW moves a parameter by
    at most about lr per step whatever the gradient's scale, so a relative gradient error e moves it by at
    most about e·lr per step more or less."""
    error = GRADIENT_REL_ERROR[precision]
    return steps * ADAMW_LR * (max(error, COMPILED_REL_ERROR) if compiled else error)


def needs_reference(cell: Cell) -> bool:
    """Whether the cell is compared with eager, uncompressed torch DDP."""
    return (engines.get(cell.engine).sharded or cell.compile not in (None, "none")
            or cell.comm_hook in LOSSY_COMM_HOOKS)


def baseline_cell(cell: Cell) -> Cell:
    """The eager, uncompressed torch DDP cell of `cell`'s configuration (torch's default bucket for an
    engine without buckets), every reference option at its default."""
    ref = engines.reference()
    defaults = option_defaults(ref.name)
    options = {k: defaults.get(k) for k in ENGINE_OPTION_NAMES}
    bucket = cell.bucket_cap_mb if cell.bucket_cap_mb is not None else DEFAULT_BUCKET_MB
    return dataclasses.replace(cell, engine=ref.name, bucket_cap_mb=bucket, **options)


def max_abs_diff(params: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Largest element-wise |difference| (both lists whole parameters in the same order), rank-local."""
    return max((float((p.float() - r.float()).abs().max()) for p, r in zip(params, reference, strict=True)),
               default=0.0)


def loss_rel_distance(losses: list[torch.Tensor], reference: list[torch.Tensor], device) -> float:
    """Collective. max over steps of |loss − reference loss| / |reference loss| (rank-local losses of the
    same batches), the maximum over ranks."""
    mine = torch.stack([x.float() for x in losses])
    ref = torch.stack([x.float() for x in reference])
    local = float(((mine - ref).abs() / ref.abs().clamp_min(1e-12)).max())
    return measure.max_over_ranks(local, device)


def gate(trainer, reference, steps: int) -> dict:
    """Collective. The row's gate columns for `trainer` against `reference` (both stepped `steps` times
    on the same batches): lossy → loss_rel_distance; otherwise param_max_abs_diff and `within_tolerance`."""
    device = trainer.device
    if trainer.cell.comm_hook in LOSSY_COMM_HOOKS:
        distance = loss_rel_distance(trainer.losses, reference.losses, device)
        return {"lossy": True, "loss_rel_distance": distance}
    mine = trainer.engine.full_parameters(trainer.model)
    theirs = reference.engine.full_parameters(reference.model)
    diff = measure.max_over_ranks(max_abs_diff(mine, theirs), device)
    tol = tolerance(trainer.cell.precision, steps, compiled=trainer.cell.compile not in (None, "none"))
    return {"param_max_abs_diff": diff, "param_tolerance": tol, "within_tolerance": diff <= tol}
