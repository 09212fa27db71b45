"""The debug section: test-only fault injection (a hang, a crash, an OOM, a skipped collective, a
straggler)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.config.checks import MAX_SLOW_MS, fail

FAULT_KINDS = ("hang", "crash", "oom", "skip", "slow")  # slow takes its milliseconds: slow:<ms>


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

    # the fault and the cells it hits: "hang@<s>", "crash@<s>", "oom@<s>", "skip@<s>" or "slow:<ms>@<s>"
    # (above); "": none
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
