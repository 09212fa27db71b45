"""The profile section: which cells get a torch.profiler pass, and its schedule."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from bench.config.checks import MAX_STEPS, check_min, fail


@dataclass(frozen=True)
class ProfileConfig:
    """torch.profiler pass after the timed steps (never timed); schedule as torch.profiler.schedule.
    `cells`: glob patterns (fnmatch, case-sensitive) over cell ids; a cell is profiled when enabled and one
    of them matches its id (default "*": every cell)."""

    enabled: bool = True            # false: no cell is profiled
    cells: tuple[str, ...] = ("*",)  # glob patterns over cell ids: the cells profiled (above)
    # torch.profiler.schedule's: steps skipped first, then per cycle steps waited, warmed up (traced, thrown
    # away) and recorded (active), the cycle run `repeat` times
    skip_first: int = 1             # schedule: steps skipped before the first cycle
    wait: int = 0                   # schedule: steps of a cycle not traced
    warmup: int = 1                 # schedule: steps of a cycle traced but thrown away
    active: int = 2                 # schedule: steps of a cycle recorded in the trace
    repeat: int = 1                 # schedule: cycles
    record_shapes: bool = False     # torch.profiler's: the operators' input shapes
    profile_memory: bool = False    # torch.profiler's: tensor allocations and frees
    with_stack: bool = False        # torch.profiler's: the Python stack of each operator
    with_flops: bool = False        # torch.profiler's: FLOPs of matmuls and convolutions

    def __post_init__(self):
        for key in ("skip_first", "wait", "warmup"):
            check_min(f"profile.{key}", [getattr(self, key)], 0, maximum=MAX_STEPS)
        check_min("profile.active", [self.active], 1, maximum=MAX_STEPS)
        check_min("profile.repeat", [self.repeat], 1, maximum=MAX_STEPS)
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
