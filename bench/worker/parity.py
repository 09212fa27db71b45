"""The parity gates beyond "every rank holds the same parameters" (cell.py): a cell whose numerics
legitimately differ from torch DDP's is compared with an eager, uncompressed torch DDP trainer of the
same configuration that stepped the same batches from the same weights.

- a sharded engine (fsdp2) or a compiled cell: gated on what a numerical bug changes and rounding does
  not (docs/design.md "Parity gates" derives the thresholds):
  the relative distance of the parameter updates, ‖θ − θ_ref‖ / ‖θ_ref − θ_0‖, over all parameters and
  for the worst parameter tensor, and the loss trajectory, max over steps of |L − L_ref| / |L_ref|;
  above a threshold of its precision: `diverged`;
- a lossy comm hook (PowerSGD): no pass/fail; the row carries `loss_rel_distance`.

Why not |θ − θ_ref| per element: AdamW moves an element by about lr whatever its gradient's size, so an
element whose gradient is near zero and changes sign under rounding moves up to 2·lr the other way, in
any precision; the maximum over millions of elements always finds such an element (fsdp2 bf16 on
transformer.tiny: 7.2e-4, 309× the old per-element bound). A norm over a tensor weighs those few elements
by their share of it; a dropped or corrupted gradient moves a whole share.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from bench import engines
from bench.matrix import Cell, option_defaults
from bench.schema import DEFAULT_BUCKET_MB, ENGINE_OPTION_NAMES, LOSSY_COMM_HOOKS
from bench.worker import measure
from bench.worker.trainer import Trainer, build_on, seed_generators

# e: the relative error of one gradient element that an honest engine may add, by precision. fp32/tf32:
# the sum over ranks in another order, divided by the world size before (DDP) or after (FSDP2) it: a few
# fp32 ulps (2^-23), given 2^5 of margin for AdamW's division by √v; bf16/fp16: one rounding to the
# format's 8 (bf16) or 11 (fp16) bits of mantissa, where an engine casts at another place (FSDP2's
# MixedPrecisionPolicy casts parameters per block, autocast per op).
GRADIENT_REL_ERROR = {"fp32": 2.0**-18, "tf32": 2.0**-18, "bf16": 2.0**-8, "fp16": 2.0**-11}
# A compiled cell's kernels fuse and reorder floating-point sums in forward and backward too: measured
# (CPU, mlp.small, ws 2, 15 steps, inductor, torch and fsdp2 alike) e ≈ 2^-15; allowed 2^-12 (8× margin).
# Low precisions keep their rounding figure, which is larger.
COMPILED_REL_ERROR = 2.0**-12
# Thresholds from e (docs/design.md "Parity gates"): rounding flips the sign of an element's AdamW step
# only where |g| < e·(the tensor's typical |g|), a share ≈ 2φ(0)·e ≈ 0.8·e of a tensor for bell-shaped
# gradients, and such an element ends at most 2× its own update away: ‖θ − θ_ref‖ ≤ √(0.8·e)·2·‖θ_ref − θ_0‖
# ≈ 1.8·√e. UPDATE_FACTOR rounds that up over all parameters; a single tensor, whose gradients may be
# sparser than bell-shaped (an embedding's rows of unseen tokens), gets twice that, and room for one
# element of its n to flip (2/√n of its update: a 10-element bias is 1 flip from 0.63). The loss goes
# through a forward pass that rounds at every op: LOSS_FACTOR·e (measured ≤ 1.5·e on transformer.tiny bf16).
UPDATE_FACTOR = 2.0
TENSOR_FACTOR = 4.0
LOSS_FACTOR = 4.0


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The largest distances an honest engine's rounding explains, for one precision."""

    update: float         # ‖θ − θ_ref‖ / ‖θ_ref − θ_0‖ over all parameters
    update_tensor: float  # the same for one parameter tensor, before its room for one flip (tensor())
    loss: float           # max over steps of |L − L_ref| / |L_ref|

    def tensor(self, n: int) -> float:
        """A tensor of n elements: update_tensor, widened by one element's flip, 2/√n: √(u² + 4/n)."""
        return math.sqrt(self.update_tensor**2 + 4.0 / n)


def thresholds(precision: str, compiled: bool = False) -> Thresholds:
    """The gate's thresholds from e (GRADIENT_REL_ERROR, COMPILED_REL_ERROR for a compiled cell)."""
    e = GRADIENT_REL_ERROR[precision]
    e = max(e, COMPILED_REL_ERROR) if compiled else e
    return Thresholds(update=UPDATE_FACTOR * math.sqrt(e), update_tensor=TENSOR_FACTOR * math.sqrt(e),
                      loss=LOSS_FACTOR * e)


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


def update_distances(params: list[torch.Tensor], reference: list[torch.Tensor],
                     initial: list[torch.Tensor]) -> tuple[float, list[tuple[float, int]]]:
    """‖θ − θ_ref‖ / ‖θ_ref − θ_0‖, how far the engine's parameters are from the reference's in units of
    how far the reference moved, over all parameters, and per tensor (distance, elements) (rank-local,
    whole parameters in one order). A tensor the reference did not move has no distance of its own (0/0)
    and is left out of the list."""
    gap = moved = 0.0
    tensors = []
    for p, r, p0 in zip(params, reference, initial, strict=True):
        g = float((p.float() - r.float()).norm()) ** 2
        m = float((r.float() - p0.float()).norm()) ** 2
        gap, moved = gap + g, moved + m
        if m > 0:
            tensors.append((math.sqrt(g / m), p.numel()))
    return (math.sqrt(gap / moved) if moved > 0 else 0.0), tensors


def loss_rel_distance(losses: list[torch.Tensor], reference: list[torch.Tensor], device) -> float:
    """Collective. max over steps of |loss − reference loss| / |reference loss| (rank-local losses of the
    same batches), the maximum over ranks."""
    mine = torch.stack([x.float() for x in losses])
    ref = torch.stack([x.float() for x in reference])
    local = float(((mine - ref).abs() / ref.abs().clamp_min(1e-12)).max())
    return measure.max_over_ranks(local, device)


def initial_parameters(trainer: Trainer) -> list[torch.Tensor]:
    """θ_0: the weights every trainer of the cell started from, built again as Trainer built them (the
    same seeds on the same device draw the same numbers), in `parameters()` order."""
    seed_generators(trainer.seed, trainer.device)
    module = build_on(trainer.workload, trainer.device)
    return [p.detach() for p in module.parameters()]


def gate(trainer: Trainer, reference: Trainer, skipped: tuple[int | None, int | None] = (None, None)) -> dict:
    """Collective. The row's gate columns for `trainer` against `reference` (both stepped as often on the
    same batches from the same weights): lossy → loss_rel_distance only; otherwise the update distances,
    the loss distance, param_max_abs_diff, `parity_gate` (passed | diverged | not comparable) and, when
    diverged, `parity_failure` (why, with the figures). `skipped`: fp16's skipped optimizer steps of each
    (cell.skipped_steps): when they differ, the trajectories parted at a step one of them skipped for an
    overflow (FSDP2's fp16 parameters can overflow where autocast's fp32 ops do not), which the fp16
    recipe makes legitimate, and no distance can say more."""
    device = trainer.device
    losses = loss_rel_distance(trainer.losses, reference.losses, device)
    if trainer.cell.comm_hook in LOSSY_COMM_HOOKS:
        return {"lossy": True, "loss_rel_distance": losses}
    mine = trainer.engine.full_parameters(trainer.model)
    theirs = reference.engine.full_parameters(reference.model)
    overall, tensors = update_distances(mine, theirs, initial_parameters(reference))
    limit = thresholds(trainer.cell.precision, compiled=trainer.cell.compile not in (None, "none"))
    worst = max(tensors, default=(0.0, 1), key=lambda t: t[0] / limit.tensor(t[1]))  # nearest its bound
    row = {"param_update_distance": measure.max_over_ranks(overall, device),
           "param_update_distance_max": measure.max_over_ranks(max((d for d, _ in tensors), default=0.0),
                                                               device),
           "loss_rel_distance": losses,
           "param_max_abs_diff": measure.max_over_ranks(max_abs_diff(mine, theirs), device)}
    if skipped[0] != skipped[1]:
        return row | {"parity_gate": f"not comparable: fp16 skipped {skipped[0]} steps, torch DDP "
                                     f"{skipped[1]}"}
    # every rank holds the same whole parameters, so every rank decides alike; the maxima above agree too
    over = [f"{name} {value:.3g} > {bound:.3g}" for name, value, bound in (
        ("update distance", row["param_update_distance"], limit.update),
        (f"a {worst[1]}-element tensor's update distance", worst[0], limit.tensor(worst[1])),
        ("loss distance", losses, limit.loss)) if not value <= bound]
    if not over:
        return row | {"parity_gate": "passed"}
    return row | {"parity_gate": "diverged",
                  "parity_failure": f"trains differently from eager torch DDP at {trainer.cell.precision}: "
                                    + "; ".join(over) + " (bench/worker/parity.py)"}
