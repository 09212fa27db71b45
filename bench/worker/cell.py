"""The order of one cell's phases on every rank, and the measured part of its result row.

build → warm-up → timed window(s) → phase pass → parity check → compute-only window → all-reduce probe
→ profiled pass (never timed) → work per step and peak memory (never timed).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from bench import engines, metrics
from bench.config import BenchConfig
from bench.matrix import Cell
from bench.worker import measure, profiling
from bench.worker.measure import Stopwatch
from bench.worker.trainer import Labels, PhaseClock, Trainer, sync_device

DIVERGED = "parameters differ across ranks after the timed steps"


def steps_needed(config: BenchConfig) -> int:
    """Optimizer steps a cell runs on every rank over all its passes (the data schedule's length)."""
    r, p = config.run, config.profile
    return (r.warmup_steps + r.timed_steps * r.repeats + r.phase_steps + r.compute_only_steps
            + (p.steps if p.enabled else 0))


def run_cell(cell: Cell, config: BenchConfig, device: torch.device, rank: int, world_size: int,
             run_dir: Path) -> tuple[str, str | None, dict]:
    """Collective. All phases of the cell → (status "ok" | "diverged", error, measured part of the row)."""
    r = config.run
    measure.reset_peak_memory(device)
    trainer = Trainer(cell, config, device, rank, world_size, steps_needed(config))
    clock = Stopwatch()
    with clock:
        for _ in range(r.warmup_steps):
            trainer.step()
        sync_device(device)
    first_timed = trainer.cursor
    samples: list[float] = []
    with clock:
        for _ in range(r.repeats):
            samples += measure.timed_window(trainer.step, r.timed_steps, device)
    timed_steps = trainer.schedule[first_timed:trainer.cursor]
    final_loss = measure.mean_over_ranks(float(trainer.last_loss.float()), device)
    with clock:
        phases = [phase_pass(trainer) for _ in range(r.phase_steps)]
    identical = measure.params_identical(trainer.model, device)
    with clock:  # no_sync from here on: ranks' parameters drift apart, which the check above has seen
        compute_only = compute_only_window(trainer, timed_steps, r.compute_only_steps)
    probe = measure.allreduce_probe(trainer, r.probe_iters)
    trace_dir = f"traces/{cell.cell_id}" if config.profile.covers(cell.cell_id) else None
    if trace_dir:
        with clock:
            profiling.profiled_pass(lambda: trainer.step(Labels(device)), config.profile,
                                    run_dir / trace_dir, rank, cuda=device.type == "cuda")
    tokens, flops = measure.work_per_step(trainer, timed_steps)
    measured = step_time_values(samples, cell.global_batch) | phase_values(phases) | work_values(
        trainer, samples, tokens, flops) | probe_values(probe, world_size) | {
        "compute_only_ms_p50": compute_only,
        "exposed_comm_ms": metrics.exposed_comm_ms(metrics.percentile(samples, 50), compute_only),
        "final_loss": final_loss,
        "peak_mem_mb": measure.peak_memory_mb(device),
        "trace_dir": trace_dir,
        "steps_wall_s": clock.seconds,
    } | trainer.precision.flags
    return ("ok", None, measured) if identical else ("diverged", DIVERGED, measured)


def phase_pass(trainer: Trainer) -> dict[str, float | None]:
    """One step with device syncs between phases → forward/backward/optimizer ms, and the engine's own
    end-of-backward wait (ddp_core on CPU only: see engines.sync_wait_ms)."""
    clock = PhaseClock(trainer.device)
    trainer.step(clock)
    return {"forward": clock.ms["forward"], "backward": clock.ms["backward"],
            "sync_wait": engines.sync_wait_ms(trainer.model, trainer.device),
            "optimizer": clock.ms["opt_step"]}


def compute_only_window(trainer: Trainer, timed_steps: list, n: int) -> float | None:
    """Collective. p50 of n steps under no_sync() (no gradient communication), replaying the timed
    window's batches: with variable-length data (MRPC-like) other batches have other padded widths, so
    their compute would differ and exposed communication could go negative. None when n is 0."""
    if not n:
        return None
    replay = [timed_steps[i % len(timed_steps)] for i in range(n)]
    trainer.schedule[trainer.cursor:trainer.cursor + n] = replay

    def step_without_sync():
        with trainer.model.no_sync():
            trainer.step()

    return metrics.percentile(measure.timed_window(step_without_sync, n, trainer.device), 50)


def step_time_values(samples: list[float], global_batch: int) -> dict:
    """The step-time columns from per-step samples (each already the maximum over ranks)."""
    p50 = metrics.percentile(samples, 50)
    return {
        "n_timed_steps": len(samples),
        "step_time_ms_p50": p50,
        "step_time_ms_p90": metrics.percentile(samples, 90),
        "step_time_ms_mean": statistics.fmean(samples),
        "step_time_ms_min": min(samples),
        "step_time_ms_std": statistics.stdev(samples) if len(samples) > 1 else None,
        "samples_per_s": metrics.throughput(global_batch, p50),
        "step_times_ms": samples,
    }


def phase_values(phases: list[dict]) -> dict:
    """p50 over the phase pass's steps of each phase (empty when a phase was not measured)."""
    def p50(name):
        return metrics.percentile([ph[name] for ph in phases if ph.get(name) is not None], 50)

    return {f"{name}_ms_p50": p50(name) for name in ("forward", "backward", "sync_wait", "optimizer")}


def work_values(trainer: Trainer, samples: list[float], tokens: float | None, flops: float | None) -> dict:
    """Tokens/s, model TFLOP/s and MFU at the p50 step time (empty when the workload does not say)."""
    p50 = metrics.percentile(samples, 50)
    flops_per_s = metrics.throughput(flops, p50)
    peak = measure.device_peak_flops(trainer.device, trainer.cell.precision)
    return {
        "tokens_per_s": metrics.throughput(tokens, p50),
        "model_tflops_per_s": None if flops_per_s is None else flops_per_s / 1e12,
        "mfu": metrics.mfu(flops_per_s, None if peak is None else peak * trainer.cell.world_size),
        "n_params": trainer.n_params,
        "seq_len": getattr(trainer.workload, "seq_len", None),  # sequence models only
    }


def probe_values(probe: measure.Probe, world_size: int) -> dict:
    """The all-reduce probe's columns (nccl-tests algbw and busbw; algbw empty at world size 1, where
    nothing crosses a link) and its size sweep, one entry per message size (`allreduce_sweep`)."""
    algbw = metrics.algbw_gbps(probe.nbytes, probe.seconds)
    dtype = str(probe.dtype).removeprefix("torch.")
    sweep = []
    for size, seconds in probe.sweep:
        bw = metrics.algbw_gbps(size, seconds)
        sweep.append({"size_bytes": size, "dtype": dtype, "time_us": seconds * 1e6, "algbw_gbps": bw,
                      "busbw_gbps": metrics.busbw_gbps(bw, world_size)})
    return {"allreduce_bytes": probe.nbytes, "allreduce_algbw_gbps": algbw,
            "allreduce_busbw_gbps": metrics.busbw_gbps(algbw, world_size), "n_buckets": probe.n_buckets,
            "allreduce_sweep": sweep}
