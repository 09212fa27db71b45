"""Run configuration: typed, frozen sections loaded from a TOML preset, overridden from the command line.

Precedence (lowest first): dataclass defaults < the preset's tables < the preset's `[on_cpu]` / `[on_cuda]`
table for the device the run resolves to < `--set section.key=value` from the command line.

Every value is checked when its section is built (`__post_init__`); what depends on the machine (GPU count,
precisions the device can run, CPU oversubscription) is checked by the run stage, bench/run_checks.py. A
bad value raises `ConfigError`, whose message names the key and the value; the CLI turns it into exit
code 2 before anything is created.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import math
import os
import tomllib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import engines
from bench.schema import (
    COMM_DTYPE_ALIASES,
    COMM_DTYPES,
    DEFAULT_BUCKET_MB,
    ENGINE_OPTION_NAMES,
    ENGINE_OPTIONS,
    PACK_CHOICES,
    PRECISIONS,
    SCALINGS,
    SEARCHES,
)

CONFIG_DIR = Path(__file__).parent / "configs"
DEVICES = ("auto", "cpu", "cuda")
FAULT_KINDS = ("hang", "crash", "oom", "skip", "slow")  # slow takes its milliseconds: slow:<ms>
DEVICE_SECTIONS = ("on_cpu", "on_cuda")
# run.pg_timeout_s="auto": this share of run.cell_timeout_s, below the watchdog's limit, so that a collective
# that never completes is reported by the distributed runtime (which collective, its sequence number, NCCL's
# flight recorder: bench/worker/hangs.py) before the launcher's watchdog kills the launch; the rest of the
# limit leaves the rank time to write its record and its peers to leave. A collective starts after its cell's
# clock does, and no healthy collective takes minutes (450 s on the GPU presets, 45 s on cpu-smoke).
PG_TIMEOUT_SHARE = 0.75


class ConfigError(ValueError):
    """A configuration value that cannot run; the message names the key and the value."""


ECHO_CHARS = 80  # a value longer than this is shortened in messages (a 100 KB value is not echoed whole)


def fail(key: str, value, why: str):
    """Raise ConfigError naming the key and its value (shortened) and why."""
    text = repr(value)
    if len(text) > ECHO_CHARS:
        text = text[:ECHO_CHARS - 1] + "…"
    raise ConfigError(f"{key}={text}: {why}")


def did_you_mean(word, choices) -> str:
    """"; did you mean 'default'?" when `word` is a near miss of one of `choices` (a typo), else ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_choices(key: str, values, choices) -> None:
    for v in values:
        if v not in choices:
            fail(key, v, f"must be one of {list(choices)}{did_you_mean(v, choices)}")


def _check_min(key: str, values, minimum, strict: bool = False, maximum: float | None = None) -> None:
    """Every value finite, at least (or, strict, above) `minimum` and at most `maximum`: a NaN compares
    false with everything, so it would pass a plain bound check (and, as a timeout, turn the watchdog off)."""
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            fail(key, v, "must be a finite number")
        if (v <= minimum) if strict else (v < minimum):
            fail(key, v, f"must be {'>' if strict else '>='} {minimum}"
                 + (f" and <= {maximum:g}" if maximum is not None else ""))
        if maximum is not None and v > maximum:
            fail(key, v, f"must be <= {maximum:g} ({'>' if strict else '>='} {minimum})")


# Upper bounds: far beyond any real run, low enough that a typo (1e30 MiB buckets, 1e300 s) is caught
# before anything is created rather than by a cell failing later.
MAX_WORLD_SIZE = 65536
MAX_BUCKET_MB = 16384.0          # 16 GiB: no gradient bucket is larger
MAX_STEPS = 1_000_000
MAX_BATCH = 1 << 24
MAX_SECONDS = 7 * 24 * 3600.0    # a week
MAX_THREADS = 4096
MAX_TARGET_CI_PCT = 100.0        # ±100 % of the median: any wider target is no target
MAX_LAUNCHES = 100               # MLPerf asks 5-10 full runs; a hundred launches of every cell is far beyond
MAX_SLOW_MS = 60_000.0           # a straggler fault of a minute per step is a hang; use "hang"


def _engine_names() -> tuple[str, ...]:
    """The registered engines; a plug-in that cannot be added is a config error naming the variable."""
    try:
        return engines.names()
    except engines.PluginError as exc:
        fail(engines.PLUGIN_VARIABLE, os.environ.get(engines.PLUGIN_VARIABLE), str(exc))


def _default_engines() -> tuple[str, ...]:
    _engine_names()  # a plug-in that cannot be added is a config error here too
    return engines.default_sweep()


@dataclass(frozen=True)
class _MatrixAxes:
    """The axes every engine has: each a list, the sweep is their cross product (see bench.matrix)."""

    engine: tuple[str, ...] = field(default_factory=_default_engines)
    world_size: tuple[int, ...] = (1, 2)
    bucket_cap_mb: tuple[float, ...] = (DEFAULT_BUCKET_MB,)
    precision: tuple[str, ...] = ("fp32",)
    comm_dtype: tuple[str, ...] = ("none",)
    grad_accum: tuple[int, ...] = (1,)
    scaling: tuple[str, ...] = ("strong",)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if not getattr(self, f.name):
                fail(f"matrix.{f.name}", list(getattr(self, f.name)), "must list at least one value")
        _check_choices("matrix.engine", self.engine, _engine_names())
        _check_min("matrix.world_size", self.world_size, 1, maximum=MAX_WORLD_SIZE)
        _check_min("matrix.bucket_cap_mb", self.bucket_cap_mb, 0, strict=True, maximum=MAX_BUCKET_MB)
        _check_choices("matrix.precision", self.precision, PRECISIONS)
        _check_choices("matrix.comm_dtype", self.comm_dtype, COMM_DTYPES + tuple(COMM_DTYPE_ALIASES))
        # aliases resolved here, once: everything after the config sees only COMM_DTYPES
        resolved = tuple(dict.fromkeys(COMM_DTYPE_ALIASES.get(c, c) for c in self.comm_dtype))
        object.__setattr__(self, "comm_dtype", resolved)
        _check_min("matrix.grad_accum", self.grad_accum, 1, maximum=MAX_STEPS)
        _check_choices("matrix.scaling", self.scaling, SCALINGS)
        for option in ENGINE_OPTIONS:
            key, values = f"matrix.{option.name}", getattr(self, option.name)
            if option.choices:
                _check_choices(key, values, option.choices)
            if option.limits:
                _check_min(key, values, option.limits[0], maximum=option.limits[1])
        for key in ("options_cells", "cells"):
            for pattern in getattr(self, key):
                if not isinstance(pattern, str) or not pattern.strip():
                    fail(f"matrix.{key}", pattern, "must be a glob pattern over cell ids (\"*-ws2-*\")")
        casts = [h for h in self.comm_hook if h in COMM_DTYPES and h != "none"]
        if casts and any(c != "none" for c in self.comm_dtype):
            fail("matrix.comm_hook", casts[0], f"is torch's comm_dtype={casts[0]} under its hook's name; "
                 f"with matrix.comm_dtype={list(self.comm_dtype)} set only one of the two")

    def check_options_apply(self, keys) -> None:
        """Each engine option in `keys` must apply to a listed engine, and beside its companion's value."""
        for option in ENGINE_OPTIONS:
            if option.name not in keys:
                continue
            takers = [e for e in _engine_names() if option.name in engines.get(e).options]
            if not set(takers) & set(self.engine):
                fail(f"matrix.{option.name}", list(getattr(self, option.name)), f"applies to engine {takers} "
                     f"only; matrix.engine={list(self.engine)} lists none of them")
            if option.beside and option.beside[1] not in getattr(self, option.beside[0]):
                fail(f"matrix.{option.name}", list(getattr(self, option.name)),
                     f"applies only with matrix.{option.beside[0]}={option.beside[1]}")


# The matrix section: the axes above, then one axis per engine option (bench.schema.ENGINE_OPTIONS: a new
# option is a row there, not a field here), each a list whose first value is the engine's own default and
# which is swept only for the engines that take it; then `options_cells`: glob patterns (fnmatch) over a
# cell's id without its option words (`Cell.base_id`) — a cell that sets an engine option away from its
# default, or of an engine outside the default sweep (fsdp2), is swept only where one matches; "*":
# everywhere (a preset's slice of the options, default.toml); last `cells`: glob patterns over the whole
# cell id, and only the cells one matches are swept ("*": all) — how a config names exact cells out of the
# cross product (`bench advise` writes advice/best.toml: the advised configuration and its baseline).
MatrixConfig = dataclasses.make_dataclass(
    "MatrixConfig",
    [*((o.name, tuple[o.kind, ...], field(default=(o.default,))) for o in ENGINE_OPTIONS),
     ("options_cells", tuple[str, ...], field(default=("*",))),
     ("cells", tuple[str, ...], field(default=("*",)))],
    bases=(_MatrixAxes,), frozen=True)
MatrixConfig.__module__ = __name__
MatrixConfig.__doc__ = ("The sweep's axes (bench.matrix): every engine's, the engine options, options_cells, "
                        "cells.")


@dataclass(frozen=True)
class WorkloadConfig:
    """The model and its batch. Batch rule: strong scaling splits `global_batch` (samples per micro-step,
    summed over ranks) evenly over the ranks; weak scaling gives every rank `per_rank_batch` samples. Memory
    rule: a rank's micro-step above `micro_batch` samples runs as equal smaller forwards, accumulated."""

    model: str = "mlp"
    model_size: str = "tiny"
    task: str = "classification"
    data: str = "synthetic"
    seq_len: int | None = None
    fixed_length: bool = True
    image_size: int | None = None
    global_batch: int = 16
    per_rank_batch: int = 8
    # the memory rule: the most samples a rank runs through one forward; a per-rank micro-step above it is
    # run as equal smaller ones, their gradients accumulated (bench.matrix.micro_splits). None: no limit
    micro_batch: int | None = None
    # a second per-rank batch measured at the smallest world size (every configuration there, weak
    # scaling): two batches give the step's fixed cost, which `bench project` and `bench advise` need when
    # the per-GPU batch changes (bench/project/protocol.py; docs/projection.md "Fixed cost"). None: none
    fixed_cost_batch: int | None = None

    def __post_init__(self):
        _check_min("workload.global_batch", [self.global_batch], 1, maximum=MAX_BATCH)
        _check_min("workload.per_rank_batch", [self.per_rank_batch], 1, maximum=MAX_BATCH)
        if self.fixed_cost_batch is not None:
            _check_min("workload.fixed_cost_batch", [self.fixed_cost_batch], 1, maximum=MAX_BATCH)
        if self.micro_batch is not None:
            _check_min("workload.micro_batch", [self.micro_batch], 1, maximum=MAX_BATCH)
        if self.seq_len is not None:
            _check_min("workload.seq_len", [self.seq_len], 1, maximum=MAX_BATCH)
        if self.image_size is not None:
            _check_min("workload.image_size", [self.image_size], 1, maximum=65536)
        from bench.workloads import resolve_model_spec

        try:  # a user model's relative file path → absolute: every rank, on any node, imports that file
            object.__setattr__(self, "model", resolve_model_spec(self.model))
        except ValueError as e:
            raise ConfigError(f"workload: {e}") from None

    def options(self):
        """The workload registry's `WorkloadOptions` for this section."""
        from bench.workloads import WorkloadOptions

        return WorkloadOptions(seq_len=self.seq_len, fixed_length=self.fixed_length, task=self.task,
                               data=self.data, image_size=self.image_size)


@dataclass(frozen=True)
class RunConfig:
    """Fixed fields of every cell: device, step counts, seed, threads and time limits."""

    device: str = "auto"            # auto: cuda when a GPU is present, else cpu
    warmup_steps: int = 5           # both engines rebuild their buckets after iteration 1: at least 2
    timed_steps: int = 20           # with target_ci_pct > 0: the minimum (rounds before the first look)
    repeats: int = 1                # timed windows per cell (barrier + sync before each); samples pooled
    # Separate launches that time every cell, in an order shuffled with the seed (bench/run/schedule.py); the
    # cell's interval combines the variance within and between them (bench/run/between.py). 1: the between-
    # launch variance is unknown. The first launch of a world size also runs the phase, compute-only,
    # probe, memory and profiled passes; the others time the steps only.
    launches: int = 1
    # Adaptive timed rounds (bench.stats.stop_reason): after timed_steps × repeats rounds, and at each
    # doubling of them, stop once every engine's median step and every paired speed_vs_torch ratio of the
    # group has a 95 % interval within ±target_ci_pct % (0: off, exactly timed_steps × repeats rounds),
    # else at max_timed_steps rounds, or when the next doubling would take the group's timed rounds past
    # max_group_s seconds.
    target_ci_pct: float = 2.0
    max_timed_steps: int = 320
    max_group_s: float = 60.0       # per launch; what a group leaves unspent goes to the launch's next groups
    compute_only_steps: int = 10    # steps under no_sync() for exposed_comm_ms; 0: not measured
    phase_steps: int = 3            # instrumented steps for forward/backward/sync/optimizer times; 0: off
    probe_iters: int = 10           # timed all-reduces of the probe; 0: no probe
    seed: int = 1234
    threads_per_rank: int = 0       # 0: the CPUs this process may use // the node's ranks (at least 1)
    # CPU runs: each rank bound to its own threads_per_rank CPUs of the launcher's affinity mask (local rank
    # r takes the r-th share), so the scheduler does not move a rank between cores mid-step
    pin_cpus: bool = True
    cell_timeout_s: float = 600.0   # watchdog: a cell running longer is killed and recorded `timeout`
    startup_timeout_s: float = 120.0  # extra allowance for the first cell of a launch (imports, rendezvous)
    # torch.distributed process-group timeout: "auto" (process_group_timeout_s: below the watchdog, so the
    # runtime names a hung collective first) or seconds
    pg_timeout_s: float | str = "auto"
    skip_world_sizes_above_gpus: bool = False  # true: such cells are `skipped`; false: a config error
    interleave: bool = True         # cells differing only in engine are stepped side by side, round-robin
    # grid: every cell measured fully; race | race-all-sizes: a recipe's configurations raced side by side,
    # the significantly slower ones eliminated (bench/race.py); `bench run --search` sets it
    search: str = "grid"
    allow_oversubscribe: bool = False  # CPU: more ranks than run_checks.OVERSUBSCRIBE_FACTOR × the cores
    # a world size below the node's GPUs runs in GPUs ÷ world size launches at once, each on its own GPUs and
    # CPUs (bench/run/packing.py): auto | on | off; auto packs on CUDA only
    pack: str = "auto"

    def __post_init__(self):
        _check_choices("run.device", [self.device], DEVICES)
        _check_choices("run.search", [self.search], SEARCHES)
        _check_choices("run.pack", [self.pack], PACK_CHOICES)
        _check_min("run.warmup_steps", [self.warmup_steps], 2, maximum=MAX_STEPS)
        _check_min("run.timed_steps", [self.timed_steps], 1, maximum=MAX_STEPS)
        _check_min("run.repeats", [self.repeats], 1, maximum=MAX_STEPS)
        _check_min("run.launches", [self.launches], 1, maximum=MAX_LAUNCHES)
        _check_min("run.target_ci_pct", [self.target_ci_pct], 0, maximum=MAX_TARGET_CI_PCT)
        _check_min("run.max_timed_steps", [self.max_timed_steps], 1, maximum=MAX_STEPS)
        _check_min("run.max_group_s", [self.max_group_s], 0, strict=True, maximum=MAX_SECONDS)
        if self.adaptive and self.max_timed_steps < self.min_timed_steps:
            fail("run.max_timed_steps", self.max_timed_steps,
                 f"must be >= run.timed_steps × run.repeats = {self.min_timed_steps} (the minimum) while "
                 f"run.target_ci_pct={self.target_ci_pct:g} is on")
        for key in ("compute_only_steps", "phase_steps", "probe_iters"):
            _check_min(f"run.{key}", [getattr(self, key)], 0, maximum=MAX_STEPS)
        _check_min("run.threads_per_rank", [self.threads_per_rank], 0, maximum=MAX_THREADS)
        for key in ("cell_timeout_s", "startup_timeout_s"):
            _check_min(f"run.{key}", [getattr(self, key)], 0, strict=True, maximum=MAX_SECONDS)
        if not isinstance(self.pg_timeout_s, str):
            _check_min("run.pg_timeout_s", [self.pg_timeout_s], 0, strict=True, maximum=MAX_SECONDS)
        if isinstance(self.pg_timeout_s, str):
            if self.pg_timeout_s != "auto":
                fail("run.pg_timeout_s", self.pg_timeout_s, "must be \"auto\" or a number of seconds")

    @property
    def adaptive(self) -> bool:
        """Timed rounds continue until the intervals reach target_ci_pct (else a fixed count)."""
        return self.target_ci_pct > 0

    @property
    def min_timed_steps(self) -> int:
        """Rounds every group runs: timed_steps × repeats."""
        return self.timed_steps * self.repeats

    @property
    def rounds_cap(self) -> int:
        """The most timed rounds the stopping rule runs: run.max_timed_steps when adaptive, else the fixed
        count (a racing search's looks end there: bench/race.py)."""
        return self.max_timed_steps if self.adaptive else self.min_timed_steps

    @property
    def most_timed_steps(self) -> int:
        """The most rounds a group may run (what a trainer's data schedule must hold): with a fixed count,
        twice it (rounds the warm-up test moves out are run again, up to as many: bench/worker/cell.py)."""
        return self.max_timed_steps if self.adaptive else 2 * self.min_timed_steps

    def watchdog_limit_s(self, first_cell: bool) -> float:
        """The launcher's time limit for a cell: cell_timeout_s, plus startup_timeout_s for the first cell
        of a launch (imports, rendezvous, first collectives)."""
        return self.cell_timeout_s + (self.startup_timeout_s if first_cell else 0.0)

    @property
    def process_group_timeout_s(self) -> float:
        """The process-group timeout the ranks use: pg_timeout_s, or for "auto" PG_TIMEOUT_SHARE of
        cell_timeout_s. Below the watchdog's limit, a collective that never completes raises in its rank,
        which records what it waited in and its cell `timeout` (bench/worker/hangs.py); a value above it
        leaves the hang to the watchdog, whose row names only each rank's stack."""
        if self.pg_timeout_s == "auto":
            return PG_TIMEOUT_SHARE * self.cell_timeout_s
        return float(self.pg_timeout_s)

    def threads_for(self, ranks_on_node: int) -> int:
        """Threads per rank: threads_per_rank, or the CPUs this process may use shared evenly by the node's
        ranks."""
        return self.threads_per_rank or max(1, usable_cpus() // ranks_on_node)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the OS has one (Linux), else the machine's
    count. Under SLURM (task/affinity, cgroup cpusets) or a container's cpuset that is the allocation, where
    os.cpu_count() is the whole node's: threads sized from it oversubscribe the allocation. A CFS quota
    (cgroup cpu.max) without a cpuset does not show in the mask and is not read."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ProfileConfig:
    """torch.profiler pass after the timed steps (never timed); schedule as torch.profiler.schedule.
    `cells`: glob patterns (fnmatch, case-sensitive) over cell ids; a cell is profiled when enabled and one
    of them matches its id (default "*": every cell)."""

    enabled: bool = True
    cells: tuple[str, ...] = ("*",)
    skip_first: int = 1
    wait: int = 0
    warmup: int = 1
    active: int = 2
    repeat: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False

    def __post_init__(self):
        for key in ("skip_first", "wait", "warmup"):
            _check_min(f"profile.{key}", [getattr(self, key)], 0, maximum=MAX_STEPS)
        _check_min("profile.active", [self.active], 1, maximum=MAX_STEPS)
        _check_min("profile.repeat", [self.repeat], 1, maximum=MAX_STEPS)
        if not self.cells:
            fail("profile.cells", [], "must list at least one pattern (\"*\": every cell)")
        for pattern in self.cells:
            if not isinstance(pattern, str) or not pattern.strip():
                fail("profile.cells", pattern, "must be a glob pattern over cell ids, e.g. \"*-ws8-*\"")

    def covers(self, cell_id: str) -> bool:
        """Whether the cell `cell_id` gets a profiled pass."""
        return self.enabled and any(fnmatch.fnmatchcase(cell_id, p) for p in self.cells)

    @property
    def steps(self) -> int:
        """Steps the profiled pass runs: every cycle of the schedule once."""
        return self.skip_first + (self.wait + self.warmup + self.active) * self.repeat


@dataclass(frozen=True)
class DebugConfig:
    """Test-only fault injection into the cells whose id contains <substring>; "" for none. The fault hits
    the last rank, inside the cell's first step after the warm-up (bench/worker/trainer.py):
    "hang@<substring>" leaves the others waiting in that step's collectives; "crash@<substring>" raises there,
    "oom@<substring>" raises torch's out-of-memory error (a failure on one rank only: bench/worker/guard.py
    Peers); "skip@<substring>" runs that step's backward without its gradient sync (a collective skipped on
    one rank: the ranks' collectives then pair up one apart, until one waits in a collective no peer
    joins, and the process group's timeout names it: bench/worker/hangs.py); "slow:<ms>@<substring>" keeps
    it busy <ms> milliseconds (a spin, as slow work) at the start of every optimizer step (timed,
    compute-only, phase, memory and profiled steps alike): a straggler whose peers wait for it in the
    step's first gradient collective (bench/analyze/waits.py measures that wait)."""

    fault: str = ""

    def __post_init__(self):
        if self.fault:
            kind, _, pattern = self.fault.partition("@")
            name, colon, ms = kind.partition(":")
            if name not in FAULT_KINDS or not pattern or bool(colon) != (name == "slow"):
                fail("debug.fault", self.fault, "must be 'hang@<cell-id substring>', 'crash@<...>', "
                     "'oom@<...>' or 'slow:<ms>@<...>'")
            if name == "slow":
                try:
                    value = float(ms)
                except ValueError:
                    value = math.nan
                if not (math.isfinite(value) and 0 < value <= MAX_SLOW_MS):
                    fail("debug.fault", self.fault,
                         f"slow:<ms> takes milliseconds > 0 and <= {MAX_SLOW_MS:g}, not {ms!r}")

    def fault_for(self, cell_id: str) -> str | None:
        """The fault kind injected into `cell_id` ("hang", "crash", "oom" or "slow"), or None."""
        kind, _, pattern = self.fault.partition("@")
        return kind.partition(":")[0] if self.fault and pattern in cell_id else None

    def slow_ms_for(self, cell_id: str, rank: int, world_size: int) -> float:
        """The milliseconds `rank` straggles by in every step of `cell_id` (0: no straggler here): the last
        rank of a cell the slow fault matches."""
        if self.fault_for(cell_id) != "slow" or rank != world_size - 1:
            return 0.0
        return float(self.fault.partition("@")[0].partition(":")[2])


@dataclass(frozen=True)
class BenchConfig:
    """One run: a description and its sections."""

    description: str = ""
    matrix: MatrixConfig = field(default_factory=MatrixConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    run: RunConfig = field(default_factory=RunConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def __post_init__(self):
        if "strong" in self.matrix.scaling:
            for ws in self.matrix.world_size:
                if self.workload.global_batch % ws:
                    fail("workload.global_batch", self.workload.global_batch,
                         f"strong scaling needs it divisible by every world size; world_size={ws}")
        from bench.workloads import get_workload

        # The registry checks model and size names (no model is built); a user spec is imported and its
        # constructor run, so a missing file, name or a failing constructor stops here.
        try:
            workload = get_workload(self.workload.model, self.workload.model_size, self.workload.options())
        except ValueError as e:
            raise ConfigError(f"workload: {e}") from None
        from bench.workloads.base import options_set

        uses = type(workload).uses_options  # a silently ignored option is a mis-measured run
        ignored = {k: v for k, v in options_set(self.workload.options()).items()
                   if uses is not None and k not in uses}
        if ignored:
            key, value = next(iter(ignored.items()))
            fail(f"workload.{key}", value, f"model {self.workload.model!r} does not use it "
                 f"(it reads {list(uses) or 'no options'}); leave it out")

    def to_dict(self) -> dict:
        """Plain nested dict (lists for tuples), None values included."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


SECTIONS = {"matrix": MatrixConfig, "workload": WorkloadConfig, "run": RunConfig,
            "profile": ProfileConfig, "debug": DebugConfig}


# ---- value conversion -------------------------------------------------------------------------------

def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _convert(key: str, hint, value, from_cli: bool):
    """Check/convert one value against its field type; CLI values arrive as strings."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:  # a matrix axis: a list (CLI: comma-separated)
        if from_cli:
            text = value.strip()
            if text.startswith("["):  # [a, b]; without the opening one a bracket is the value's (a glob's)
                if len(text) < 2 or not text.endswith("]"):
                    fail(key, value, "must be a list: a,b or [a, b] (its '[' is not closed)")
                text = text[1:-1]
            value = [v for v in text.split(",") if v.strip()]
        elif not isinstance(value, list):
            value = [value]
        return tuple(_convert(key, args[0], v, from_cli) for v in value)
    if args and type(None) in args:  # Optional[T]
        if value is None or (from_cli and value.strip().lower() in ("", "none", "null")):
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(key, inner, value, from_cli)
    if args and str in args:  # a number or a keyword (pg_timeout_s: "auto"); the section checks the word
        (inner,) = [a for a in args if a is not str]
        try:
            return _convert(key, inner, value, from_cli)
        except ConfigError:
            if isinstance(value, str):
                return value.strip().strip('"').strip("'")
            raise
    if from_cli:
        value = value.strip().strip('"').strip("'")
        try:
            if hint is bool:
                if value.lower() not in ("true", "false"):
                    raise ValueError
                return value.lower() == "true"
            return hint(value)
        except ValueError:
            fail(key, value, f"must be a {hint.__name__}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        fail(key, value, f"must be a {hint.__name__}")
    return value


def parse_set(items: list[str]) -> dict[str, str]:
    """`--set section.key=value` items → {"section.key": "value"} (values converted later, by type)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        out[key.strip()] = value
    return out


def _apply(tables: dict, key: str, value) -> None:
    """Set a dotted key in the nested tables; unknown sections/keys are reported by `_build`."""
    section, dot, name = key.partition(".")
    if not dot:
        if key != "description":
            raise ConfigError(f"{key}={value!r}: unknown key (use section.key, sections: {list(SECTIONS)})")
        tables["description"] = value
        return
    target = tables.setdefault(section, {})
    if not isinstance(target, dict):
        raise ConfigError(f"{key}={value!r}: {section!r} is not a table")
    target[name] = value


def _build(tables: dict, cli: dict[str, str], given_options_apply: bool = True) -> BenchConfig:
    """Nested TOML tables + CLI strings → a validated BenchConfig. given_options_apply: an engine option
    given with --set (even at its default) must apply to a listed engine, and so must one the TOML gives
    unless --set chose the engines (a preset's peers options then stay unswept for engines it no longer
    lists); off for a resolved config, which lists every key."""
    unknown = set(tables) - set(SECTIONS) - {"description", *DEVICE_SECTIONS}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{key}={tables[key]!r}: unknown key (sections: {list(SECTIONS)})")
    for key, value in cli.items():
        if key != "description" and key.partition(".")[0] not in SECTIONS:
            raise ConfigError(f"{key}={value!r}: unknown key (use section.key, sections: {list(SECTIONS)})")
    sections = {}
    for name, cls in SECTIONS.items():
        hints = _hints(cls)
        values = {}
        if not isinstance(tables.get(name, {}), dict):
            fail(name, tables[name], "must be a table ([" + name + "] with keys)")
        raw = dict(tables.get(name, {}))
        raw_cli = {k.partition(".")[2]: v for k, v in cli.items() if k.partition(".")[0] == name}
        for key, value in list(raw.items()) + list(raw_cli.items()):
            if key not in hints:
                raise ConfigError(f"{name}.{key}={value!r}: unknown key; {name} keys: {sorted(hints)}"
                                  f"{did_you_mean(key, hints)}")
        for key, value in raw.items():
            values[key] = _convert(f"{name}.{key}", hints[key], value, from_cli=False)
        for key, value in raw_cli.items():
            values[key] = _convert(f"{name}.{key}", hints[key], value, from_cli=True)
        sections[name] = cls(**values)
        if name == "matrix" and given_options_apply:
            given = set(raw_cli) | (set() if "engine" in raw_cli else set(raw))
            sections[name].check_options_apply([k for k in ENGINE_OPTION_NAMES if k in given])
    description = cli.get("description", tables.get("description", ""))
    if not isinstance(description, str):
        fail("description", description, "must be a string")
    return BenchConfig(description=description, **sections)


def resolve_path(name_or_path: str) -> Path:
    """A preset name (`bench/configs/<name>.toml`) or a path to a TOML file."""
    path = Path(name_or_path)
    if path.is_dir():
        raise ConfigError(f"--config={name_or_path!r}: is a directory, not a TOML file")
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"--config={name_or_path!r}: no such file")
        return path
    preset = CONFIG_DIR / f"{name_or_path}.toml"
    if not preset.is_file():
        names = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
        raise ConfigError(f"--config={name_or_path!r}: no such preset; presets: {names}"
                          f"{did_you_mean(name_or_path, names)}")
    return preset


def read_tables(path: Path) -> dict:
    """The TOML file's tables; ConfigError for a file that cannot be read, is not UTF-8 or not TOML."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config={str(path)!r}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"--config={str(path)!r}: not UTF-8 text (byte {e.start}); TOML is UTF-8") from None
    except OSError as e:
        raise ConfigError(f"--config={str(path)!r}: cannot be read ({e.strerror})") from None


def load_config(name_or_path: str, overrides: list[str] | None = None,
                cuda_available: bool | Callable[[], bool] | None = None) -> BenchConfig:
    """Load a preset, apply its device table and the `--set` overrides, validate; raises ConfigError.

    The device table (`[on_cpu]`/`[on_cuda]`, dotted keys) is chosen by the device the run resolves to:
    `run.device` from the CLI or the preset, with "auto" meaning cuda when `cuda_available`: a bool, or a
    function asked only for "auto" (`bench run` passes one that refuses GPUs torch cannot use).
    The returned config has `run.device` resolved to "cpu" or "cuda".
    """
    tables = read_tables(resolve_path(name_or_path))
    cli = parse_set(overrides or [])
    for name in (*SECTIONS, *DEVICE_SECTIONS):
        if name in tables and not isinstance(tables[name], dict):
            fail(name, tables[name], "must be a table ([" + name + "] with keys)")
    device = cli.get("run.device", tables.get("run", {}).get("device", RunConfig.device))
    if not isinstance(device, str):
        fail("run.device", device, f"must be one of {list(DEVICES)}")
    device = device.strip()
    if device not in DEVICES:
        fail("run.device", device, f"must be one of {list(DEVICES)}")
    if device == "auto":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        elif callable(cuda_available):
            cuda_available = cuda_available()
        device = "cuda" if cuda_available else "cpu"
    for section in DEVICE_SECTIONS:
        table = tables.get(section, {})
        if not isinstance(table, dict):
            fail(section, table, "must be a table of dotted keys")
        if section == f"on_{device}":
            for key, value in _flatten(table):
                _apply(tables, key, value)
    tables.setdefault("run", {})["device"] = device
    cli.pop("run.device", None)
    return _build(tables, cli)


def _flatten(table: dict, prefix: str = ""):
    """Dotted keys of a device table: both `"run.timed_steps" = 5` and `[on_cpu.run] timed_steps = 5`."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def config_from_dict(data: dict) -> BenchConfig:
    """Rebuild a config from `to_dict()` output or a resolved config.toml's tables."""
    return _build(data, {}, given_options_apply=False)


# ---- writing the resolved config --------------------------------------------------------------------

# TOML's basic string: these characters escaped, every other control character as \uXXXX
TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def toml_value(value) -> str:
    """`value` (bool, number, string or a list of them) as TOML: every string, whatever it holds (a
    newline, a quote, a control character), a valid basic string that reads back as itself."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + "".join(TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c)
                             for c in value) + '"'
    return repr(value)


def to_toml(config: BenchConfig) -> str:
    """The resolved config as TOML (None values are left out: absent means the default, None)."""
    data = config.to_dict()
    lines = [f"description = {toml_value(data.pop('description'))}"]
    for section, values in data.items():
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items() if v is not None]
    return "\n".join(lines) + "\n"
