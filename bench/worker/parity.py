"""The parity gate beyond "every rank holds the same parameters" (cell.py): every cell that is not plain
torch DDP hands its optimizer the gradient torch DDP would hand it, at the same weights and the same global
batch.

DDP's contract is about gradients: after the sync, every rank holds the mean over ranks of their local
gradients. So the gate is teacher-forced, GATE_STEPS steps of it: before each step every trainer — the
judged cell, eager torch DDP at the cell's precision (the group's own trainer, or one built for the gate),
and a reference (a plain module in REFERENCE_DTYPE, its gradients averaged by one all-reduce) — holds the
same weights (the reference's, which then takes its own AdamW step), sees the same batch and the same
dropout draws, and the synced gradient each would hand the optimizer (after accumulation over the
micro-steps, unscaled, after the optimizer's step pre-hooks, gathered whole for a sharded engine) is
compared with the reference's, per tensor and over all of them, summed over the gate's steps:

    error = ‖g − g_ref‖ / ‖g_ref‖            (a tensor's denominator floored: tensor_scale)

judged against a bound measured in the same run: BOUND_FACTOR × torch DDP's own error at that precision
(its error on the tensor, or over all tensors if larger), never below BOUND_FACTOR × the precision floor
(`floor_error`: fp32's MIN_ERROR, or one ULP of a lossy wire such as an fp16 comm hook).

Why gradients and not trajectories (docs/design.md "Parity gates"): an adaptive optimizer's trajectory is
chaotic and scale-invariant. AdamW moves an element by about lr whatever its gradient's size, so rounding
flips near-zero elements and deep models drift apart (honest fsdp2 bf16 was called `diverged` on a 32-block
model), while a reducer that sums instead of averaging changes nothing m̂/√v̂ shows (it passed). At the same
weights a gradient is one computation: honest engines sit within a few times torch DDP's rounding of the
reference, and a reducer that sums, drops elements or hands over last step's gradient is 30× to 300× out.
fp16's overflow is not a trajectory question any more either: each step's loss scale starts at INIT_SCALE
and halves until that step's gradients are finite, for each trainer alone.

A lossy comm hook (PowerSGD) has no pass/fail: the row carries its gradient error (`lossy`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from bench import engines
from bench.matrix import Cell, option_defaults
from bench.schema import DEFAULT_BUCKET_MB, ENGINE_OPTION_NAMES, LOSSY_COMM_HOOKS
from bench.worker.trainer import INIT_SCALE, Trainer, build_on, make_optimizer, seed_generators

GATE_STEPS = 4  # teacher-forced steps a gated cell is judged over: a handful of batches and weights
# How far from the reference an engine may be, in units of torch DDP's own distance at the precision:
# honest fsdp2 measured at most 2.1× torch DDP's error over all tensors and 3.5× on one tensor (the
# 32-block user model at bf16: 0.0142 and 0.0231 against 0.0067; benchmarks/parity_margin.py, also
# transformer.tiny and fp32/fp16), while the least broken engine tried (every 8th element dropped) is
# 0.35 out: 13× its bound at bf16.
BOUND_FACTOR = 4.0
# One tensor may be twice as far: a tensor autocast keeps in fp32 (a norm's weight, a sum over every token
# whose terms cancel) that a sharded engine computes at the precision sits up to 3.5× torch DDP's overall
# error (fsdp2 bf16 on the 32-block model: a LayerNorm weight at 0.023 against DDP's 0.0067); a tensor lost
# or stale is 1.0 to 1.5 out.
TENSOR_FACTOR = 2 * BOUND_FACTOR
# fp32's floor: below it a gradient is never called wrong. torch DDP at fp32 can sit at 0 from an fp32
# reference (the same kernels; on CPU the fp64 reference gives ~1e-7), while compiled kernels reorder their
# sums; the least broken engine tried is 0.35 out, a 1 % drop of the elements 0.1.
MIN_ERROR = 2.5e-5
# One unit in the last place of each wire format, relative (2^-(mantissa bits)): a gradient sent in it is
# rounded once per element, ~0.3 ULP over a tensor; the bound keeps room for that when the judged cell's
# comm hook rounds where torch DDP did not.
ULP = {"fp32": 2.0**-23, "tf32": 2.0**-10, "bf16": 2.0**-7, "fp16": 2.0**-10}
# A tensor whose reference gradient is ~0 by symmetry (an attention key's bias: softmax ignores a shift
# common to every key) has a relative error of rounding noise over nothing. Its denominator is floored at
# this share of what the tensor would hold were the whole gradient spread evenly over the elements.
TENSOR_FLOOR_SHARE = 0.05
MAX_HALVINGS = 24  # fp16: the gate's loss scale halves at most this often (2^16 → 2^-8) before giving up
SEED_OFFSET = 7919  # the gate's dropout draws: run.seed + SEED_OFFSET + step, every trainer alike


def needs_gate(cell: Cell) -> bool:
    """Whether the cell is gated against torch DDP: every cell but plain torch DDP itself."""
    return not cell.is_baseline


def baseline_cell(cell: Cell) -> Cell:
    """The eager, uncompressed torch DDP cell of `cell`'s configuration (torch's default bucket for an
    engine without buckets), every reference option at its default."""
    ref = engines.reference()
    defaults = option_defaults(ref.name)
    options = {k: defaults.get(k) for k in ENGINE_OPTION_NAMES}
    bucket = cell.bucket_cap_mb if cell.bucket_cap_mb is not None else DEFAULT_BUCKET_MB
    return dataclasses.replace(cell, engine=ref.name, bucket_cap_mb=bucket, **options)


def gate_key(cell: Cell) -> tuple:
    """What the gate's references depend on: the cell's configuration but its engine, options and bucket
    size (a bucket groups the all-reduces, it does not change the mean they compute), so one reference
    serves every cell of a group at one precision."""
    return dataclasses.replace(baseline_cell(cell), bucket_cap_mb=DEFAULT_BUCKET_MB).configuration()


def reference_dtype(device: torch.device) -> torch.dtype:
    """fp64 on CPU (torch DDP at fp32 then has a distance of its own to measure); fp32 on a GPU, TF32 off
    (cuBLAS's fp64 is slow on most parts and flash attention has none)."""
    return torch.float64 if device.type == "cpu" else torch.float32


def floor_error(cell: Cell) -> float:
    """The least error the bound allows for, before BOUND_FACTOR: fp32's MIN_ERROR, or one ULP of the
    coarsest wire the cell's gradients cross that torch DDP's do not (an fp16/bf16 comm hook)."""
    hook = cell.comm_hook if cell.comm_hook in ULP else None
    return max(MIN_ERROR, ULP[hook] if hook else 0.0)


# ---- the errors, summed over the gate's steps --------------------------------------------------------------


@dataclasses.dataclass
class Errors:
    """‖g − g_ref‖² and ‖g_ref‖² per tensor, summed over the gate's steps (`add`), and their errors."""

    sizes: list[int]
    diff2: list[float] = dataclasses.field(default_factory=list)
    ref2: list[float] = dataclasses.field(default_factory=list)

    def add(self, grads: list[torch.Tensor], reference: list[torch.Tensor]) -> None:
        d = [float((g.double() - r.double()).pow(2).sum()) for g, r in zip(grads, reference, strict=True)]
        n = [float(r.double().pow(2).sum()) for r in reference]
        self.diff2 = [a + b for a, b in zip(self.diff2, d, strict=True)] if self.diff2 else d
        self.ref2 = [a + b for a, b in zip(self.ref2, n, strict=True)] if self.ref2 else n

    def total(self) -> float:
        """‖g − g_ref‖ / ‖g_ref‖ over every tensor and step (0 when the reference gradient is 0 and so is g's
        difference; inf when only the reference's is)."""
        return relative(sum(self.diff2), sum(self.ref2))

    def tensors(self) -> list[float]:
        """Per tensor, ‖g − g_ref‖ / tensor_scale."""
        total, elements = sum(self.ref2), sum(self.sizes)
        return [relative(d, tensor_scale(r, n, total, elements) ** 2)
                for d, r, n in zip(self.diff2, self.ref2, self.sizes, strict=True)]


def relative(diff2: float, ref2: float) -> float:
    """√(diff2 / ref2), with 0/0 = 0 and x/0 = inf."""
    if ref2 > 0:
        return math.sqrt(diff2 / ref2)
    return 0.0 if diff2 == 0 else math.inf


def tensor_scale(ref2: float, n: int, total2: float, elements: int) -> float:
    """A tensor's denominator: its reference gradient's norm, floored at TENSOR_FLOOR_SHARE of its even
    share of the whole gradient's norm, ‖g_ref‖·√(n / N) (n of its elements of N in all)."""
    return max(math.sqrt(ref2), TENSOR_FLOOR_SHARE * math.sqrt(total2 * n / elements))


def bounds(ddp: Errors, floor: float, precision: str) -> tuple[float, list[float]]:
    """The bounds from torch DDP's own errors at the precision: over all tensors BOUND_FACTOR × max(its
    total, floor); per tensor TENSOR_FACTOR × max(its error on the tensor, its total, floor, one ULP of the
    precision) — a tensor autocast keeps in fp32 that a sharded engine computes at the precision is
    allowed the precision's rounding."""
    total = max(ddp.total(), floor)
    tensor = max(total, ULP[precision])
    return BOUND_FACTOR * total, [TENSOR_FACTOR * max(e, tensor) for e in ddp.tensors()]


# ---- one teacher-forced step -------------------------------------------------------------------------------


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Tensors a model makes without a dtype (a mask, a position table) made in `dtype` meanwhile."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def any_rank(flag: bool, device: torch.device) -> bool:
    """Collective: whether `flag` holds on any rank."""
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def not_finite(model: torch.nn.Module) -> bool:
    """Whether any of this rank's gradients (its shards) holds an inf or a NaN. A sync."""
    return any(not bool(torch.isfinite(local(p.grad)).all())
               for p in model.parameters() if p.grad is not None)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def run_step_pre_hooks(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's step pre-hooks (global, then its own), as `optimizer.step` would run them first: a
    gradient transform registered there is part of what the optimizer is handed."""
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    for hook in [*_global_optimizer_pre_hooks.values(), *optimizer._optimizer_step_pre_hooks.values()]:
        hook(optimizer, (), {})


def synced_gradients(trainer: Trainer, weights: list[torch.Tensor], micro: list,
                     seed: int) -> tuple[list[torch.Tensor], int]:
    """Collective. The gradients `trainer` hands its optimizer at `weights` for the step of `micro` (its
    staged micro-batches), whole and unscaled, and how often fp16's loss scale had to halve: the weights
    loaded, the micro-steps run as Trainer.step runs them (`accumulate`), the gradients unscaled in place
    (as GradScaler.unscale_ does before optimizer.step), the optimizer's pre-hooks run, then gathered. The
    trainer's optimizer, scaler and data cursor are untouched; its gradients are cleared after."""
    trainer.precision.apply()
    trainer.engine.load_full_parameters(trainer.model, weights)
    scale = INIT_SCALE if trainer.precision.scaler.is_enabled() else 1.0
    for halvings in range(MAX_HALVINGS + 1):  # noqa: B007 - how often it halved is returned
        trainer.optimizer.zero_grad(set_to_none=True)
        seed_generators(seed, trainer.device)
        trainer.accumulate(micro, scale=lambda loss, s=scale: loss * s)
        if scale == 1.0 or not any_rank(not_finite(trainer.model), trainer.device):
            break
        scale /= 2  # GradScaler's backoff, within the step: the same weights and batch again
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.grad is not None and scale != 1.0:
                local(p.grad).div_(scale)
    run_step_pre_hooks(trainer.optimizer)
    grads = [g.float() for g in trainer.engine.full_gradients(trainer.model)]
    trainer.optimizer.zero_grad(set_to_none=True)
    return grads, halvings


def step_batches(trainer: Trainer, k: int) -> list:
    """The staged micro-batches of the trainer's k-th step: every trainer of a configuration draws the same
    samples there (one sampler, one seed; a run's schedule is steps_needed long, the gate's own DDP trainer's
    GATE_STEPS)."""
    return trainer.schedule[k]


class Reference:
    """The gate's reference for one configuration: a plain module in REFERENCE_DTYPE built from the cell's
    initial weights, stepped by its own AdamW through GATE_STEPS steps of the torch DDP trainer's batches
    (the same samples every trainer of the configuration takes first), its weights rounded to fp32 after
    each step so that every trainer can hold them exactly; per step the weights and the mean over ranks of
    its gradient. Collective."""

    def __init__(self, ddp: Trainer, seed: int):
        device, self.dtype = ddp.device, reference_dtype(ddp.device)
        seed_generators(ddp.seed, device)
        module = build_on(ddp.workload, device).to(self.dtype)
        self.names = [n for n, _ in module.named_parameters()]
        optimizer = make_optimizer(module.parameters(), device)
        self.weights: list[list[torch.Tensor]] = []
        self.grads: list[list[torch.Tensor]] = []
        for k in range(GATE_STEPS):
            self.weights.append([p.detach().float().clone() for p in module.parameters()])
            self.grads.append(self._gradients(module, ddp, step_batches(ddp, k), seed + k))
            for p, g in zip(module.parameters(), self.grads[-1], strict=True):
                p.grad = g.clone()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for p in module.parameters():
                    p.copy_(p.float())  # fp32-representable: what every trainer can load exactly
        self.sizes = [w.numel() for w in self.weights[0]]

    def _gradients(self, module: torch.nn.Module, ddp: Trainer, micro: list, seed: int) -> list[torch.Tensor]:
        """The mean over ranks of the module's gradient for one step's micro-batches (loss / micro-steps
        each): DDP's contract, computed plainly."""
        module.zero_grad(set_to_none=True)
        seed_generators(seed, ddp.device)
        with default_dtype(self.dtype):
            for idx in micro:
                batch = {k: v.to(self.dtype) if torch.is_tensor(v) and v.is_floating_point() else v
                         for k, v in ddp.dataset.batch(idx).items()}
                (ddp.workload.loss(module, batch) / len(micro)).backward()
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in module.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if dist.is_initialized():
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
        return [t.view_as(g) for t, g in zip(flat.split([g.numel() for g in grads]), grads, strict=True)]

    def errors(self, trainer: Trainer, seed: int) -> tuple[Errors, int]:
        """Collective. `trainer`'s errors over the gate's steps, and fp16's halvings of its loss scale."""
        errors, halvings = Errors(self.sizes), 0
        for k in range(GATE_STEPS):
            grads, h = synced_gradients(trainer, self.weights[k], step_batches(trainer, k), seed + k)
            errors.add(grads, self.grads[k])
            halvings += h
        return errors, halvings


class References:
    """Per configuration a group gates (gate_key), built on
    first use and kept until `release`: the eager torch DDP trainer at the cell's precision (the group's own,
    or one built for the gate), the Reference, and torch DDP's errors (the bound's measure). Collective."""

    def __init__(self, trainers: list[Trainer], config, rank: int, world_size: int):
        self.trainers, self.config, self.rank, self.world_size = trainers, config, rank, world_size
        self.seed = config.run.seed + SEED_OFFSET
        self.built: dict[tuple, tuple[Reference, Errors]] = {}

    def of(self, trainer: Trainer) -> tuple[Reference, Errors]:
        key = gate_key(trainer.cell)
        if key not in self.built:  # the same micro-steps: baseline_cell keeps micro_splits
            ddp = next((t for t in self.trainers if t.cell.is_baseline and gate_key(t.cell) == key), None)
            if ddp is None:
                ddp = Trainer(baseline_cell(trainer.cell), self.config, trainer.device, self.rank,
                              self.world_size, GATE_STEPS)
            reference = Reference(ddp, self.seed)
            self.built[key] = reference, reference.errors(ddp, self.seed)[0]
        return self.built[key]

    def release(self) -> None:
        self.built.clear()


def gate(trainer: Trainer, references: References) -> dict:
    """Collective. The row's gate columns for `trainer` (bench.schema: parity_*): its gradient error over
    all tensors and on the tensor nearest its bound, each bound, torch DDP's own error, the gate's steps and
    seconds; `parity_gate` passed | diverged (`parity_failure` saying which tensor, how far, against what)
    or, for a lossy comm hook, `lossy` and the error alone. Rank 0's figures decide on every rank."""
    t0 = time.perf_counter()
    reference, ddp = references.of(trainer)
    mine, halvings = reference.errors(trainer, references.seed)
    cell = trainer.cell
    total_bound, tensor_bounds = bounds(ddp, floor_error(cell), cell.precision)
    errors = mine.tensors()
    worst = max(range(len(errors)), key=lambda i: errors[i] / tensor_bounds[i]) if errors else None
    row = {"parity_grad_error": mine.total(), "parity_grad_bound": total_bound,
           "parity_ddp_error": ddp.total(), "parity_gate_steps": GATE_STEPS,
           "parity_tensor": None if worst is None else reference.names[worst],
           "parity_tensor_error": None if worst is None else errors[worst],
           "parity_tensor_bound": None if worst is None else tensor_bounds[worst]}
    if cell.comm_hook in LOSSY_COMM_HOOKS:
        row |= {"lossy": True}
    else:
        row |= verdict(row, cell, reference.sizes[worst] if worst is not None else 0, halvings,
                       str(reference.dtype).removeprefix("torch."))
    row["parity_gate_s"] = time.perf_counter() - t0
    if dist.is_initialized():  # every rank holds the same gradients; rank 0's rounding of them decides
        shared = [row]
        dist.broadcast_object_list(shared, src=0)
        row = shared[0] | {"parity_gate_s": row["parity_gate_s"]}
    return row


def verdict(row: dict, cell: Cell, size: int, halvings: int, ref: str) -> dict:
    """passed, or diverged with the reason in a user's words: which tensor, how far, against what."""
    where = f"torch DDP at {cell.precision}"
    over = []
    if not row["parity_grad_error"] <= row["parity_grad_bound"]:
        over.append(f"over all tensors {row['parity_grad_error']:.3g} against a bound of "
                    f"{row['parity_grad_bound']:.3g}")
    if row["parity_tensor"] is not None and not row["parity_tensor_error"] <= row["parity_tensor_bound"]:
        over.append(f"on {row['parity_tensor']} ({size} elements) {row['parity_tensor_error']:.3g} against "
                    f"{row['parity_tensor_bound']:.3g}")
    note = f" (fp16: the loss scale halved {halvings} times over the gate's steps)" if halvings else ""
    if not over:
        return {"parity_gate": "passed" + note}
    return {"parity_gate": "diverged", "parity_failure": (
        f"hands the optimizer other gradients than torch DDP at the same weights and batch: relative error "
        f"from an {ref} reference " + "; ".join(over) + f" ({BOUND_FACTOR:g}× how far {where} is from it, "
        f"{row['parity_ddp_error']:.3g}, over {GATE_STEPS} steps; bench/worker/parity.py){note}. Check its "
        f"gradient averaging (a sum is world-size× too large), which elements or tensors its sync covers, "
        f"and that it reduces this step's gradients")}
