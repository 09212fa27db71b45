"""The events a launch's ranks write and the launcher (or `bench run --collect`) reads.

One JSON object per line, appended and flushed per event, each with its time `t`:
- "hello"  every rank, at start: rank, pid, pgid (so the launcher can stop the workers by process group);
- "start"  rank 0, a cell begins: cell_id;
- "finish" rank 0, a cell ended with a measurement: cell_id, status ("ok" | "diverged"), error, row;
- "error"  the first rank whose cell raised: cell_id, rank, status ("failed" | "oom"), error.
`status` travels only here: the row a "finish" event carries holds measurements, never a status.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class Events:
    """Append-only JSON-lines event log, flushed per event (the launcher tails it)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, **event) -> None:
        event["t"] = time.time()
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")
            f.flush()
