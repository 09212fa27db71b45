"""The sweep: the cross product of the matrix axes → Cells, with identical cells collapsed and impossible
combinations kept as `skipped` cells carrying their reason.

Collapse rules (cells that would measure the same thing get one id):
- an engine without buckets (`naive`: one all-reduce per parameter): its bucket size means nothing
  (bucket_cap_mb empty, "bna"). (comm_dtype "fp32" = "none" is resolved by the config.)
Skip rules (recorded with status `skipped`, the reason in `error`):
- a compressed comm_dtype at world size 1: nothing is communicated, so it is the comm_dtype=none cell;
- bf16 on a GPU that does not support it;
- what an engine says it cannot run (`Engine.skip_reason`; torch with comm_dtype bf16 on CPU: its
  bf16_compress_hook requires CUDA and NCCL);
- a world size above the GPUs present, when run.skip_world_sizes_above_gpus is set (else a config error);
- comm_hook=powersgd at world size 1 (nothing to compress) or with a compressed comm_dtype (PowerSGD
  replaces the all-reduce the cast would compress), comm_hook=fp16|bf16 beside a different comm_dtype.

Engine options (config.ENGINE_OPTIONS: comm_hook, powersgd_rank, reshard_after_forward, static_graph,
gradient_as_bucket_view, compile) are swept only for an engine whose `options` names them; the other
engines' cells leave them None, and a cell id names an option only at a value other than the engine's
default (fsdp2 names reshard_after_forward always), so the cells and ids of a matrix without them are
those it had before they existed. comm_hook fp16|bf16 is resolved here into the torch cell's comm_dtype
(the same hook by its comm_dtype name): it is the comm_dtype=fp16|bf16 cell, one id, one row.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import math
import re
from dataclasses import dataclass

from bench import engines, stats
from bench.config import ENGINE_OPTIONS, BenchConfig, MatrixConfig
from bench.schema import COMM_DTYPES, COMM_HOOK_TAG, DEFAULT_BUCKET_MB
from bench.workloads import model_label


@dataclass(frozen=True)
class Cell:
    """One point of the sweep: everything that distinguishes its measurement."""

    engine: str
    model: str
    model_size: str
    world_size: int
    bucket_cap_mb: float | None    # None: the engine has no buckets (naive)
    precision: str
    comm_dtype: str                # one of bench.schema.COMM_DTYPES
    grad_accum: int
    scaling: str
    per_rank_batch: int            # samples per rank per micro-step
    global_batch: int              # samples per optimizer step: per_rank_batch × world_size × grad_accum
    skip_reason: str = ""
    # engine options (None: the option does not apply to this engine)
    comm_hook: str | None = None
    powersgd_rank: int | None = None    # set only with comm_hook powersgd
    reshard_after_forward: bool | None = None
    static_graph: bool | None = None
    gradient_as_bucket_view: bool | None = None
    compile: str | None = None

    @property
    def cell_id(self) -> str:
        """Stable, readable, unique, filesystem-safe: overlap-mlp.small-ws2-b25-fp32-cnone-ga1-strong-gb32,
        then the engine options at other than their defaults (`option_tags`).

        A user model spec ("/path/to/file.py:Name") appears as `Name-<8 hex of its sha256>` (model_label).
        """
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.base_id + "".join(f"-{t}" for t in self.option_tags()))

    @property
    def base_id(self) -> str:
        """The id without the option words (what matrix.options_cells patterns match)."""
        bucket = "na" if self.bucket_cap_mb is None else f"{self.bucket_cap_mb:g}"
        model = model_label(self.model)
        text = (f"{self.engine}-{model}.{self.model_size}-ws{self.world_size}-b{bucket}-{self.precision}"
                f"-c{self.comm_dtype}-ga{self.grad_accum}-{self.scaling}-gb{self.global_batch}")
        return re.sub(r"[^A-Za-z0-9._-]", "_", text)

    def option_tags(self) -> list[str]:
        """The id's words for the options this cell sets away from their defaults: hpowersgd.r4, static,
        gbv, inductor; fsdp2's reshard setting always (raf1 | raf0: the engine has no id without one)."""
        tags = []
        if self.comm_hook not in (None, "none"):
            rank = f".r{self.powersgd_rank}" if self.powersgd_rank else ""
            tags.append(f"{COMM_HOOK_TAG}{self.comm_hook}{rank}")
        if self.reshard_after_forward is not None:
            tags.append(f"raf{int(self.reshard_after_forward)}")
        if self.static_graph:
            tags.append("static")
        if self.gradient_as_bucket_view:
            tags.append("gbv")
        if self.compile not in (None, "none"):
            tags.append(self.compile)
        return tags

    @property
    def engine_options(self) -> str:
        """results.csv's engine_options: option_tags joined by " " (a configuration key, bench.schema)."""
        return " ".join(self.option_tags())

    @property
    def is_baseline(self) -> bool:
        """The reference engine with every option at its default: what the other cells of a group are
        compared with (speed_vs_torch, the parity gates)."""
        return engines.get(self.engine).reference and not self.option_tags()

    @property
    def wrap_bucket_mb(self) -> float:
        """The cap the engine is built with: the cell's, or for an engine without buckets (which ignores
        it) the default. `bucket_cap_mb` None means only "no buckets"; the default is never implied by it."""
        return DEFAULT_BUCKET_MB if self.bucket_cap_mb is None else self.bucket_cap_mb

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"cell_id": self.cell_id}

    @classmethod
    def from_dict(cls, data: dict) -> Cell:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# steps of a cell's peak-memory pass (bench/worker/cell.py): torch DDP and ddp_core rebuild their buckets
# after the first step, so the peak covers steps with the rebuilt buckets too
MEMORY_STEPS = 3


def per_rank_batch(scaling: str, world_size: int, global_batch: int, per_rank: int) -> int:
    """The batch rule: strong splits the global micro-batch over the ranks, weak keeps the per-rank batch."""
    if scaling == "strong":
        if global_batch % world_size:
            raise ValueError(f"global_batch={global_batch} is not divisible by world_size={world_size}")
        return global_batch // world_size
    return per_rank


def expand(config: BenchConfig, bf16_supported: bool = True, gpu_count: int | None = None) -> list[Cell]:
    """Every cell of the matrix in sweep order (world size first: one launch per world size), deduplicated."""
    m, w = config.matrix, config.workload
    cells: dict[str, Cell] = {}
    for ws, engine, bucket, precision, comm_dtype, accum, scaling in itertools.product(
        sorted(set(m.world_size)), m.engine, m.bucket_cap_mb, m.precision, m.comm_dtype, m.grad_accum,
        m.scaling,
    ):
        bucket = float(bucket) if engines.get(engine).has_buckets else None
        prb = per_rank_batch(scaling, ws, w.global_batch, w.per_rank_batch)
        for options in engine_options(m, engine):
            peer = not engines.get(engine).in_default_sweep or options != option_defaults(engine)
            comm, options, reason = resolve_hook(comm_dtype, options, ws)
            reason = reason or skip_reason(config, engine, ws, precision, comm, bf16_supported, gpu_count)
            cell = Cell(engine=engine, model=w.model, model_size=w.model_size, world_size=ws,
                        bucket_cap_mb=bucket, precision=precision, comm_dtype=comm, grad_accum=accum,
                        scaling=scaling, per_rank_batch=prb, global_batch=prb * ws * accum,
                        skip_reason=reason, **options)
            if peer and not any(fnmatch.fnmatchcase(cell.base_id, p) for p in m.options_cells):
                continue
            cells.setdefault(cell.cell_id, cell)
    return list(cells.values())


def skip_reason(config: BenchConfig, engine: str, ws: int, precision: str, comm: str, bf16_supported: bool,
                gpu_count: int | None) -> str:
    """Why a cell cannot run here ("" when it can): the skip rules of the module docstring."""
    if comm != "none" and ws == 1:
        return f"comm_dtype={comm} at world_size=1: nothing is communicated (same as comm_dtype=none)"
    if engines.get(engine).skip_reason(comm, config.run.device):
        return engines.get(engine).skip_reason(comm, config.run.device)
    if precision == "bf16" and config.run.device == "cuda" and not bf16_supported:
        return "precision=bf16: this GPU does not support bf16"
    if config.run.device == "cuda" and gpu_count is not None and ws > gpu_count:
        return f"world_size={ws} is above the {gpu_count} GPUs present"
    return ""


def engine_options(m: MatrixConfig, engine: str) -> list[dict]:
    """The cross product of the engine options that apply to `engine` (one empty dict when none do);
    powersgd_rank only beside comm_hook powersgd."""
    keys = [k for k in ENGINE_OPTIONS if k in engines.get(engine).options and k != "powersgd_rank"]
    out = []
    for values in itertools.product(*(getattr(m, k) for k in keys)):
        options = dict(zip(keys, values))
        ranks = m.powersgd_rank if options.get("comm_hook") == "powersgd" else (None,)
        out += [options | ({"powersgd_rank": r} if r is not None else {}) for r in ranks]
    return out


def option_defaults(engine: str) -> dict:
    """The options `engine` takes, each at its default (MatrixConfig's first value)."""
    fields = {f.name: f.default[0] for f in dataclasses.fields(MatrixConfig) if f.name in ENGINE_OPTIONS}
    return {k: fields[k] for k in ENGINE_OPTIONS if k in engines.get(engine).options and k != "powersgd_rank"}


def resolve_hook(comm: str, options: dict, ws: int) -> tuple[str, dict, str]:
    """(comm_dtype, options, skip reason) with a cast hook resolved into comm_dtype: comm_hook fp16 is
    the comm_dtype=fp16 cell. PowerSGD needs ranks to compress between and an uncompressed wire."""
    hook = options.get("comm_hook")
    if hook in COMM_DTYPES and hook != "none":
        if comm not in ("none", hook):
            return comm, options, f"comm_hook={hook} with comm_dtype={comm}: two casts of one gradient"
        return hook, options | {"comm_hook": "none"}, ""
    if hook == "powersgd" and ws == 1:
        return comm, options, "comm_hook=powersgd at world_size=1: nothing is communicated"
    if hook == "powersgd" and comm != "none":
        return comm, options, f"comm_hook=powersgd with comm_dtype={comm}: PowerSGD replaces that all-reduce"
    return comm, options, ""


def by_launch(cells: list[Cell]) -> dict[int, list[Cell]]:
    """Runnable cells by world size: one launch (torchrun) serves each world size. (A "group" is only ever
    the cells a launch steps side by side: bench/worker/groups.py.)"""
    out: dict[int, list[Cell]] = {}
    for cell in cells:
        if not cell.skip_reason:
            out.setdefault(cell.world_size, []).append(cell)
    return out


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
    compute-only without the all-reduce), and the fixed per-cell overhead."""
    r = config.run
    step = estimate_step_seconds(rates, cell, flops_per_sample, n_params, n_tensors)
    timed = expected_timed_steps(config, rates, group_size(config) * step)
    synced = r.warmup_steps + timed + r.phase_steps + MEMORY_STEPS
    unsynced = estimate_step_seconds(rates, cell, flops_per_sample, n_params, n_tensors, sync=False)
    compiled = cell.compile not in (None, "none")
    return (2 * rates.build_s_per_param * n_params + rates.cell_s + synced * step
            + r.compute_only_steps * unsynced + (rates.compile_s if compiled else 0.0))


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
    total = rates.run_s + rates.launch_s * len(by_launch(runnable))
    for cell in runnable:
        total += estimate_cell_seconds(config, rates, cell, flops, n_params, n_tensors)
        if p.covers(cell.cell_id):
            step = estimate_step_seconds(rates, cell, flops, n_params, n_tensors)
            total += (rates.build_s_per_param * n_params + rates.profile_s
                      + (r.warmup_steps + p.steps) * step)
    return total
