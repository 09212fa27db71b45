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
