"""The --dry-run estimate of a sweep's wall time: per-device rates (each constant's measurement where it is
set), a step's cost from them, the adaptive rounds a group is expected to run (by the worker's own stopping
rule, bench.stats), and the sum over launches, cells and profiled passes. Never used for a result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench import stats
from bench.config import BenchConfig
from bench.matrix import MEMORY_STEPS, Cell, by_launch


@dataclass(frozen=True)
class Rates:
    """What the --dry-run estimate assumes of one device kind (never used for a result). Each constant's
    measurement is given where it is set (`RATES`)."""

    flops: dict[str, float]     # sustained training FLOP/s per rank, by precision
    host_s_per_tensor: float    # a micro-step's floor per parameter tensor: host-side work (kernel launches)
    floor_s_per_param: float    # a micro-step's floor per parameter: weight and gradient traffic
    opt_s_per_param: float      # the optimizer step, per parameter, once per step
    comm_bytes_per_s: float     # all-reduce bus bandwidth, for world size > 1
    build_s_per_param: float    # building one trainer's model (run.device placement), per parameter
    cell_s: float               # per cell: wrapper, optimizer, data staging, checks, release
    profile_s: float            # per profiled cell: the trace export
    launch_s: float             # per launch (world size): start-up and tear-down
    run_s: float                # once per run: the launcher's own start, env capture, the --report step
    # the widest 95 % half-width (%) of a group's intervals (stats.group_half_width_pct) × √rounds: what
    # the adaptive rounds are expected to need, (this / target_ci_pct)² rounds
    half_width_sqrt_n_pct: float
    compile_s: float = 0.0      # per compiled cell (matrix.compile): torch.compile in its warm-up


# A micro-step costs max(compute, floor): compute = FLOPs / flops[precision]; floor = host_s_per_tensor ×
# tensors + floor_s_per_param × parameters (on a GPU the host enqueues kernels while the device runs
# them, so the slower of the two sets the pace; on a CPU, at these batch sizes, memory traffic does).
# The CPU's widest group half-width (%) × √rounds, `make bench`'s CPU run under heavy load (load average
# 5-6 on the 2 cores, other benchmarks running; 2026-11-25, results/default-vm-20261125-162514.244): the
# median over its 32 groups was 94 (88 at one rank, 94 at two; 17 to 214). A quiet machine needs fewer.
HALF_WIDTH_CPU = 94.0
RATES = {
    # The 2-core development machine (shared), `make bench`'s CPU run (mlp.small, 3,684,362 parameters in
    # 10 tensors; one thread per rank; 2026-11-25): tests/data/estimate/cpu-default.
    "cpu": Rates(
        # one thread, mlp.small at batch 256, forward + backward timed alone: 88 GFLOP/s fp32, 136 bf16
        # (fp16 not measured on CPU: fp32's)
        flops={"fp32": 8.8e10, "bf16": 1.36e11, "fp16": 8.8e10},
        host_s_per_tensor=0.0,
        # world size 1, fp32: median step 17.1 ms at accumulation 1 and 24.2 ms at 2, alike at per-rank
        # batch 4 and 16: 7.1 ms per micro-step (1.93e-9 s per parameter), 10.0 ms the rest (2.7e-9)
        floor_s_per_param=1.93e-9,
        opt_s_per_param=2.7e-9,
        # world size 2 (two ranks on the two cores, gloo): median step 45.1 ms at accumulation 1 against
        # 17.1 at world size 1: 28 ms for the 14.7 MB of gradients (ring factor 1)
        comm_bytes_per_s=5.3e8,
        build_s_per_param=0.0,   # in cell_s: the 3.7M-parameter build is part of the fitted overhead
        # per cell: its cell_wall_s less the steps above, mean over the 112 cells (a total is wanted)
        cell_s=0.38,
        profile_s=0.03,          # per profiled pass (mean of 32: 0.18 s) less its steps above
        # 153.6 s in all, 15.5 s of it outside the two launches' events: 5.0 s before the first, 4.2 s
        # between them, 6.2 s after the last (the --report step)
        launch_s=4.5,
        run_s=6.5,
        half_width_sqrt_n_pct=HALF_WIDTH_CPU,
        # inductor, mlp.small, world size 2 under load (2026-11-25, default's peers slice): torch DDP's
        # model 17.8 s, fsdp2's blocks 5.3 s; a later identical model in the launch reuses the graphs
        # (0 s), so charging every compiled cell the larger figure is an upper bound
        compile_s=17.8),
    # One H100 80GB HBM3 (VM), torch 2.11+cu130, smollm2-135m (134.5M parameters in 273 tensors), seq 128,
    # world size 1, 2026-11-25: tests/data/estimate/h100-{default-partial,diag,hostbound.log} and a build
    # timing of both models. Not measured at world size > 1: comm_bytes_per_s is an assumption.
    "cuda": Rates(
        # fp32 (TF32 off): step p50 183 ms at batch 64, kernel-bound (hostbound.log: 178 ms of kernels);
        # bf16, fp16: 54.0 and 54.5 ms of busy kernel time per step at batch 64 (diag's trace summary).
        # smollm2-360m in a plain loop ran fp32 batch 64 at 37.6 TFLOP/s: its fp32 cells come out high.
        flops={"fp32": 2.96e13, "bf16": 1.0e14, "fp16": 1.0e14},
        # host-bound: median step p50 135.0 ms of the 14 bf16/fp16 cells without accumulation (batch 12 and
        # 64 alike; hostbound.log: 122 ms host enqueue for 26 ms of kernels, ~4,200 kernels at 18.4 us of
        # host each) / 273 tensors. The 360M model's plain-loop floor was 1.28x the 135M's (tensors: 1.07x)
        host_s_per_tensor=4.94e-4,
        floor_s_per_param=0.0,
        opt_s_per_param=0.0,     # accumulation 2 doubled the step (245 vs 122-135 ms): no separate cost seen
        comm_bytes_per_s=1.0e11,  # ASSUMED (no multi-GPU measurement): NCCL bus bandwidth within a node
        # a build under torch.device("cuda"): 0.02-0.06 s for either model (CPU build and copy: 1.3-1.4 s for
        # 135M, 4.0-5.0 s for 360M: 1.0e-8 to 1.2e-8 s per parameter)
        build_s_per_param=1.55e-10,
        # per cell: its cell_wall_s less the steps above and two CPU builds (these runs built on CPU), mean
        # over the 44 cells of both runs (-0.23 s over the partial run's 32, whose steps come out high;
        # 1.53 s over diag's 12)
        cell_s=0.25,
        profile_s=3.2,   # diag: per profiled pass (mean of 12: 5.8 s), less a CPU build and 9 steps above
        # diag (one launch): 5.1 s from the worker's start to its first cell, 9.3 s outside the launch's
        # events; all of it counted per launch (the split is not known)
        launch_s=14.4,
        run_s=0.0,
        # NOT MEASURED on a GPU: 0 assumes the minimum rounds (run.timed_steps × repeats) reach the target
        half_width_sqrt_n_pct=0.0,
        compile_s=60.0),  # ASSUMED (not measured on a GPU): inductor on a 135M-360M model
}


def model_size_counts(config: BenchConfig) -> tuple[int, int]:
    """(parameters, parameter tensors) of the workload's model, built on the meta device (nothing is
    allocated), else on CPU for a model that cannot be (a checkpoint, a user model that reads values)."""
    import torch

    from bench.workloads import get_workload

    workload = get_workload(config.workload.model, config.workload.model_size, config.workload.options())
    try:
        with torch.device("meta"):
            model = workload.build_model()
    except Exception:  # noqa: BLE001 - any failure on meta: count on a real build
        model = workload.build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in params), len(params)


def estimate_step_seconds(rates: Rates, cell: Cell, flops_per_sample: float, n_params: int,
                          n_tensors: int, sync: bool = True) -> float:
    """One optimizer step of `cell` by `rates`: grad_accum × max(compute, floor) + optimizer + the
    gradients' ring all-reduce (2(n−1)/n × 4 bytes per parameter; none at world size 1 or without sync)."""
    compute = flops_per_sample * cell.per_rank_batch / rates.flops[cell.precision]
    floor = rates.host_s_per_tensor * n_tensors + rates.floor_s_per_param * n_params
    step = cell.grad_accum * max(compute, floor) + rates.opt_s_per_param * n_params
    if sync and cell.world_size > 1:
        step += 2 * (cell.world_size - 1) / cell.world_size * 4 * n_params / rates.comm_bytes_per_s
    return step


def expected_timed_steps(config: BenchConfig, rates: Rates, round_s: float) -> int:
    """The timed rounds a group is expected to run, by the worker's rule (stats.stop_reason) with the
    widest half-width taken as rates.half_width_sqrt_n_pct / √rounds: the minimum with adaptivity off;
    else the first checkpoint where that is within run.target_ci_pct, or run.max_timed_steps, or, once the
    next checkpoint would take the group past run.max_group_s at `round_s` per round, the rounds that fit
    in it."""
    r = config.run
    if not r.adaptive:
        return r.min_timed_steps
    points = stats.checkpoints(r.min_timed_steps, r.max_timed_steps)
    for n, upcoming in zip(points, [*points[1:], points[-1]]):
        worst = rates.half_width_sqrt_n_pct / math.sqrt(n)
        why = stats.stop_reason(worst, r.target_ci_pct, n, r.max_timed_steps, n * round_s, upcoming,
                                r.max_group_s)
        if why == "budget":
            return n + stats.budget_fill(n, n * round_s, r.max_group_s, r.max_timed_steps)
        if why:
            return n
    return points[-1]


def group_size(config: BenchConfig) -> int:
    """Engines stepped side by side in a round (all of the matrix's, when run.interleave is on; a group
    that does not fit in memory runs alone, which this does not foresee)."""
    return len(config.matrix.engine) if config.run.interleave else 1


def estimate_cell_seconds(config: BenchConfig, rates: Rates, cell: Cell, flops_per_sample: float,
                          n_params: int, n_tensors: int) -> float:
    """A cell's wall time (its `cell_wall_s`, its profiled pass not included): two builds (the timed
    trainer, the peak-memory pass), its steps (warm-up, the expected timed rounds, phase, memory pass;
    compute-only without the all-reduce), and the fixed per-cell overhead; then per repeat launch
    (run.launches − 1) a build, the overhead, warm-up and timed rounds."""
    r = config.run
    step = estimate_step_seconds(rates, cell, flops_per_sample, n_params, n_tensors)
    timed = expected_timed_steps(config, rates, group_size(config) * step)
    synced = r.warmup_steps + timed + r.phase_steps + MEMORY_STEPS
    unsynced = estimate_step_seconds(rates, cell, flops_per_sample, n_params, n_tensors, sync=False)
    compiled = cell.compile not in (None, "none")
    # each repeat launch (run.launches) builds the trainer again, warms it up and times its rounds
    repeat = (rates.build_s_per_param * n_params + rates.cell_s + (r.warmup_steps + timed) * step
              + (rates.compile_s if compiled else 0.0))
    return (2 * rates.build_s_per_param * n_params + rates.cell_s + synced * step
            + r.compute_only_steps * unsynced + (rates.compile_s if compiled else 0.0)
            + (r.launches - 1) * repeat)


def expected_rounds(config: BenchConfig, cells: list[Cell], rates: Rates | None = None) -> list[int]:
    """Per runnable cell, the timed rounds its group is expected to run (expected_timed_steps)."""
    from bench.workloads import get_workload

    rates = rates or RATES[config.run.device]
    workload = get_workload(config.workload.model, config.workload.model_size, config.workload.options())
    flops = workload.train_flops_per_sample() or 0.0
    n_params, n_tensors = model_size_counts(config)
    return [expected_timed_steps(config, rates, group_size(config) * estimate_step_seconds(
        rates, c, flops, n_params, n_tensors)) for c in cells if not c.skip_reason]


def estimate_seconds(config: BenchConfig, cells: list[Cell], rates: Rates | None = None) -> float:
    """A wall-time estimate of the sweep (RATES[run.device] unless `rates`): launches + cells + profiled
    passes (a build, warm-up and the profiled steps, the trace export)."""
    from bench.workloads import get_workload

    rates = rates or RATES[config.run.device]
    workload = get_workload(config.workload.model, config.workload.model_size, config.workload.options())
    flops = workload.train_flops_per_sample() or 0.0
    n_params, n_tensors = model_size_counts(config)
    r, p = config.run, config.profile
    runnable = [c for c in cells if not c.skip_reason]
    total = rates.run_s + rates.launch_s * len(by_launch(runnable)) * r.launches
    for cell in runnable:
        total += estimate_cell_seconds(config, rates, cell, flops, n_params, n_tensors)
        if p.covers(cell.cell_id):
            step = estimate_step_seconds(rates, cell, flops, n_params, n_tensors)
            total += (rates.build_s_per_param * n_params + rates.profile_s
                      + (r.warmup_steps + p.steps) * step)
    return total
