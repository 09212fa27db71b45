"""The parity gates beyond "every rank holds the same parameters" (cell.py): a cell whose numerics
legitimately differ from torch DDP's is compared with an eager, uncompressed torch DDP trainer of the
same configuration that stepped the same batches from the same weights.

- a sharded engine (fsdp2) or a compiled cell: gated on the relative distance of the parameter updates,
  ‖θ − θ_ref‖ / ‖θ_ref − θ_0‖, over all parameters and per parameter tensor, and on the loss trajectory,
  max over steps of |L − L_ref| / |L_ref|. The bound on each is measured in the same run, not looked up:
  a second eager torch DDP trainer, the *rerounded twin*, steps the same batches from the same weights
  with one more rounding of the precision on every parameterised module's output (`Rerounding`), and
  its distances from the reference are how far two honest trainings of this model, at this precision,
  drift apart over these steps. The cell is `diverged` when a distance exceeds DRIFT_FACTOR times the
  twin's (a tensor: with room for one flipped element, 2/√n);
- a lossy comm hook (PowerSGD): no pass/fail; the row carries `loss_rel_distance`.

Why a measured bound (docs/design.md "Parity gates"): rounding differences grow through training by an
amount that depends on the model's depth, its width and the number of steps. Bounds fixed from the
precision and calibrated on a 4-layer model called honest fsdp2 and compiled cells diverged on SmolLM2-360M
(an H200: fsdp2 bf16 loss distance 0.101 against 0.0156; fp32 passed at 9.8e-6 and failed at 1.85e-5
against 1.53e-5 in two runs of the same cells).

Why not |θ − θ_ref| per element: AdamW moves an element by about lr whatever its gradient's size, so an
element whose gradient is near zero and changes sign under rounding moves up to 2·lr the other way, in
any precision; the maximum over millions of elements always finds such an element. A norm over a tensor
weighs those few elements by their share of it; a dropped or corrupted gradient moves a whole share.
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

# One unit in the last place of each precision's format, relative (2^-(mantissa bits)): the size of one
# rounding's difference between two honest placements of it. fp32 2^-23; tf32 keeps fp16's 10 mantissa bits
# in its matmul inputs; bf16 2^-7; fp16 2^-10. The twin rounds every parameterised module's output once
# more at this size, the precision's (not the tensor's: where autocast keeps an op in fp32, FSDP2's
# MixedPrecisionPolicy runs it in bf16 — its norms, its residual stream).
ULP = {"fp32": 2.0**-23, "tf32": 2.0**-10, "bf16": 2.0**-7, "fp16": 2.0**-10}
# How much further than the twin an engine may drift: honest engines measured at most 1.2× the twin's
# update distance and 1.3× its loss distance (docs/design.md "Parity gates": fsdp2 at fp32, bf16, fp16 and
# torch + inductor on a 4- and a 32-layer transformer; benchmarks/parity_margin.py prints them), and one
# twin's distance varies between seeds of its rounding by up to 3× in the loss; a gradient that loses a
# tensor, a share of its elements or a rank's contribution drifts 10× to 10,000× further.
DRIFT_FACTOR = 4.0
SEED_OFFSET = 7919  # the twin's rounding draws from run.seed + SEED_OFFSET + rank: its own, every rank's own


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


@dataclasses.dataclass(frozen=True)
class Distances:
    """How far one trainer ended from the reference (every rank holds the same whole parameters of both, so
    these agree over ranks, the loss's maximum over ranks aside): ‖θ − θ_ref‖ / ‖θ_ref − θ_0‖ over all
    parameters, the same per tensor (None: the reference did not move it, 0/0), the tensors' sizes and how
    far the reference moved each (‖θ_ref − θ_0‖ per tensor), and max over steps of |L − L_ref| / |L_ref|."""

    update: float
    tensors: list[float | None]
    sizes: list[int]
    moved: list[float]
    loss: float


def update_distances(params: list[torch.Tensor], reference: list[torch.Tensor],
                     initial: list[torch.Tensor]) -> tuple[float, list[float | None], list[float]]:
    """‖θ − θ_ref‖ / ‖θ_ref − θ_0‖, how far the engine's parameters are from the reference's in units of
    how far the reference moved, over all parameters; the same per tensor (None where the reference did not
    move the tensor: 0/0); and ‖θ_ref − θ_0‖ per tensor (rank-local, whole parameters in one order)."""
    gap = moved = 0.0
    tensors, norms = [], []
    for p, r, p0 in zip(params, reference, initial, strict=True):
        g = float((p.float() - r.float()).norm()) ** 2
        m = float((r.float() - p0.float()).norm()) ** 2
        gap, moved = gap + g, moved + m
        tensors.append(math.sqrt(g / m) if m > 0 else None)
        norms.append(math.sqrt(m))
    return (math.sqrt(gap / moved) if moved > 0 else 0.0), tensors, norms


def loss_rel_distance(losses: list[torch.Tensor], reference: list[torch.Tensor], device) -> float:
    """Collective. max over steps of |loss − reference loss| / |reference loss| (rank-local losses of the
    same batches), the maximum over ranks."""
    mine = torch.stack([x.float() for x in losses])
    ref = torch.stack([x.float() for x in reference])
    local = float(((mine - ref).abs() / ref.abs().clamp_min(1e-12)).max())
    return measure.max_over_ranks(local, device)


def distances(trainer: Trainer, reference: Trainer, initial: list[torch.Tensor]) -> Distances:
    """Collective (fsdp2 gathers its shards; the loss's maximum over ranks). `trainer` against `reference`."""
    mine = trainer.engine.full_parameters(trainer.model)
    theirs = reference.engine.full_parameters(reference.model)
    update, tensors, moved = update_distances(mine, theirs, initial)
    return Distances(update=update, tensors=tensors, sizes=[p.numel() for p in theirs], moved=moved,
                     loss=loss_rel_distance(trainer.losses, reference.losses, trainer.device))


def initial_parameters(trainer: Trainer) -> list[torch.Tensor]:
    """θ_0: the weights every trainer of the cell started from, built again as Trainer built them (the
    same seeds on the same device draw the same numbers), in `parameters()` order."""
    seed_generators(trainer.seed, trainer.device)
    module = build_on(trainer.workload, trainer.device)
    return [p.detach() for p in module.parameters()]


class Rerounding:
    """One more rounding of a precision on the output of every module that holds parameters of its own (a
    Linear, an Embedding, a norm): x ← x · (1 + δ) per element, δ uniform in [−ULP, ULP] of the precision,
    computed in fp32 and rounded back to x's dtype, so each element lands on the neighbour of its value
    about as often as another placement of a rounding would put it there. Its gradient flows through the
    same factor, so backward is rerounded alike. The draws come from a generator of its own (the
    trainers' seeds and data are untouched)."""

    def __init__(self, model: torch.nn.Module, ulp: float, seed: int, device: torch.device):
        self.ulp = ulp
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.handles = [m.register_forward_hook(self.hook) for m in model.modules()
                        if any(True for _ in m.parameters(recurse=False))]

    def hook(self, module, args, out):
        if not (isinstance(out, torch.Tensor) and out.is_floating_point()):
            return None
        noise = torch.rand(out.shape, generator=self.generator, device=out.device, dtype=torch.float32)
        return (out.float() * (1 + (2 * noise - 1) * self.ulp)).to(out.dtype)


def step_allowance(skipped: int, lr: float, sizes: list[int],
                   moved: list[float]) -> tuple[float, list[float]]:
    """What `skipped` optimizer steps that one trainer skipped and the other did not may add to the update
    distances, over all parameters and per tensor (fp16's GradScaler skips a step whose gradients
    overflowed; which steps overflow can differ between honest engines, FSDP2's fp16 parameters overflowing
    where autocast's fp32 ops do not): AdamW moves an element by about lr a step (|m̂/√v̂| ≈ 1), so a step
    is lr·√n of a tensor of n elements, over how far the reference moved it."""
    total = math.sqrt(sum(m * m for m in moved))
    overall = skipped * lr * math.sqrt(sum(sizes)) / total if total > 0 else 0.0
    return overall, [skipped * lr * math.sqrt(n) / m if m > 0 else 0.0 for n, m in zip(sizes, moved)]


def skipped_at(trainer: Trainer) -> set[int]:
    """Collective for fp16 (every rank's trainer has the same precision): the steps whose update the trainer
    skipped for an overflow on any rank (Precision.skipped_at: a rank's sharded gradients can overflow
    alone); empty for other precisions. A sync."""
    import torch.distributed as dist

    mine = trainer.precision.skipped_at()
    if not trainer.precision.scaler.is_enabled() or not dist.is_initialized():
        return mine
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, sorted(mine))
    return {k for steps in every for k in steps}


def gate(trainer: Trainer, reference: Trainer, twin: Trainer | None,
         skipped: tuple[set[int], set[int]] = (set(), set())) -> dict:
    """Collective. The row's gate columns for `trainer` against `reference`, with `twin` (the rerounded
    reference: References.twin) for the bounds, all three stepped as often on the same batches from the
    same weights: lossy → loss_rel_distance only; otherwise the update distances, the loss distance,
    param_max_abs_diff, the bounds used (parity_*_bound: DRIFT_FACTOR × the twin's distances), `parity_gate`
    (passed | diverged) and, when diverged, `parity_failure` (why, with the figures).

    `skipped`: fp16's skipped optimizer steps (skipped_at) of the cell and of the reference. The reference
    and the twin skipped the steps the cell skipped (References.compared forces them), so those cancel and
    every distance is judged. Steps the reference skipped and the cell did not cannot be forced away: then
    the loss trajectories parted at such a step and the loss is not compared, and the update bounds widen
    by what those steps can move (step_allowance); a trainer that moved where the reference did not, or
    stood still where it moved, still drifts a whole update (distance ≈ 1)."""
    device = trainer.device
    if trainer.cell.comm_hook in LOSSY_COMM_HOOKS:
        return {"lossy": True, "loss_rel_distance": loss_rel_distance(trainer.losses, reference.losses,
                                                                      device)}
    initial = initial_parameters(reference)
    mine, drift = distances(trainer, reference, initial), distances(twin, reference, initial)
    extra = len(skipped[1] - skipped[0])   # the reference's skips the cell (and so the twin) did not make
    lr = reference.optimizer.param_groups[0]["lr"]
    widen, widen_tensors = step_allowance(extra, lr, drift.sizes, drift.moved)
    update_bound = DRIFT_FACTOR * drift.update + widen
    loss_bound = None if extra else DRIFT_FACTOR * drift.loss
    tensor_bounds = [math.sqrt((DRIFT_FACTOR * (d or 0.0)) ** 2 + 4.0 / n) + w
                     for d, n, w in zip(drift.tensors, drift.sizes, widen_tensors)]
    judged = [(d, bound, n) for d, bound, n in zip(mine.tensors, tensor_bounds, mine.sizes) if d is not None]
    worst = max(judged, default=(0.0, 1.0, 1), key=lambda t: t[0] / t[1])  # the tensor nearest its bound
    theirs = reference.engine.full_parameters(reference.model)
    row = {"param_update_distance": mine.update, "param_update_distance_max": worst[0],
           "loss_rel_distance": mine.loss,
           "param_max_abs_diff": measure.max_over_ranks(
               max_abs_diff(trainer.engine.full_parameters(trainer.model), theirs), device),
           "parity_update_bound": update_bound, "parity_tensor_bound": worst[1],
           "parity_loss_bound": loss_bound}
    # every rank holds the same whole parameters of all three, so every rank decides alike
    checks = [("update distance", mine.update, update_bound),
              (f"a {worst[2]}-element tensor's update distance", worst[0], worst[1])]
    if loss_bound is not None:
        checks.append(("loss distance", mine.loss, loss_bound))
    over = [f"{name} {value:.3g} > {bound:.3g}" for name, value, bound in checks if not value <= bound]
    note = ""
    if skipped[0] != skipped[1]:
        note = (f" (fp16 skipped {len(skipped[0])} steps, torch DDP {len(skipped[1])}: "
                + ("loss not compared)" if extra else "the reference and its twin skipped them too)"))
    if not over:
        return row | {"parity_gate": "passed" + note}
    return row | {"parity_gate": "diverged",
                  "parity_failure": f"trains differently from eager torch DDP at {trainer.cell.precision}: "
                                    + "; ".join(over) + f" ({DRIFT_FACTOR:g}× how far a rerounded twin "
                                    f"drifted; bench/worker/parity.py){note}"}


class References:
    """The trainers a group's gates compare with, built once per configuration and kept until `release`:
    the eager torch DDP reference (the group's own, or one built and stepped through the same batches) and
    its rerounded twin. Collective when building."""

    def __init__(self, trainers: list[Trainer], config, rank: int, world_size: int):
        self.trainers, self.config, self.rank, self.world_size = trainers, config, rank, world_size
        self.built: dict[tuple, Trainer] = {}

    def _replay(self, cell: Cell, steps: int, schedule_len: int, rerounded: bool,
                skips: frozenset[int] = frozenset()) -> Trainer:
        key = (cell.cell_id, steps, rerounded, skips)
        if key not in self.built:
            device = self.trainers[0].device if self.trainers else torch.device("cpu")
            built = Trainer(cell, self.config, device, self.rank, self.world_size, schedule_len)
            built.forced_skips = set(skips)
            if rerounded:
                built.rerounding = Rerounding(built.model, ULP[cell.precision],
                                              self.config.run.seed + SEED_OFFSET + self.rank, device)
            for _ in range(steps):
                built.step()
            self.built[key] = built
        return self.built[key]

    def reference(self, trainer: Trainer, skips: set[int] = frozenset()) -> Trainer:
        """The group's eager torch DDP trainer of `trainer`'s configuration, or one stepped as often; with
        `skips`, one that also skips those fp16 steps as if they had overflowed (aligned: `compared`)."""
        wanted = baseline_cell(trainer.cell)
        for other in self.trainers:
            if other.cell.cell_id == wanted.cell_id and other.cursor == trainer.cursor and not skips:
                return other
        return self._replay(wanted, trainer.cursor, len(trainer.schedule), rerounded=False,
                            skips=frozenset(skips))

    def compared(self, trainer: Trainer) -> tuple[Trainer, Trainer | None, tuple[set[int], set[int]]]:
        """Collective. The reference `trainer` is judged against, its twin, and both one's fp16 skipped steps
        (skipped_at). An fp16 cell that skipped steps the reference did not (an overflow of FSDP2's fp16
        parameters where autocast's fp32 ops have none: legitimate) is judged against a reference and a
        twin that skip those steps too, so that the skips cancel and every distance still says something
        (a one-step difference in 25 is already ~20 % of the update: against it, a dropped tensor would
        hide)."""
        reference = self.reference(trainer)
        skipped = skipped_at(trainer), skipped_at(reference)
        extra = skipped[0] - skipped[1]
        if extra:
            reference = self.reference(trainer, extra)
            skipped = skipped[0], skipped_at(reference)
        return reference, self.twin(trainer, extra), skipped

    def twin(self, trainer: Trainer, skips: set[int] = frozenset()) -> Trainer | None:
        """The rerounded reference of `trainer`'s configuration, stepped as often, skipping the fp16 steps in
        `skips` as if they had overflowed (gate: the cell's skips the reference did not make); None for a
        lossy hook, whose gate is its loss distance alone."""
        if trainer.cell.comm_hook in LOSSY_COMM_HOOKS:
            return None
        return self._replay(baseline_cell(trainer.cell), trainer.cursor, len(trainer.schedule),
                            rerounded=True, skips=frozenset(skips))

    def release(self) -> None:
        self.built.clear()
