"""The --dry-run estimate of a sweep's wall time: per-device rates (each constant's measurement where it is
set), a step's cost from them, the adaptive rounds a group is expected to run (by the worker's own stopping
rule, bench.stats), and the sum over launches, cells and profiled passes; a packed world size costs its
longest share (bench/run/schedule.py shares). A racing search's range: bench/run/estimate_race.py. Never
used for a result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bench import anatomy, stats
from bench.config import BenchConfig
from bench.matrix import MEMORY_STEPS, Cell, by_launch, engines_per_group
from bench.run import packing, schedule
from bench.schema import search


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
    # the adaptive rounds are expected to need, (this / target_ci_pct)² rounds; None: not measured on this
    # device, and the estimate is a range (estimate_range) from the fewest rounds to the caps
    half_width_sqrt_n_pct: float | None
    compile_s: float = 0.0      # per compiled graph and launch (`compiling`): torch.compile in a warm-up


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
        # (0 s: `compiling` charges the first of each graph_key); the larger figure is an upper bound
        compile_s=17.8),
    # One H100 80GB HBM3 (VM), torch 2.11+cu130, smollm2-135m (134.5M parameters in 273 tensors), seq 128,
    # world size 1, 2026-11-25: tests/data/estimate/h100-{default-partial,diag,hostbound.log} and a build
    # timing of both models. Not measured at world size > 1: comm_bytes_per_s is an assumption.
    "cuda": Rates(
        # fp32 (TF32 off): step p50 183 ms at batch 64, kernel-bound (hostbound.log: 178 ms of kernels);
        # bf16, fp16: 54.0 and 54.5 ms of busy kernel time per step at batch 64 (diag's trace summary).
        # smollm2-360m in a plain loop ran fp32 batch 64 at 37.6 TFLOP/s: its fp32 cells come out high.
        # bf16, fp16: one H200 (2026-11-28, tests/data/gpu_evidence/h200-2026-11-28), smollm2-360m at 48 × 512
        # tokens a rank, GPU-bound (91.6 % busy): 219 ms of busy kernel time for 48 samples of 1.063 TFLOP =
        # 2.33e14 FLOP/s. The H100 VM's 1.0e14 above was at 64 × 128 tokens, smaller matmuls; the H200's
        # compute is the H100's, its memory faster: the rate the GPU-bound presets run at, where it applies.
        flops={"fp32": 2.96e13, "bf16": 2.33e14, "fp16": 2.33e14},
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
        # The H200's GPU-bound cells (48 × 512 bf16, 12 × 512 fp32): ±0.12-0.17 % after 20 rounds, so
        # 0.17 × √20 = 0.76; its host-bound cells (12 × 512 bf16) needed 10-80× that (±5.4-13 % after 40):
        # the GPU presets are sized to be GPU-bound, and the estimate is for them
        half_width_sqrt_n_pct=0.76,
        compile_s=49.0),  # the H200's torch + inductor cell, smollm2-360m bf16 at one rank: compile_s 49
}


def model_size_counts(config: BenchConfig) -> tuple[int, int]:
    """(parameters, parameter tensors) of the workload's model, built on the meta device (nothing is
    allocated). A built-in model that cannot be (a checkpoint) is counted on a CPU build; a user model is
    counted on meta only, by the launcher's pre-flight check (bench/workloads/preflight.py), so the
    user's code never runs for real in the launcher. Counted once per workload in a process: a meta build
    still runs every initialiser through torch's decompositions (smollm2-360m: ~4 s on a quiet core), and a
    dry run estimates a sweep more than once."""
    w = config.workload
    key = (w.model, w.model_size, repr(w.options()))
    if key not in _COUNTS:
        _COUNTS[key] = _count(w)
    return _COUNTS[key]


_COUNTS: dict[tuple[str, str, str], tuple[int, int]] = {}  # (model, size, options) → counts


def _count(w) -> tuple[int, int]:
    import torch

    from bench.workloads import get_workload, is_user_spec
    from bench.workloads.preflight import check_user_model

    if is_user_spec(w.model):
        counts = check_user_model(w.model, w.model_size, w.options())
        return counts.params, counts.tensors
    workload = get_workload(w.model, w.model_size, w.options())
    try:
        with torch.device("meta"):
            model = workload.build_model()
    except Exception:  # noqa: BLE001 - a built-in model that cannot be built on meta: count a real build
        model = workload.build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in params), len(params)


def estimate_step_seconds(rates: Rates, cell: Cell, flops_per_sample: float, n_params: int,
                          n_tensors: int, sync: bool = True) -> float:
    """One optimizer step of `cell` by `rates`: micro_steps × max(compute, floor) (its micro-batch's) +
    optimizer + the gradients' ring all-reduce (2(n−1)/n × 4 bytes per parameter; none at world size 1 or
    without sync)."""
    compute = flops_per_sample * cell.micro_batch / rates.flops[cell.precision]
    floor = rates.host_s_per_tensor * n_tensors + rates.floor_s_per_param * n_params
    step = cell.micro_steps * max(compute, floor) + rates.opt_s_per_param * n_params
    if sync and cell.world_size > 1:
        step += 2 * (cell.world_size - 1) / cell.world_size * 4 * n_params / rates.comm_bytes_per_s
    return step


def gpu_busy_fraction(rates: Rates, cell: Cell, flops_per_sample: float, n_params: int,
                      n_tensors: int) -> float:
    """The share of a micro-step the device computes, by `rates`: compute / max(compute, floor). On a GPU
    the host enqueues kernels while the device runs them, so a micro-step whose host floor exceeds its
    compute leaves the GPU idle for the difference: a host-bound cell, whose engine comparisons measure
    the host's overhead (docs/gpu-node.md "Sizing" sizes the GPU presets by this)."""
    compute = flops_per_sample * cell.micro_batch / rates.flops[cell.precision]
    floor = rates.host_s_per_tensor * n_tensors + rates.floor_s_per_param * n_params
    return compute / max(compute, floor) if compute > 0 else 0.0


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
        worst = (rates.half_width_sqrt_n_pct or 0.0) / math.sqrt(n)
        why = stats.stop_reason(worst, r.target_ci_pct, n, r.max_timed_steps, n * round_s, upcoming,
                                r.max_group_s)
        if why == "budget":
            return n + stats.budget_fill(n, n * round_s, r.max_group_s, r.max_timed_steps)
        if why:
            return n
    return points[-1]


def estimate_cell_seconds(config: BenchConfig, rates: Rates, cell: Cell, flops_per_sample: float,
                          n_params: int, n_tensors: int, at_least: int = 0) -> float:
    """A cell's wall time (its `cell_wall_s`, its profiled pass not included): the sum of its parts
    (cell_parts)."""
    return sum(cell_parts(config, rates, cell, flops_per_sample, n_params, n_tensors, at_least).values())


# The options a compiled cell's graph does not depend on: torch DDP's comm hooks (PowerSGD and its rank,
# comm_dtype's bf16/fp16 hooks) run in the reducer, outside the compiled graph; fsdp2's resharding in its
# hooks. Measured (GRU language model, world size 2, CPU, one launch): after fsdp2 raf1 compiled in 3.0 s,
# raf0 took 0.0 s, and torch DDP + PowerSGD 0.0 s after torch DDP (dynamo's guards are on the code, shapes
# and dtypes, not on the module object: a later identical model in the process reuses the graphs).
OUTSIDE_THE_GRAPH = ("comm_hook", "powersgd_rank", "comm_dtype", "reshard_after_forward")


def graph_key(cell: Cell) -> tuple:
    """What a compiled cell's graphs depend on: the cell less its scaling, batch rule and OUTSIDE_THE_GRAPH
    options (its micro-batch, precision, engine, bucket size and the rest stay)."""
    left_out = (*OUTSIDE_THE_GRAPH, "cell_id", "scaling", "global_batch", "skip_reason")
    return tuple(sorted((k, repr(v)) for k, v in cell.to_dict().items() if k not in left_out))


def compiling(cells: list[Cell]) -> set[str]:
    """The compiled cells of one world size's launch that compile: the first of each graph_key; the others
    reuse its graphs (their warm-up's compile_s is 0, as measured). A packed world size keeps a
    configuration's options in one group, so in one slot's process (bench/run/packing.py)."""
    seen, paying = set(), set()
    for cell in cells:
        if cell.compile in (None, "none"):
            continue
        key = (cell.world_size, graph_key(cell))
        if key not in seen:
            seen.add(key)
            paying.add(cell.cell_id)
    return paying


def cell_parts(config: BenchConfig, rates: Rates, cell: Cell, flops_per_sample: float, n_params: int,
               n_tensors: int, at_least: int = 0, compiles: bool | None = None) -> dict[str, float]:
    """A cell's wall time by the cost anatomy's parts (anatomy.PARTS), its profiled pass not included:
    build (the timed trainer), warmup (its steps; a compiled cell's compile), timed (the expected rounds, at
    least `at_least`), phase (its steps), gate (gate_seconds), compute_only (without the all-reduce),
    memory (a second build and MEMORY_STEPS steps), other (the fixed per-cell overhead, Rates.cell_s); per
    repeat launch (run.launches − 1) a build, the overhead, warm-up, timed and compute-only rounds again.
    Worked (tests/test_anatomy.py): step 0.30 s (0.24 without sync), 20 rounds, 5 warm-up, 3 phase, 10
    compute-only, builds of 0.1 s, cell_s 0.5, one launch → build 0.1, warmup 1.5, timed 6.0, phase 0.9,
    compute_only 2.4, memory 0.1 + 3 × 0.30 = 1.0, other 0.5: 12.4 s, estimate_cell_seconds'. `compiles`:
    whether a compiled cell pays Rates.compile_s in each launch (None: it does; `compiling` says which
    do)."""
    r = config.run
    step = estimate_step_seconds(rates, cell, flops_per_sample, n_params, n_tensors)
    timed = max(at_least, expected_timed_steps(config, rates, engines_per_group(config) * step))
    unsynced = estimate_step_seconds(rates, cell, flops_per_sample, n_params, n_tensors, sync=False)
    compiled = cell.compile not in (None, "none") and compiles is not False
    compile_s = rates.compile_s if compiled else 0.0
    build = rates.build_s_per_param * n_params
    repeats = r.launches - 1  # each builds the trainer again, warms it up, times its rounds, compute-only
    return {"build": build * (1 + repeats),
            "warmup": (r.warmup_steps * step + compile_s) * (1 + repeats),
            "timed": timed * step * (1 + repeats),
            "phase": r.phase_steps * step,
            "gate": gate_seconds(rates, cell, step, n_params, engines_per_group(config), r.device),
            "compute_only": r.compute_only_steps * unsynced * (1 + repeats),
            "memory": build + MEMORY_STEPS * step,
            "other": rates.cell_s * (1 + repeats)}


# The parity gate's steps against its one (the judged cell, torch DDP at its precision, the reference):
# the reference runs in fp64 on CPU, about twice an fp32 step there. The references are built once per
# configuration a group gates, so a gated cell carries its group's share of them.
GATE_STEP_COST = {"cpu": 1 + 1 + 2, "cuda": 1 + 1 + 1}


def gate_seconds(rates: Rates, cell: Cell, step: float, n_params: int, sharing: int = 1,
                 device: str = "cpu") -> float:
    """The parity gate of a cell (every cell but plain torch DDP: bench/worker/parity.py): GATE_STEPS
    teacher-forced steps of its own, and 1/`sharing` (the cells of its group) of its references': their
    steps and builds (torch DDP's and the reference's)."""
    from bench.worker import parity

    if not parity.needs_gate(cell):
        return 0.0
    shared = parity.GATE_STEPS * (GATE_STEP_COST[device] - 1) * step + 2 * rates.build_s_per_param * n_params
    return parity.GATE_STEPS * step + shared / max(1, sharing)


def workload_sizes(config: BenchConfig) -> tuple[float, int, int]:
    """(training FLOPs per sample, 0 where the workload does not say; trainable parameters; parameter
    tensors) of the run's model: what every step estimate reads."""
    from bench.workloads import get_workload

    w = config.workload
    flops = get_workload(w.model, w.model_size, w.options()).train_flops_per_sample() or 0.0
    return (flops, *model_size_counts(config))


def fixed_seconds(config: BenchConfig, rates: Rates, runnable: list[Cell]) -> float:
    """The run's own overhead and every launch's start-up: run.launches per world size."""
    return sum(fixed_parts(config, rates, runnable).values())


def fixed_parts(config: BenchConfig, rates: Rates, runnable: list[Cell]) -> dict[str, float]:
    """fixed_seconds by the anatomy's parts: the run's own (start) and the launches' (spawn: Rates.launch_s
    holds start-up and tear-down, whose split was not measured)."""
    return {"start": rates.run_s, "spawn": rates.launch_s * len(by_launch(runnable)) * config.run.launches}


def expected_rounds(config: BenchConfig, cells: list[Cell], rates: Rates | None = None) -> list[int]:
    """Per runnable cell, the timed rounds its group is expected to run (expected_timed_steps)."""
    rates = rates or RATES[config.run.device]
    flops, n_params, n_tensors = workload_sizes(config)
    return [expected_timed_steps(config, rates, engines_per_group(config) * estimate_step_seconds(
        rates, c, flops, n_params, n_tensors)) for c in cells if not c.skip_reason]


def cell_seconds(config: BenchConfig, rates: Rates, cell: Cell, sizes: tuple[float, int, int]) -> float:
    """A cell's wall time with its profiled pass (`sizes`: workload_sizes): what a sweep spends on it, and
    what packing (bench/run/packing.py) spreads over the slots."""
    return sum(grid_cell_parts(config, rates, cell, sizes).values())


def grid_cell_parts(config: BenchConfig, rates: Rates, cell: Cell, sizes: tuple[float, int, int],
                    compiles: bool | None = None) -> dict[str, float]:
    """cell_seconds by the anatomy's parts: cell_parts and its profiled pass (`profile`)."""
    flops, n_params, n_tensors = sizes
    step = estimate_step_seconds(rates, cell, flops, n_params, n_tensors)
    return cell_parts(config, rates, cell, flops, n_params, n_tensors, compiles=compiles) | {
        "profile": profiled_seconds(config, rates, cell, step, n_params)}


def scaled_parts(parts: dict[str, dict[str, float]], seconds: float) -> dict[str, float]:
    """One world size's cells' parts (cell id → parts) summed, scaled to the `seconds` its launches take
    (over_slots: packed, the longest slot, less than their sum): the parts then add up to the estimate.
    Worked: two cells of {timed: 3, build: 1} each in two slots at once (4 s each) → timed 3, build 1."""
    summed = anatomy.total(parts.values())
    whole = sum(summed.values())
    return {p: v * seconds / whole for p, v in summed.items()} if whole else summed


def slot_shares(config: BenchConfig, cells: list[Cell], n: int) -> list[list[Cell]]:
    """One world size's `cells` split over `n` launches at once (schedule.shares of whole groups, or whole
    recipes in a race, each unit at its cell_seconds): the one split a packed sweep (bench/run/sweep.py
    Sweep.lanes) and a packed SLURM step (bench/run/slurm.py) make."""
    sizes, rates = workload_sizes(config), RATES[config.run.device]
    seconds = {c.cell_id: cell_seconds(config, rates, c, sizes) for c in cells}
    return schedule.shares(cells, search(config.run.search).races, lambda c: seconds[c.cell_id], n)


def over_slots(config: BenchConfig, ws: int, gpus: int, seconds: dict[str, float],
               cells: list[Cell]) -> float:
    """One world size's cells at `seconds` each (by cell id): their sum, or, packed (run.pack on a node of
    `gpus` GPUs: bench/run/packing.py), the longest slot of the split the sweep makes."""
    r = config.run
    n = packing.launches_at_once(r, ws, gpus)
    if n == 1:
        return sum(seconds[c.cell_id] for c in cells)
    races = search(r.search).races
    return max(sum(seconds[c.cell_id] for c in share)
               for share in schedule.shares(cells, races, lambda c: seconds[c.cell_id], n))


def estimate_seconds(config: BenchConfig, cells: list[Cell], rates: Rates | None = None,
                     gpus: int = 0) -> float:
    """A wall-time estimate of the sweep (RATES[run.device] unless `rates`): launches + cells + profiled
    passes (a build, warm-up and the profiled steps, the trace export); a world size packed on a node of
    `gpus` GPUs (0: not packed) costs its longest slot."""
    return sum(estimate_parts(config, cells, rates, gpus).values())


def estimate_parts(config: BenchConfig, cells: list[Cell], rates: Rates | None = None,
                   gpus: int = 0) -> dict[str, float]:
    """estimate_seconds by the cost anatomy's parts (anatomy.PARTS), in PARTS order: what `--dry-run`
    prints beside its total, and what the run then measures by the same names."""
    rates = rates or RATES[config.run.device]
    sizes = workload_sizes(config)
    runnable = [c for c in cells if not c.skip_reason]
    out = [fixed_parts(config, rates, runnable)]
    for ws, launch in by_launch(runnable).items():
        paying = compiling(launch)
        parts = {c.cell_id: grid_cell_parts(config, rates, c, sizes, c.cell_id in paying) for c in launch}
        seconds = {c: sum(p.values()) for c, p in parts.items()}
        out.append(scaled_parts(parts, over_slots(config, ws, gpus, seconds, launch)))
    return anatomy.total(out)


def estimate_range(config: BenchConfig, cells: list[Cell], rates: Rates | None = None,
                   gpus: int = 0) -> tuple[float, float]:
    """(fewest, most) seconds of the sweep: every adaptive group stopping at its minimum rounds, and every
    one running to its cap (run.max_timed_steps, or run.max_group_s at the estimated pace). Both bounds
    hold whatever the device's noise; where the noise is measured (Rates.half_width_sqrt_n_pct),
    estimate_seconds' single figure lies between them."""
    rates = rates or RATES[config.run.device]
    return (estimate_seconds(config, cells, replace(rates, half_width_sqrt_n_pct=0.0), gpus),
            estimate_seconds(config, cells, replace(rates, half_width_sqrt_n_pct=math.inf), gpus))


def profiled_seconds(config: BenchConfig, rates: Rates, cell: Cell, step: float, n_params: int) -> float:
    """A profiled pass of `cell` when profile.cells covers it: a build, warm-up, the profiled steps, the
    trace export (as estimate_seconds counts it)."""
    p = config.profile
    if not p.covers(cell.cell_id):
        return 0.0
    return rates.build_s_per_param * n_params + rates.profile_s + (config.run.warmup_steps + p.steps) * step
