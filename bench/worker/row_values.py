"""The values a cell's result row is made of, each a few columns computed from what the group's phases
measured (bench/worker/cell.py): the step-time columns (`timed_values`), the warm-up and outlier columns,
the phase pass's, exposed communication and rank skew from the compute-only rounds, work and MFU, the
all-reduce probe's, and speed against the group's torch DDP twin. Pure functions of their inputs, no
collective among them.
"""

from __future__ import annotations

import statistics

from bench import metrics, stats
from bench.matrix import Cell
from bench.worker import measure, steady
from bench.worker.groups import torch_twin
from bench.worker.trainer import Trainer


def warmup_values(warm: list[float], per_rank: list[list[float]], first: int, found: int) -> dict:
    """The row's warm-up and outlier columns: warmup_steps_detected (the test's end of warm-up, in steps
    from the cell's first; 0: none found), the steps kept out of the measurement (`warmup_times_ms`, the
    warm-up steps and the rounds left out, in cells.jsonl) and outlier_steps (Tukey's fences over the
    steps measured: counted, kept)."""
    timed = metrics.step_times_over_ranks(per_rank)
    return {"warmup_steps_detected": found, "warmup_times_ms": list(warm) + timed[:first],
            "outlier_steps": steady.tukey_outliers(timed[first:])}



def timed_values(per_rank: list[list[float]], global_batch: int) -> dict:
    """The step-time columns from per-rank per-step samples: per step the slowest rank; the 95 % interval
    of the median (bench.stats)."""
    samples = metrics.step_times_over_ranks(per_rank)
    p50 = metrics.percentile(samples, 50)
    low, high = stats.median_ci(samples)
    return {
        "n_timed_steps": len(samples),
        "step_time_ms_p50": p50,
        "step_time_ms_p90": metrics.percentile(samples, 90),
        "step_time_ms_ci95_low": low,
        "step_time_ms_ci95_high": high,
        "step_time_half_width_pct": stats.half_width_pct(p50, low, high),
        "step_time_ms_mean": statistics.fmean(samples),
        "step_time_ms_min": min(samples),
        "step_time_ms_std": statistics.stdev(samples) if len(samples) > 1 else None,
        "samples_per_s": metrics.throughput(global_batch, p50),
        "step_times_ms": samples,
    }


def skew_values(compute_only_per_rank: list[list[float]]) -> dict:
    """rank_skew_ms_p50 and slowest_rank from the compute-only rounds (ranks × rounds), where each rank's
    step is its own work: in a synchronised step every rank ends with the step's last collective, so step
    times cannot tell which rank the others waited for (measured, debug.fault=slow:20@ on rank 1 of 2:
    timed-step skew 0.2-0.8 ms, rank 0 "slowest" in 4 of 4 cells; compute-only skew about 20 ms, rank 1)."""
    skew, slowest = stats.rank_skew(compute_only_per_rank) if compute_only_per_rank else (None, None)
    return {"rank_skew_ms_p50": skew, "slowest_rank": slowest}


def phase_values(phases: list[dict]) -> dict:
    """p50 over the phase pass's steps of each phase (empty when a phase was not measured)."""
    def p50(name):
        return metrics.percentile([ph[name] for ph in phases if ph.get(name) is not None], 50)

    return {f"{name}_ms_p50": p50(name) for name in ("forward", "backward", "sync_wait", "optimizer")}


def exposed_values(step_samples: list[float], compute_only: list[float]) -> dict:
    """Compute-only p50, exposed communication (step p50 − compute-only p50) and its 95 % interval."""
    compute_p50 = metrics.percentile(compute_only, 50)
    low, high = stats.median_difference_ci(step_samples, compute_only)
    return {"compute_only_ms_p50": compute_p50,
            "exposed_comm_ms": metrics.exposed_comm_ms(metrics.percentile(step_samples, 50), compute_p50),
            "exposed_comm_ms_ci95_low": low, "exposed_comm_ms_ci95_high": high}


def work_values(trainer: Trainer, row: dict, tokens: float | None, flops: float | None) -> dict:
    """Tokens/s, model TFLOP/s and MFU at the p50 step time (empty when the workload does not say)."""
    p50 = row["step_time_ms_p50"]
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


def add_speed_vs_torch(cells: list[Cell], rows: list[dict], raced: list[tuple[Cell, dict]] = ()) -> None:
    """Per non-torch cell of the group, against the plain torch DDP cell of its configuration in the group
    (groups.torch_twin; a race group holds several, and a torch cell it raced out still has its rounds
    so far, `raced`): the median over the rounds they shared of torch step / this cell's step, its 95 %
    interval, and the verdict. Empty without such a cell."""
    pool = [*zip(cells, rows), *raced]
    for cell, row in zip(cells, rows):
        ratios = []
        twin = torch_twin(cell, [c for c, _ in pool])
        if twin is not None:
            ratios = stats.round_ratios(pool[twin][1]["step_times_ms"], row["step_times_ms"]).tolist()
        row |= stats.speed_vs_torch_columns(ratios)
