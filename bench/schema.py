"""The result-row contract (docs/design.md "Result row"), defined once for writer and readers.

The runner writes rows with exactly these columns (in this order) to `results.csv`; the report and compare
commands read them. A number that was not measured is empty (NaN in pandas), never 0 and never a string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# ---- vocabularies: the values a row may carry (config validates against them, the report reads them) ----
# raced_out: measured only until a racing search (run.search, bench/race.py) found it slower than another
# configuration of its recipe; its row holds its rounds so far and the comparison that eliminated it
STATUSES = ("ok", "failed", "timeout", "oom", "diverged", "skipped", "raced_out")


@dataclass(frozen=True)
class Search:
    """How a sweep spends its time (run.search), the one table every stage reads instead of the name: `races`
    — a recipe's configurations stepped side by side and the significantly slower ones eliminated
    (bench/race.py, bench/worker/racing.py); `carries_over` — world sizes smallest first, each one's
    launches in a row, and a configuration raced out in every recipe of a world size ≥ 2 not launched at the
    larger ones."""

    name: str
    races: bool
    carries_over: bool
    summary: str


SEARCH_TABLE = (
    Search("grid", False, False, "every cell measured fully"),
    Search("race", True, True, "each recipe's configurations raced, the slower eliminated; world sizes "
                               "smallest first, eliminations carried over to the larger ones"),
    Search("race-all-sizes", True, False, "the same race at every world size, nothing carried over"),
)
SEARCHES = tuple(s.name for s in SEARCH_TABLE)   # run.search's vocabulary
# run.pack's vocabulary (bench/run/packing.py): world sizes below the node's GPUs in launches at once
PACK_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class Passes:
    """The passes a launch runs over its cells (bench/worker/cell.py run_group), the one owner of what a
    launch does: a world size's first launch runs all of them (PASSES); a repeat launch of run.launches only
    what a merged row takes from every launch (bench/run/merge.py): its timed rounds, the parity check and
    the compute-only rounds (REPEAT_PASSES). Iterating gives the pass names: what a plan's `passes` holds."""

    names: tuple[str, ...]

    def __iter__(self):
        return iter(self.names)

    def includes(self, name: str) -> bool:
        return name in self.names

    @property
    def profiles(self) -> bool:
        """Whether the launch runs the profiled passes of the cells profile.cells covers."""
        return self.includes("profile")

    @property
    def gives_every_column(self) -> bool:
        """Whether its row has every column (the phase, probe and memory passes'): a merged row's base."""
        return all(self.includes(name) for name in PASSES.names)

    @staticmethod
    def of_repeat(repeat: int) -> Passes:
        """A world size's launch `repeat` of run.launches: the first (0) PASSES, the others REPEAT_PASSES."""
        return PASSES if repeat == 0 else REPEAT_PASSES


PASSES = Passes(("timed", "parity", "compute_only", "phase", "probe", "memory", "profile"))
REPEAT_PASSES = Passes(("timed", "parity", "compute_only"))


def search(name: str) -> Search:
    """run.search's row of SEARCH_TABLE (the config has checked the name)."""
    return next(s for s in SEARCH_TABLE if s.name == name)
# (engines: bench/engines/ is their registry, `bench.engines.names()` their vocabulary)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
SCALINGS = ("strong", "weak")


@dataclass(frozen=True)
class WireDtype:
    """What a `comm_dtype` puts on the wire. torch_dtype: the torch dtype name gradients are cast to (None:
    their own dtype, no compression); wire: its name where bandwidths are looked up (the projection's
    networks, the probe); bytes: per element on the wire (for "none" the gradients' fp32: every workload
    keeps fp32 parameters, precision is autocast); torch_hook: torch DDP's default comm hook for it."""

    name: str
    torch_dtype: str | None
    wire: str
    bytes: int
    torch_hook: str | None

    def on_wire(self, fp32_bytes: int) -> int:
        """The bytes a message of `fp32_bytes` of fp32 gradients takes on the wire."""
        return max(1, int(fp32_bytes * self.bytes / 4))


# All-reduce compression, the one table (engines, probe and projection read it). A row only ever carries
# these names.
WIRE_DTYPES = {w.name: w for w in (
    WireDtype("none", None, "fp32", 4, None),
    WireDtype("fp16", "float16", "fp16", 2, "fp16_compress_hook"),
    WireDtype("bf16", "bfloat16", "bf16", 2, "bf16_compress_hook"),
)}
COMM_DTYPES = tuple(WIRE_DTYPES)
# Spellings a config may use for a value above, resolved once, at the config boundary (config.py): fp32
# gradients sent as fp32 are "none".
COMM_DTYPE_ALIASES = {"fp32": "none"}

# torch DDP's comm hooks (matrix.comm_hook). fp16 and bf16 are the comm_dtype hooks above under the
# hook's name: the config resolves them into comm_dtype (config.py), so a row only ever carries "none" or
# "powersgd" here and the cast's name stays comm_dtype's alone. powersgd is lossy (a low-rank
# approximation with error feedback): its rows carry the loss trajectory's distance from uncompressed DDP.
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
LOSSY_COMM_HOOKS = ("powersgd",)
COMPILE_MODES = ("none", "inductor")   # matrix.compile: eager, or torch.compile(backend="inductor")
# The cell id's word for a comm hook starts with this (bench.matrix.Cell.option_tags: "hpowersgd.r4").
COMM_HOOK_TAG = "h"


@dataclass(frozen=True)
class EngineOption:
    """A matrix key that applies to some engines only (docs/design.md "Engine options"): the one row that
    defines it. An engine's `options` names the keys it takes (bench/engines); the matrix sweeps a key only
    for those engines and leaves it empty (None) in the others' cells, so their cells and ids do not change
    when an option is added. The config's axis (`matrix.<name>`, a list) defaults to `[default]`, the
    engine's own behaviour; `choices` or `limits` bound its values; `beside` (key, value): swept only in
    cells where that other option has that value. `word(value, options)` is the cell id's word for it (None:
    nothing), `options` being the cell's other option values; results.csv has a column of its name."""

    name: str
    kind: type
    default: object
    word: Callable[[object, dict], str | None]
    doc: str
    choices: tuple = ()
    limits: tuple[int, int] | None = None
    beside: tuple[str, object] | None = None


def _hook_word(hook, options: dict) -> str | None:
    rank = options.get("powersgd_rank")
    return None if hook == "none" else f"{COMM_HOOK_TAG}{hook}" + (f".r{rank}" if rank else "")


# The engine options, one row each, in the order of their columns and of their words in a cell id. A new
# option is a row here; the engines that take it name it in their `options` and read it when they wrap.
ENGINE_OPTIONS = (
    EngineOption("comm_hook", str, "none", _hook_word, choices=COMM_HOOKS,
                 doc="torch DDP's comm hook: none | powersgd (fp16/bf16 hooks are comm_dtype)"),
    EngineOption("powersgd_rank", int, 4, lambda rank, options: None, limits=(1, 1 << 24),
                 beside=("comm_hook", "powersgd"),  # its word is part of comm_hook's: hpowersgd.r4
                 doc="PowerSGD's matrix_approximation_rank"),
    # fsdp2 always names it (raf1 | raf0): the engine has no id without one
    EngineOption("reshard_after_forward", bool, True, lambda on, options: f"raf{int(on)}",
                 doc="fsdp2: true (ZeRO-3-like) | false (ZeRO-2-like); torch's default for fully_shard"),
    EngineOption("static_graph", bool, False, lambda on, options: "static" if on else None,
                 doc="torch DDP's static_graph"),
    EngineOption("gradient_as_bucket_view", bool, False, lambda on, options: "gbv" if on else None,
                 doc="torch DDP's gradient_as_bucket_view (and ddp_core's)"),
    EngineOption("compile", str, "none", lambda mode, options: None if mode == "none" else mode,
                 choices=COMPILE_MODES, doc="none | inductor: torch.compile of the model, then its wrapper"),
)
ENGINE_OPTION_NAMES = tuple(o.name for o in ENGINE_OPTIONS)

# ---- shared defaults and units -------------------------------------------------------------------------
DEFAULT_BUCKET_MB = 25.0   # torch DDP's default bucket_cap_mb; ddp_core and the presets use the same
MiB = 2**20                # bucket sizes and memory are in MiB (2^20 bytes); bandwidths in GB/s (1e9 bytes)
ERROR_TAIL_LINES = 12      # lines of a traceback or launch log kept in a row's `error`
TRACE_GLOB = "*.pt.trace.json*"  # the profiler's trace files under traces/<cell_id>/ (gzipped or not)


def error_text(headline: str | None, lines: list[str]) -> str:
    """A row's `error`: the exception's type and message first (a tensor dump or torchrun's "Root Cause"
    box can fill a tail), then the last ERROR_TAIL_LINES lines before it (a traceback's tail, without the
    exception line it ends with); each line at most 300 characters."""
    if not headline:
        return "\n".join(line[:300] for line in lines[-ERROR_TAIL_LINES:])
    head = headline.splitlines()[0][:300] if headline.strip() else headline[:300]
    if lines and lines[-1][:300] == head:
        lines = lines[:-1]
    return "\n".join([head, "…", *(line[:300] for line in lines[-ERROR_TAIL_LINES:])])


def backend_for(device: str) -> str:
    """The process-group backend a run on `device` ("cpu" | "cuda") uses."""
    return "nccl" if device == "cuda" else "gloo"

# The contract's columns (docs/design.md), in order; each column's comment is its meaning in
# docs/reference.md (scripts/reference_tables.py), as every EXTRA_COLUMNS one's.
CONTRACT_COLUMNS = (
    "cell_id",               # stable id of the configuration (bench.matrix.Cell.cell_id)
    # ok | failed | timeout | oom | diverged (measured, but the ranks' parameters differ) | skipped |
    # raced_out (a racing search stopped measuring it: its rounds so far and the race_* columns)
    "status",
    # why, for every status but ok: the exception's type and message first, then the traceback's tail
    # (error_text), or the reason
    "error",
    "engine",                # the engine (bench/engines/): matrix.engine
    "model",                 # the workload: workload.model
    "world_size",            # ranks of the cell: matrix.world_size
    "bucket_cap_mb",         # the engine's gradient bucket cap, MiB: matrix.bucket_cap_mb
    "precision",             # fp32 | tf32 | bf16 | fp16: matrix.precision
    "comm_dtype",            # what the gradients' all-reduce carried: none | fp16 | bf16 (COMM_DTYPES)
    "grad_accum",            # micro-steps per optimizer step: matrix.grad_accum
    "scaling",               # strong | weak: matrix.scaling, the batch rule
    "per_rank_batch",        # samples per micro-step on each rank
    "global_batch",          # samples per optimizer step, all ranks: per_rank_batch × world_size × grad_accum
    "device",                # cpu | cuda
    "backend",               # the process group's: gloo | nccl (backend_for)
    "n_timed_steps",         # timed steps (rounds) the step-time figures are over
    "step_time_ms_p50",      # median over the timed steps of a step's time (per step the slowest rank's), ms
    "step_time_ms_p90",      # their 90th percentile
    "samples_per_s",         # global_batch / the p50 step time
    "compute_only_ms_p50",   # p50 of the compute-only steps (the engine's no_sync: no gradient collective)
    "exposed_comm_ms",       # step p50 − compute-only p50: the communication the step did not hide
    # peak allocated (CUDA: torch's max_memory_allocated) or peak RSS (CPU), MiB, max over ranks
    "peak_mem_mb",
    # the all-reduce probe's nccl-tests algorithm bandwidth at the largest bucket, GB/s (empty at world
    # size 1: nothing crosses a link)
    "allreduce_algbw_gbps",
    "allreduce_busbw_gbps",  # its bus bandwidth, nccl-tests' busbw (0 at world size 1)
    "trace_dir",             # traces/<cell_id>, relative to the run folder, when the cell was profiled
)

# Extra columns the runner adds (the contract allows more). Units are in the names.
EXTRA_COLUMNS = (
    "model_size",            # workload preset within the model family (e.g. "tiny", "360m")
    # samples per rank in one forward: per_rank_batch, or its share when the memory rule
    # (workload.micro_batch) ran each micro-step as micro_splits smaller ones, accumulated (bench/matrix.py)
    "micro_batch",
    "micro_splits",          # the smaller forwards each micro-step ran as (1: not split by the memory rule)
    "engine_options",        # the engine options set away from their defaults, as the cell id's words
                             # (bench.matrix.Cell.option_tags joined by " "; empty: every option at default)
    "seq_len",               # tokens per sample for sequence models; empty otherwise
    "n_params",              # trainable parameters
    "tokens_per_s",          # throughput in tokens; empty for non-sequence models
    "step_time_ms_mean",     # the timed steps' mean time
    "step_time_ms_min",      # their fastest
    "step_time_ms_std",      # their standard deviation
    "step_time_ms_ci95_low",     # 95 % order-statistic interval of the median step time (bench.stats)
    "step_time_ms_ci95_high",    # that interval's upper end (step_time_ms_ci95_low: its lower end)
    "step_time_half_width_pct",  # that interval's half-width, % of the median: the precision achieved
    "stopped_by",                # why the timed rounds stopped: bench.stats.STOPPED_BY; empty: fixed count
    "launches",                  # separate launches that timed the cell (run.launches; bench/run/between.py)
    "between_launch_cv_pct",     # the launches' medians' spread: 100 × sd of their logs; empty: one launch
    "warmup_steps_detected",     # steps from the first found to be warm-up (bench.worker.steady); 0: none
    "outlier_steps",             # timed steps outside Tukey's fences (bench.worker.steady), counted and kept
    "exposed_comm_ms_ci95_low",  # 95 % interval of step p50 − compute-only p50
    "exposed_comm_ms_ci95_high",  # its upper end
    "speed_vs_torch",            # median over rounds of torch step / this engine's step, same group (×)
    "speed_vs_torch_ci95_low",   # its 95 % interval's lower end
    "speed_vs_torch_ci95_high",  # and upper end
    "speed_vs_torch_half_width_pct",  # its interval's half-width, % of the ratio
    "speed_vs_torch_p",          # sign test's p-value of ratio = 1 (bench.stats.sign_test_p), for Holm
    "verdict_vs_torch",          # faster | slower | within noise (bench.stats.verdict); empty for torch
    "interleaved",               # true: stepped round-robin beside the other engines of its group
    # per compute-only round (no collective evens the ranks out there), slowest minus fastest rank; p50
    "rank_skew_ms_p50",
    "slowest_rank",              # the rank most often slowest in those rounds
    "forward_ms_p50",        # phase times where the engine allows (rank 0, p50 over timed steps)
    "backward_ms_p50",       # backward, as forward_ms_p50
    "sync_wait_ms_p50",      # the wait for the gradient sync after backward (ddp_core on CPU only), as above
    "optimizer_ms_p50",      # the optimizer step, as forward_ms_p50
    "allreduce_bytes",       # message size the all-reduce probe used (largest bucket)
    "n_buckets",             # the engine's gradient buckets (the probe's count)
    "final_loss",            # the loss of the cell's last step, mean over ranks
    "model_tflops_per_s",    # the workload's model FLOPs per step / the p50 step time, TFLOP/s
    "mfu",                   # model FLOPs utilisation: achieved model FLOP/s over all ranks' peak
    "matmul_fp32_precision",  # the cell's torch.backends.cuda.matmul.fp32_precision: ieee | tf32; CPU: empty
    "cudnn_fp32_precision",   # the cell's torch.backends.cudnn.conv.fp32_precision: ieee | tf32; CPU: empty
    "threads_per_rank",      # the threads each rank ran with (run.threads_per_rank, or its CPUs' share)
    # launches of this world size running at once on disjoint GPUs (run.pack, bench/run/packing.py); 1: alone
    "packed_launches",
    "gpu_name",              # the GPU's name (torch.cuda.get_device_name); CPU: empty
    "hostname",              # the node rank 0 ran on
    "cell_wall_s",           # wall time of the whole cell on rank 0, warm-up and probes included
    "loss_scale",            # fp16: the GradScaler's scale at the end of the cell; empty otherwise
    "skipped_steps",         # fp16: optimizer steps skipped for inf/NaN gradients, whole cell, max over ranks
    "skipped_timed_steps",   # fp16: those among the timed steps (> 0: the cell is flagged in the report)
    # NCCL's transports in this cell's launch ("P2P/CUMEM", "NVLS+P2P/CUMEM", "SHM", "NET/IB", ...), from its
    # INFO log (bench/run/nccl_log.py; the launcher's); empty for gloo, at world size 1, or without the log
    "nccl_transport",
    "peak_reserved_mb",      # peak held by torch's CUDA caching allocator in the memory pass; CPU: empty
    "device_used_mb",        # the GPU's used memory (total − free) at the memory pass's end; CPU: empty
    # the engine options (ENGINE_OPTIONS, each row's doc); empty where the option does not apply
    *ENGINE_OPTION_NAMES,
    "compile_s",             # seconds of the warm-up steps that compiled (never inside the timed steps)
    # the parity gate (bench/worker/parity.py), every cell but plain torch DDP
    "lossy",                 # true: a lossy comm hook (PowerSGD): its error is reported, not judged
    # at the same weights and batch, ‖g − g_ref‖ / ‖g_ref‖ of the synced gradient against the reference, over
    # all tensors and the gate's steps
    "parity_grad_error",
    "parity_grad_bound",     # BOUND_FACTOR × torch DDP's own error at the precision (or the floor)
    "parity_ddp_error",      # torch DDP's own error at the cell's precision: what the bounds are made of
    "parity_tensor",         # the tensor nearest its bound (its name in the model), its error and bound
    "parity_tensor_error",   # that tensor's error
    "parity_tensor_bound",   # and its bound
    "parity_gate_steps",     # the teacher-forced steps judged (parity.GATE_STEPS)
    "parity_gate_s",         # seconds of the gate for this cell (a configuration's first: its references)
    "parity_gate",           # gated cells: passed | diverged (bench/worker/parity.py)
    "param_bytes_per_rank",  # what the engine should hold per rank by its layout (bench/engines)
    "grad_bytes_per_rank",   # the gradients it should hold per rank (a bucket copy included), by its layout
    "optimizer_state_bytes_per_rank",  # AdamW's two moments it should hold per rank, by its layout
    # a raced_out row: the comparison that eliminated it (bench/race.py), all empty for other rows
    "race_against",          # the cell id of the configuration it was found slower than (its smallest test)
    "race_slowdown",         # its step / that one's: median over their shared rounds (paired), else the
                             # ratio of the medians (unpaired); > 1: slower
    # that ratio's interval at the level its test met (race_level × Simes' j / m, one-sided): its lower end,
    # above 1 what eliminated it
    "race_slowdown_low",
    "race_slowdown_high",    # that interval's upper end
    "race_p",                # its hypothesis's p-value: Simes' combination of its one-sided tests against
                             # every other (paired: sign test; unpaired: bounds' separation; bench/race.py)
    "race_level",            # the level that p-value had to meet: Holm's step of the look's α
    "race_round",            # the rounds both had run when it was eliminated (the look)
    "race_paired",           # true: stepped side by side with race_against; false: an earlier group
)

RESULT_COLUMNS = CONTRACT_COLUMNS + EXTRA_COLUMNS
# the comparison that eliminated a raced_out row (bench/race.py Elimination.columns)
RACE_COLUMNS = tuple(c for c in EXTRA_COLUMNS if c.startswith("race_"))
# The figures of a cell's timed rounds, which a cell timed in several launches has over all of them
# (bench/run/merge.py). A raced_out row has them from the launch that eliminated it only: in a run of
# several launches (run.launches > 1) they would stand, one launch's, beside the other rows' figures over
# every launch (a launch that ran faster for every cell made an eliminated cell look the fastest), so
# such a row leaves them empty (`partial_race_row`); its race_* columns, a comparison within that launch,
# say what it measured, and cells.jsonl keeps each launch's row (`launch_rows`).
ROUND_FIGURES = (
    "n_timed_steps", "step_time_ms_p50", "step_time_ms_p90", "samples_per_s", "tokens_per_s",
    "step_time_ms_mean", "step_time_ms_min", "step_time_ms_std", "step_time_ms_ci95_low",
    "step_time_ms_ci95_high", "step_time_half_width_pct", "stopped_by", "between_launch_cv_pct",
    "warmup_steps_detected", "outlier_steps", "speed_vs_torch", "speed_vs_torch_ci95_low",
    "speed_vs_torch_ci95_high", "speed_vs_torch_half_width_pct", "speed_vs_torch_p", "verdict_vs_torch",
    "rank_skew_ms_p50", "slowest_rank", "model_tflops_per_s", "mfu",
)


def partial_race_row(status: str, launches: int) -> bool:
    """Whether a row of `status` in a run of `launches` launches leaves ROUND_FIGURES out (see above)."""
    return status == "raced_out" and launches > 1

# allreduce_sweep.csv in the run folder: the probe's size sweep, one line per (cell, message size), from
# the `allreduce_sweep` list of each cells.jsonl record. dtype: what the wire carried (float32, bfloat16,
# ...); time_us: microseconds per all-reduce, the mean over iterations and over ranks (nccl-tests' time).
SWEEP_COLUMNS = (
    "cell_id", "world_size", "backend", "dtype", "size_bytes", "time_us", "algbw_gbps", "busbw_gbps",
)

# Columns holding text; every other column is a number (empty when not measured).
STRING_COLUMNS = (
    "cell_id", "status", "error", "engine", "model", "model_size", "precision", "comm_dtype", "scaling",
    "device", "backend", "trace_dir", "gpu_name", "hostname", "verdict_vs_torch", "interleaved", "stopped_by",
    "matmul_fp32_precision", "cudnn_fp32_precision", "nccl_transport", "lossy", "engine_options",
    "parity_gate", "parity_tensor",
    "race_against", "race_paired",
    *(o.name for o in ENGINE_OPTIONS if o.kind is not int),
)

# The keys that identify a configuration (what compare joins on, what T1 is matched by, what advise ranks).
# engine_options keeps a torch cell with PowerSGD or torch.compile apart from plain torch DDP; a group of
# cells stepped side by side shares every key but engine and engine_options (GROUP_KEYS).
CONFIG_KEYS = (
    "engine", "model", "model_size", "world_size", "bucket_cap_mb", "precision", "comm_dtype",
    "grad_accum", "scaling", "per_rank_batch", "global_batch", "engine_options",
)
# what a group's cells share (bench.matrix.engine_groups): a group compares engines, and an engine's
# options, side by side
GROUP_KEYS = tuple(k for k in CONFIG_KEYS if k not in ("engine", "engine_options"))


def without_comm_hook(engine_options: str) -> str:
    """engine_options less its comm-hook word: the configuration whose world-size-1 cell stands in for a
    hooked one (nothing is communicated on one rank, so the runner skips hooked cells there)."""
    return " ".join(t for t in str(engine_options).split() if not t.startswith(COMM_HOOK_TAG))
