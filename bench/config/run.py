"""The run section: what every cell shares (device, step counts, seed, threads, time limits, the search),
and what follows from it (the adaptive rounds' bounds, the watchdog's limit, the process-group timeout)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bench.config.checks import (
    MAX_LAUNCHES,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_TARGET_CI_PCT,
    MAX_THREADS,
    check_choices,
    check_min,
    fail,
)
from bench.schema import PACK_CHOICES, SEARCHES

DEVICES = ("auto", "cpu", "cuda")
# run.pg_timeout_s="auto": this share of run.cell_timeout_s, below the watchdog's limit, so that a collective
# that never completes is reported by the distributed runtime (which collective, its sequence number, NCCL's
# flight recorder: bench/worker/hangs.py) before the launcher's watchdog kills the launch; the rest of the
# limit leaves the rank time to write its record and its peers to leave. A collective starts after its cell's
# clock does, and no healthy collective takes minutes (450 s on the GPU presets, 45 s on cpu-smoke).
PG_TIMEOUT_SHARE = 0.75


@dataclass(frozen=True)
class RunConfig:
    """Fixed fields of every cell: device, step counts, seed, threads and time limits."""

    device: str = "auto"            # auto: cuda when a GPU is present, else cpu
    warmup_steps: int = 5           # both engines rebuild their buckets after iteration 1: at least 2
    timed_steps: int = 20           # with target_ci_pct > 0: the minimum (rounds before the first look)
    repeats: int = 1                # timed windows per cell (barrier + sync before each); samples pooled
    # Separate launches that time every cell, in an order shuffled with the seed (bench/run/schedule.py); the
    # cell's interval combines the variance within and between them (bench/run/between.py). 1: the between-
    # launch variance is unknown. The first launch of a world size runs every pass (schema.PASSES); the
    # others the timed steps, the parity gate and the compute-only rounds (schema.REPEAT_PASSES).
    launches: int = 1
    # Adaptive timed rounds (bench.stats.stop_reason): after timed_steps × repeats rounds, and at each
    # doubling of them, stop once every engine's median step and every paired speed_vs_torch ratio of the
    # group has a 95 % interval within ±target_ci_pct % (0: off, exactly timed_steps × repeats rounds),
    # else at max_timed_steps rounds, or when the next doubling would take the group's timed rounds past
    # max_group_s seconds.
    target_ci_pct: float = 2.0
    max_timed_steps: int = 320      # the adaptive rounds' limit (rule above)
    max_group_s: float = 60.0       # per launch; what a group leaves unspent goes to the launch's next groups
    compute_only_steps: int = 10    # steps under no_sync() for exposed_comm_ms; 0: not measured
    phase_steps: int = 3            # instrumented steps for forward/backward/sync/optimizer times; 0: off
    probe_iters: int = 10           # timed all-reduces of the probe; 0: no probe
    # torch's generators, seeded before each cell's model is built (the same weights for every engine);
    # the launches' order
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

    @staticmethod
    def vocabulary() -> dict[str, tuple]:
        """The values each key of the section may take, where it has a vocabulary (what __post_init__
        checks and docs/reference.md lists)."""
        return {"device": DEVICES, "search": SEARCHES, "pack": PACK_CHOICES}

    def __post_init__(self):
        for key, choices in self.vocabulary().items():
            check_choices(f"run.{key}", [getattr(self, key)], choices)
        check_min("run.warmup_steps", [self.warmup_steps], 2, maximum=MAX_STEPS)
        check_min("run.timed_steps", [self.timed_steps], 1, maximum=MAX_STEPS)
        check_min("run.repeats", [self.repeats], 1, maximum=MAX_STEPS)
        check_min("run.launches", [self.launches], 1, maximum=MAX_LAUNCHES)
        check_min("run.target_ci_pct", [self.target_ci_pct], 0, maximum=MAX_TARGET_CI_PCT)
        check_min("run.max_timed_steps", [self.max_timed_steps], 1, maximum=MAX_STEPS)
        check_min("run.max_group_s", [self.max_group_s], 0, strict=True, maximum=MAX_SECONDS)
        if self.adaptive and self.max_timed_steps < self.min_timed_steps:
            fail("run.max_timed_steps", self.max_timed_steps,
                 f"must be >= run.timed_steps × run.repeats = {self.min_timed_steps} (the minimum) while "
                 f"run.target_ci_pct={self.target_ci_pct:g} is on")
        for key in ("compute_only_steps", "phase_steps", "probe_iters"):
            check_min(f"run.{key}", [getattr(self, key)], 0, maximum=MAX_STEPS)
        check_min("run.threads_per_rank", [self.threads_per_rank], 0, maximum=MAX_THREADS)
        for key in ("cell_timeout_s", "startup_timeout_s"):
            check_min(f"run.{key}", [getattr(self, key)], 0, strict=True, maximum=MAX_SECONDS)
        if not isinstance(self.pg_timeout_s, str):
            check_min("run.pg_timeout_s", [self.pg_timeout_s], 0, strict=True, maximum=MAX_SECONDS)
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
        twice it (rounds the warm-up test moves out are run again, up to as many: bench/worker/rounds.py)."""
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
