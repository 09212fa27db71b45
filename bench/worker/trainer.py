"""One cell's training state on one rank, and one optimizer step.

`Trainer.step` is the only training step the suite runs: grad_accum micro-steps (all but the last under
no_sync()), then the optimizer. It has no mode flags: what differs between passes is wrapped around it —
an `Instrument` that brackets each phase (nothing in the timed windows, record_function labels in the
profiled pass, device syncs and clocks in the phase pass), or the engine's `no_sync` around the whole step for
the compute-only window.
"""

from __future__ import annotations

import gc
import math
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from torch.profiler import record_function
from torch.utils.data import DistributedSampler

from bench import engines
from bench.config import BenchConfig
from bench.matrix import Cell
from bench.workloads import get_workload
from bench.workloads.base import SyntheticDataset

ADAMW_LR = 1e-4  # the optimizer's work per step does not depend on lr; small keeps the loss finite
INIT_SCALE = 2.0**16  # GradScaler's defaults: initial scale, and steps without an overflow before it doubles
GROWTH_INTERVAL = 2000
PHASES = ("data_movement", "forward", "backward", "sync_grads", "opt_step")  # the step's phase labels


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on CPU). Note: a CPU-GPU sync point."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Free what dropped trainers held (models, buckets, optimizer state) before anything else runs."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Precision:
    """autocast, GradScaler and the TF32 flags for one precision.

    On CUDA, fp32 means fp32: TF32 is off ("ieee") unless the precision is tf32 (cuDNN convolutions
    default to TF32). The flags are set through torch's `fp32_precision` API on every leaf that uses
    them (cuBLAS matmul, cuDNN conv and rnn). The legacy `allow_tf32` flags are deprecated from torch 2.9
    and must not be mixed with it: once it is set, torch 2.13 raises on a read of them.

    The flags are process-wide, and a group steps several trainers in one process (side by side, a race,
    the parity gate's reference): so `apply()` sets this trainer's flags at the start of each of its steps
    (a few attribute writes), and the last trainer built never decides for the others. `flags` is what the
    cell ran with, read back from torch after `apply()` (empty on CPU, where nothing is set: these flags
    drive cuBLAS and cuDNN only).
    """

    def __init__(self, precision: str, device: torch.device, n_steps: int):
        self.mode = ("tf32" if precision == "tf32" else "ieee") if device.type == "cuda" else None
        self.flags: dict[str, str | None] = {"matmul_fp32_precision": None, "cudnn_fp32_precision": None}
        self.apply()
        if self.mode is not None:
            self.flags = {"matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,
                          "cudnn_fp32_precision": torch.backends.cudnn.conv.fp32_precision}
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.autocast = lambda: torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
        # No growth within the trainer's steps: the scale then only halves, once per skipped step
        # (backoff_factor 0.5), so the skipped steps are log2(initial / current scale), read outside the
        # timed windows instead of counting found_inf on the host every step (a sync).
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16", init_scale=INIT_SCALE,
                                           growth_interval=max(GROWTH_INTERVAL, n_steps + 1))

    def apply(self) -> None:
        """Set this precision's process-wide TF32 flags (every step does, before its first kernel); nothing
        on CPU."""
        if self.mode is None:
            return
        torch.backends.cuda.matmul.fp32_precision = self.mode
        torch.backends.cudnn.conv.fp32_precision = self.mode
        torch.backends.cudnn.rnn.fp32_precision = self.mode

    def loss_scale(self) -> float | None:
        """The GradScaler's current scale (fp16 only, else None). Note: a device→host sync."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None

    def skipped_steps(self) -> int | None:
        """Optimizer steps skipped so far for inf/NaN gradients (fp16 only, else None). A sync."""
        scale = self.loss_scale()
        return None if scale is None else round(math.log2(INIT_SCALE / scale))


class Instrument:
    """Brackets the step's phases; this base does nothing (the timed windows: no annotations, no syncs)."""

    _NOTHING = nullcontext()

    def phase(self, name: str):
        return self._NOTHING

    def wait_for_gradients(self) -> None:
        """Called once per step between backward and the optimizer; the timed steps never wait here."""


QUIET = Instrument()


class Labels(Instrument):
    """The profiled pass: a record_function label per phase; the step waits for its all-reduces inside
    `sync_grads`, so the trace shows how long the step waits for its gradients."""

    def __init__(self, device: torch.device):
        self.device = device

    def phase(self, name: str):
        return record_function(name)

    def wait_for_gradients(self) -> None:
        sync_device(self.device)


class PhaseClock(Instrument):
    """The phase pass: device syncs around every phase and host clocks, summed per phase over the step's
    micro-steps into `ms` (so forward and backward are totals over grad_accum micro-steps)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.ms: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        sync_device(self.device)
        t0 = time.perf_counter()
        yield
        sync_device(self.device)
        self.ms[name] += (time.perf_counter() - t0) * 1e3


class Trainer:
    """The wrapped model, its optimizer and precision, the data, and the schedule of sample indices that
    each optimizer step consumes (drawn from a DistributedSampler, as a training job's would be, and staged
    on the device by the dataset before any step runs: `schedule[step][micro]` is what `dataset.batch`
    takes)."""

    def __init__(self, cell: Cell, config: BenchConfig, device: torch.device, rank: int, world_size: int,
                 n_steps: int):
        self.cell, self.device, self.seed = cell, device, config.run.seed
        seed = config.run.seed
        seed_generators(seed, device)
        self.workload = get_workload(cell.model, cell.model_size, config.workload.options())
        module = build_on(self.workload, device)
        self.n_params = sum(p.numel() for p in module.parameters() if p.requires_grad)
        self.engine = engines.get(cell.engine)
        self.param_bytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
        # an engine taking `compile` compiles in wrap_cell; compilation happens in the first steps (cell.py's
        # warm-up times it as compile_s)
        self.model = self.engine.wrap_cell(module, cell, self.workload, device)
        self.optimizer = make_optimizer(self.model.parameters(), device)
        self.precision = Precision(cell.precision, device, n_steps)
        per_step = cell.per_rank_batch * cell.grad_accum  # = micro_batch × micro_steps
        # The dataset the workload stands for (MRPC: 3,668 pairs, so padded lengths vary as they would),
        # else enough distinct samples for a few steps; later steps cycle through new sampler epochs.
        n_samples = max(self.workload.default_num_samples() or per_step * world_size * min(n_steps, 4),
                        per_step * world_size)
        self.dataset = self.workload.make_dataset(n_samples, device, seed)
        sampler = DistributedSampler(self.dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=seed, drop_last=True)
        # Staged on the device once, here: a step then reads only device memory. A CPU index tensor copied
        # to the GPU inside a step is a blocking copy, i.e. a CPU-GPU sync point in every micro-step. A
        # dataset that does not derive from SyntheticDataset gets the base class's staging (to the device).
        stage = getattr(self.dataset, "stage", partial(SyntheticDataset.stage, self.dataset))
        self.schedule = [[stage(idx, device) for idx in micro] for micro in index_schedule(
            sampler, n_steps, cell.micro_steps, cell.micro_batch)]
        self.cursor = 0
        # debug.fault "slow:<ms>@…": the last rank straggles by that much in every step of this cell
        self.straggle_s = config.debug.slow_ms_for(cell.cell_id, rank, world_size) / 1e3
        # debug.fault "crash@…", "oom@…", "hang@…": the last rank fails (or hangs) inside the cell's first
        # step after the warm-up, its peers then waiting in that step's collectives (bench/worker/guard.py)
        fault = config.debug.fault_for(cell.cell_id)
        self.fault = fault if fault in STEP_FAULTS and rank == world_size - 1 else None
        self.fault_step, self.rank = config.run.warmup_steps, rank
        self.last_loss: torch.Tensor | None = None  # the last step's loss, on the device (no sync to keep it)
        self.losses: list[torch.Tensor] = []  # every step's last_loss, on the device (the lossy-hook gate)

    def next_micro_batches(self) -> list:
        """The staged indices of the next step's micro-steps (the schedule advances by one step)."""
        micro = self.schedule[self.cursor]
        self.cursor += 1
        return micro

    def accumulate(self, micro: list, instrument: Instrument = QUIET,
                   scale=lambda loss: loss) -> torch.Tensor:
        """Forward and backward of one step's micro-batches (`micro`: staged indices), all but the last under
        the engine's no_sync, each loss divided by their count and passed through `scale` (GradScaler's
        in a step; the parity gate's own loss scale); returns the last micro-step's loss. After it the
        gradients are synced as the engine syncs them: what the optimizer would take (step, and the parity
        gate's synced_gradients)."""
        model, k = self.model, len(micro)
        for i, idx in enumerate(micro):
            with self.engine.no_sync(model) if i < k - 1 else nullcontext():
                with instrument.phase("data_movement"):
                    batch = self.dataset.batch(idx)
                with instrument.phase("forward"), self.precision.autocast():
                    loss = self.workload.loss(model, batch)
                with instrument.phase("backward"):
                    scale(loss / k).backward()
        return loss

    def step(self, instrument: Instrument = QUIET) -> torch.Tensor:
        """One optimizer step; returns the last micro-step's loss (not divided by the micro-steps): the cell's
        micro_steps forwards (grad_accum × the memory rule's splits), all but the last under no_sync."""
        self.precision.apply()  # process-wide flags: this trainer's, whatever stepped before it
        skip = self.fault == "skip" and self.cursor == self.fault_step
        if self.fault and self.cursor == self.fault_step and not skip:
            inject_fault(self.fault, self.cell.cell_id, self.rank)
        if self.straggle_s:  # the injected straggler: late to this step's first gradient collective
            straggle(self.straggle_s)
        inst = instrument
        with self.engine.no_sync(self.model) if skip else nullcontext():  # debug.fault skip: no sync
            loss = self.accumulate(self.next_micro_batches(), inst, self.precision.scaler.scale)
        with inst.phase("sync_grads"):
            inst.wait_for_gradients()
        with inst.phase("opt_step"):
            self.precision.scaler.step(self.optimizer)
            self.precision.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = loss.detach()
        self.losses.append(self.last_loss)
        return self.last_loss


def seed_generators(seed: int, device: torch.device) -> None:
    """Seed the generators a model's initialisation draws from (CPU, and CUDA's on a GPU): every trainer
    does this before building its model, so a group's engines and the ranks start from identical weights
    (and the parity gate can build those weights again)."""
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)


def make_optimizer(params, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; on CUDA the fused implementation, for every precision.

    With the default (foreach) implementation `GradScaler.step` reads found_inf on the host before it
    steps (torch/amp/grad_scaler.py `_maybe_opt_step`: `if not sum(v.item() ...)`): a device→host sync in
    fp16 cells only, which would expose the optimizer's launch time there and make fp16 and bf16 cells
    incomparable. The fused optimizer takes the scale and found_inf on the device
    (`_step_supports_amp_scaling`), so no precision syncs inside a step. On CPU torch's default stays.
    """
    return torch.optim.AdamW(params, lr=ADAMW_LR, fused=True if device.type == "cuda" else None)


def build_on(workload, device: torch.device) -> torch.nn.Module:
    """The workload's model on `device`, created there (`build_on_device`): no CPU initialisation and copy
    per trainer (smollm2-360m on an H100 machine: 4.0-5.0 s built on CPU and moved, 0.02-0.06 s built on
    the GPU). Every trainer seeds the same generators before this, so the engines of a group and the ranks
    start from identical weights (on a GPU drawn from the CUDA generator: not the numbers a CPU build
    draws, the same in every trainer; two builds compared equal on the H100)."""
    if not getattr(workload, "build_on_device", True):
        return workload.build_model().to(device)
    with torch.device(device):
        module = workload.build_model()
    return module.to(device)


def index_schedule(sampler: DistributedSampler, n_steps: int, grad_accum: int,
                   batch: int) -> list[list[torch.Tensor]]:
    """Per step, grad_accum CPU index tensors of `batch` samples, walking the sampler's epochs in turn."""
    flat, epoch = [], 0
    while len(flat) < n_steps * grad_accum * batch:
        sampler.set_epoch(epoch)
        flat += list(sampler)
        epoch += 1
    n = n_steps * grad_accum * batch
    idx = torch.tensor(flat[:n], dtype=torch.int64).view(n_steps, grad_accum, batch)
    return [[idx[s, m] for m in range(grad_accum)] for s in range(n_steps)]


STEP_FAULTS = ("crash", "oom", "hang", "skip")  # debug.fault kinds injected inside a step


def inject_fault(fault: str, cell_id: str, rank: int) -> None:
    """Test-only faults (debug.fault) inside a step of the last rank: raise (crash: a RuntimeError; oom:
    torch's out-of-memory error, as a step near the device's limit raises it) or hang (the other ranks then
    wait in the step's collectives, as behind a hung collective)."""
    where = f"injected {{}} in {cell_id} on rank {rank} only (debug.fault)"
    if fault == "crash":
        raise RuntimeError(where.format("crash"))
    if fault == "oom":
        raise torch.OutOfMemoryError(where.format("out of memory"))
    while True:
        time.sleep(1)


def straggle(seconds: float) -> None:
    """Busy for `seconds` (debug.fault slow): a straggler is a rank whose work is slower, so it spins on
    its core as slow compute would, rather than sleeping (a sleeping rank frees its core to the others, and
    its wake-up waits for the scheduler)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
