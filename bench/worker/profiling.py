"""The profiled pass: torch.profiler over a few steps of a freshly built trainer, never timed itself.

Profiled passes run after every timed step of their launch (bench/worker/main.py): without CUPTI's
teardown (torch issue 144455; kineto tears down by default only on CUDA >= 12.6 in recent builds, else
with TEARDOWN_CUPTI=1) steps that follow a profiled pass in the same process run 10-20 % slower, so no
timed step may follow one.

Phases are marked with record_function in the step (data_movement, forward, backward, sync_grads,
opt_step); traces go through tensorboard_trace_handler to traces/<cell_id>/rank<r>.<ts>.pt.trace.json.gz.
A cell run again (--resume after a kill, a relaunch) first removes the rank's earlier files there: HTA and
TensorBoard read every file of the folder and expect one per rank.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from bench.config import BenchConfig, ProfileConfig
from bench.matrix import Cell
from bench.schema import TRACE_GLOB
from bench.worker.trainer import Labels, Trainer, sync_device


def profiled_pass(step: Callable[[], object], p: ProfileConfig, trace_dir: Path, rank: int,
                  cuda: bool) -> None:
    """Run `p.steps` steps (every cycle of the schedule) under the profiler, a barrier before each.
    Each rank first deletes its own earlier traces in `trace_dir` (so it works whether or not the ranks'
    nodes share the run folder)."""
    for stale in trace_dir.glob(f"rank{rank}.{TRACE_GLOB}"):
        stale.unlink()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    handler = tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{rank}", use_gzip=True)
    with profile(activities=activities,
                 schedule=schedule(skip_first=p.skip_first, wait=p.wait, warmup=p.warmup, active=p.active,
                                   repeat=p.repeat),
                 on_trace_ready=handler, record_shapes=p.record_shapes, profile_memory=p.profile_memory,
                 with_stack=p.with_stack, with_flops=p.with_flops) as prof:
        for _ in range(p.steps):
            dist.barrier()  # ranks enter each profiled step, and so the recorded window, together
            step()
            prof.step()
    dist.barrier()  # every rank's trace is written before rank 0 emits the cell's "traced" event


def profile_cell(cell: Cell, config: BenchConfig, device, rank: int, world_size: int, run_dir: Path) -> str:
    """Collective. Build the cell's trainer alone, warm it up, run the profiled pass; returns the trace
    folder relative to the run folder. The trainer is dropped on return."""
    p, r = config.profile, config.run
    trainer = Trainer(cell, config, device, rank, world_size, r.warmup_steps + p.steps)
    for _ in range(r.warmup_steps):
        trainer.step()
    sync_device(device)
    rel = f"traces/{cell.cell_id}"
    profiled_pass(lambda: trainer.step(Labels(device)), p, run_dir / rel, rank, cuda=device.type == "cuda")
    return rel
