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

Engine options (bench.schema.ENGINE_OPTIONS: comm_hook, powersgd_rank, reshard_after_forward, static_graph,
gradient_as_bucket_view, compile) are swept only for an engine whose `options` names them; the other
engines' cells leave them None, and a cell id names an option only at a value other than the engine's
default (fsdp2 names reshard_after_forward always), so the cells and ids of a matrix without them are
those it had before they existed. comm_hook fp16|bf16 is resolved here into the torch cell's comm_dtype
(the same hook by its comm_dtype name): it is the comm_dtype=fp16|bf16 cell, one id, one row.
`matrix.cells` (glob patterns over the whole cell id, default "*") keeps only the cells one matches: how a
config names exact cells out of the cross product (advice/best.toml, written by `bench advise`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import math
import re
from dataclasses import dataclass, field

from bench import engines
from bench.config import BenchConfig, ConfigError, MatrixConfig
from bench.schema import COMM_DTYPES, DEFAULT_BUCKET_MB, ENGINE_OPTIONS, GROUP_KEYS
from bench.workloads import model_label


@dataclass(frozen=True)
class _CellAxes:
    """The axes every cell has (Cell adds one field per engine option)."""

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
    # each micro-step's per-rank batch run as this many equal forwards, their gradients accumulated: the
    # memory rule (workload.micro_batch, `micro_splits`); 1: as the batch rule gives it
    micro_splits: int = 1

    @property
    def cell_id(self) -> str:
        """Stable, readable, unique, filesystem-safe: overlap-mlp.small-ws2-b25-fp32-cnone-ga1-strong-gb32,
        then the engine options at other than their defaults (`option_tags`).

        A user model spec ("/path/to/file.py:Name") appears as `Name-<8 hex of its sha256>` (model_label).
        """
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.base_id + "".join(f"-{t}" for t in self.option_tags()))

    @property
    def base_id(self) -> str:
        """The id without the option words (what matrix.options_cells patterns match); `-mb<samples>` when
        the memory rule split its micro-steps (micro_splits > 1)."""
        bucket = "na" if self.bucket_cap_mb is None else f"{self.bucket_cap_mb:g}"
        model = model_label(self.model)
        text = (f"{self.engine}-{model}.{self.model_size}-ws{self.world_size}-b{bucket}-{self.precision}"
                f"-c{self.comm_dtype}-ga{self.grad_accum}-{self.scaling}-gb{self.global_batch}"
                + (f"-mb{self.micro_batch}" if self.micro_splits > 1 else ""))
        return re.sub(r"[^A-Za-z0-9._-]", "_", text)

    @property
    def micro_batch(self) -> int:
        """Samples per rank in one forward: the per-rank batch, or its share when the memory rule split it."""
        return self.per_rank_batch // self.micro_splits

    @property
    def micro_steps(self) -> int:
        """Forwards (and backwards) per optimizer step: grad_accum × micro_splits."""
        return self.grad_accum * self.micro_splits

    def configuration(self) -> tuple:
        """What the trainers run, whatever the batch rule that led to it: two cells with the same are one
        measurement under two ids (strong and weak scaling can meet at a world size)."""
        return (self.engine, self.model, self.model_size, self.world_size, self.bucket_cap_mb, self.precision,
                self.comm_dtype, self.micro_batch, self.micro_steps, self.engine_options)

    @property
    def options(self) -> dict:
        """The engine options this cell sets (those that apply to its engine), by name."""
        return {o.name: getattr(self, o.name) for o in ENGINE_OPTIONS if getattr(self, o.name) is not None}

    def option_tags(self) -> list[str]:
        """The id's words for the options this cell sets, each option's own (bench.schema.ENGINE_OPTIONS
        `word`): hpowersgd.r4, static, gbv, inductor away from their defaults; fsdp2's reshard setting
        always (raf1 | raf0: the engine has no id without one)."""
        options = self.options
        words = (o.word(options[o.name], options) for o in ENGINE_OPTIONS if o.name in options)
        return [w for w in words if w]

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
    def from_dict(cls, data: dict):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# One point of the sweep: everything that distinguishes its measurement — the axes above, then one field per
# engine option (bench.schema.ENGINE_OPTIONS; None: the option does not apply to this cell's engine).
Cell = dataclasses.make_dataclass(
    "Cell", [(o.name, o.kind | None, field(default=None)) for o in ENGINE_OPTIONS], bases=(_CellAxes,),
    frozen=True)
Cell.__module__ = __name__
Cell.__doc__ = "One point of the sweep: everything that distinguishes its measurement (bench/matrix.py)."


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


def micro_splits(per_rank: int, most: int | None) -> int:
    """The memory rule: how many equal forwards a per-rank micro-step of `per_rank` samples is run as, so
    that none holds more than `most` (workload.micro_batch; None: no limit) — the fewest that divide it,
    the way a batch that does not fit a GPU is trained (a smaller micro-batch, its gradients accumulated).
    Strong scaling's largest per-rank batches, at the smallest world sizes, are the ones it splits: 384
    samples at one rank with `most` 32 → 12 forwards of 32; 48 at eight ranks → 2 of 24."""
    if most is None or per_rank <= most:
        return 1
    return next(k for k in range(math.ceil(per_rank / most), per_rank + 1) if per_rank % k == 0)


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
        splits = micro_splits(prb, w.micro_batch)
        for options in engine_options(m, engine):
            peer = not engines.get(engine).in_default_sweep or options != option_defaults(engine)
            comm, options, reason = resolve_hook(comm_dtype, options, ws)
            reason = reason or skip_reason(config, engine, ws, precision, comm, bf16_supported, gpu_count)
            cell = Cell(engine=engine, model=w.model, model_size=w.model_size, world_size=ws,
                        bucket_cap_mb=bucket, precision=precision, comm_dtype=comm, grad_accum=accum,
                        scaling=scaling, per_rank_batch=prb, global_batch=prb * ws * accum,
                        skip_reason=reason, micro_splits=splits, **options)
            if peer and not any(fnmatch.fnmatchcase(cell.base_id, p) for p in m.options_cells):
                continue
            if not any(fnmatch.fnmatchcase(cell.cell_id, p) for p in m.cells):
                continue
            cells.setdefault(cell.cell_id, cell)
    for cell in fixed_cost_cells(list(cells.values()), w.fixed_cost_batch, w.micro_batch):
        cells.setdefault(cell.cell_id, cell)
    return same_configuration_skipped(list(cells.values()))


def fixed_cost_cells(cells: list[Cell], batch: int | None, most: int | None) -> list[Cell]:
    """workload.fixed_cost_batch: each runnable cell of the smallest world size again at that per-rank
    batch (weak scaling), the second batch bench/project fits a micro-step's fixed cost from
    (project.with_fixed_costs). None: no cells."""
    runnable = [c for c in cells if not c.skip_reason]
    if batch is None or not runnable:
        return []
    smallest = min(c.world_size for c in runnable)
    return [dataclasses.replace(c, scaling="weak", per_rank_batch=batch,
                                micro_splits=micro_splits(batch, most),
                                global_batch=batch * c.world_size * c.grad_accum)
            for c in runnable if c.world_size == smallest and c.per_rank_batch != batch]


def same_configuration_skipped(cells: list[Cell]) -> list[Cell]:
    """A runnable cell whose configuration (Cell.configuration) an earlier runnable one already has is the
    same measurement under another id (strong and weak scaling meeting at a world size): it is `skipped`
    with the id it would repeat, not measured twice."""
    first: dict[tuple, str] = {}
    out = []
    for cell in cells:
        if not cell.skip_reason:
            twin = first.setdefault(cell.configuration(), cell.cell_id)
            if twin != cell.cell_id:
                cell = dataclasses.replace(cell, skip_reason=f"the same configuration as {twin} (measured "
                                                             "there: strong and weak scaling meet here)")
        out.append(cell)
    return out


def skip_reason(config: BenchConfig, engine: str, ws: int, precision: str, comm: str, bf16_supported: bool,
                gpu_count: int | None) -> str:
    """Why a cell cannot run here ("" when it can): the skip rules of the module docstring."""
    if comm != "none" and ws == 1:
        return f"comm_dtype={comm} at world_size=1: nothing is communicated (same as comm_dtype=none)"
    try:  # a plug-in engine's own code, run here in the launcher: its failure is a config error
        own = engines.get(engine).skip_reason(comm, config.run.device)
    except Exception as e:  # noqa: BLE001 - whatever it raises, named with the engine
        raise ConfigError(f"matrix.engine={engine!r}: its skip_reason({comm!r}, {config.run.device!r}) "
                          f"raised {type(e).__name__}: {e}") from None
    if own:
        return str(own)
    if precision == "bf16" and config.run.device == "cuda" and not bf16_supported:
        return "precision=bf16: this GPU does not support bf16"
    if config.run.device == "cuda" and gpu_count is not None and ws > gpu_count:
        return f"world_size={ws} is above the {gpu_count} GPUs present"
    return ""


def engine_options(m: MatrixConfig, engine: str) -> list[dict]:
    """The cross product of the engine options that apply to `engine` (one empty dict when none do); an
    option with a `beside` (powersgd_rank) only where its companion has that value (comm_hook powersgd)."""
    takes = [o for o in ENGINE_OPTIONS if o.name in engines.get(engine).options]
    free = [o.name for o in takes if o.beside is None]
    out = []
    for values in itertools.product(*(getattr(m, k) for k in free)):
        combos = [dict(zip(free, values))]
        for dependent in (o for o in takes if o.beside is not None):
            if combos[0].get(dependent.beside[0]) == dependent.beside[1]:
                combos = [c | {dependent.name: v} for c in combos for v in getattr(m, dependent.name)]
        out += combos
    return out


def option_defaults(engine: str) -> dict:
    """The options `engine` takes, each at its default (the axis's default, ENGINE_OPTIONS' `default`)."""
    return {o.name: o.default for o in ENGINE_OPTIONS if o.name in engines.get(engine).options
            and o.beside is None}


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


def engine_groups(cells: list[Cell]) -> list[list[Cell]]:
    """The cells grouped by everything but engine, in the order their first cell appears."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        if cell.bucket_cap_mb is not None:
            groups.setdefault(tuple(getattr(cell, k) for k in GROUP_KEYS), []).append(cell)
    for cell in cells:
        if cell.bucket_cap_mb is None:  # an engine without buckets
            key = {k: getattr(cell, k) for k in GROUP_KEYS}
            same = [g for g in groups
                    if all(v == key[k] for k, v in zip(GROUP_KEYS, g) if k != "bucket_cap_mb")]
            default = [g for g in same if dict(zip(GROUP_KEYS, g))["bucket_cap_mb"] == DEFAULT_BUCKET_MB]
            target = (default or same or [tuple(key.values())])[0]
            groups.setdefault(target, []).append(cell)
    order = {cell.cell_id: i for i, cell in enumerate(cells)}
    return sorted(groups.values(), key=lambda g: min(order[c.cell_id] for c in g))


def engines_per_group(config) -> int:
    """Cells a side-by-side group holds in the plain grid: the matrix's engines with run.interleave on (one
    configuration, every engine), else 1. The unit of run.max_group_s (`group_budget_s`)."""
    return len(config.matrix.engine) if config.run.interleave else 1


def group_budget_s(config, n_cells: int) -> float:
    """The timed-rounds budget of a group of `n_cells`: run.max_group_s per plain group's worth of cells, so
    a larger group (the engine-options slice: every option variant of one configuration side by side) buys
    its cells about the rounds a plain group's get, as the grid would in separate groups."""
    return config.run.max_group_s * max(1.0, n_cells / engines_per_group(config))


def by_launch(cells: list[Cell]) -> dict[int, list[Cell]]:
    """Runnable cells by world size: one launch (torchrun) serves each world size. (A "group" is only ever
    the cells a launch steps side by side: bench/worker/groups.py.)"""
    out: dict[int, list[Cell]] = {}
    for cell in cells:
        if not cell.skip_reason:
            out.setdefault(cell.world_size, []).append(cell)
    return out
