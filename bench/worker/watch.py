"""While a group runs on this rank, one thread that listens for another rank's failure of it and reacts at
once, so that a rank left inside a collective with a failed peer does not wait out the process-group
timeout (450 s on the GPU presets, after which NCCL's watchdog would kill it and the rest of its world size).

Two sources tell it that someone failed, one per way the plan is run:
- under `bench run`'s launcher, guard.Peers: another rank's cell failed alone; this rank then ends its
  process (bench/worker/launch_groups.py: the launcher relaunches the group's other cells);
- in plan mode (the user's own torchrun or srun), the group's failure key in the store
  (plan_mode.FailureKey); this rank then aborts its communicator under NCCL, so a collective in flight
  with the failed rank raises on its main thread (plan_mode.abort_for).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

POLL_S = 0.5  # how often the watch asks its source: a peer's failure is noticed within about this


class FailureWatch:
    """A context manager: from entry to exit a thread asks `heard()` every `poll_s` whether another rank
    failed — True: call `react()` once and stop (`fired` then says so); False: ask again; None: stop asking
    (the source can no longer tell, or the failure is this rank's own: its main thread knows). The thread
    stops, and is joined, on exit (before the main thread uses the store to agree on the outcome)."""

    def __init__(self, heard: Callable[[], bool | None], react: Callable[[], object], poll_s: float = POLL_S,
                 name: str = "bench-failure-watch"):
        self.heard, self.react, self.poll_s = heard, react, poll_s
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            news = self.heard()
            if news is None:
                return
            if news:
                self.fired = True
                self.react()
                return
