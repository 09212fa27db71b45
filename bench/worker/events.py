"""The events a launch's ranks write (`Events`) and the launcher, `bench run --collect` and a plan run's
re-run read (`EventReader`): the one protocol across the process boundary, writer and reader side by side.

One JSON object per line, appended and flushed per event, each with its time `t`:
- "hello"  every rank, at start: rank, pid, pgid (so the launcher can stop the workers by process group),
           ppid (the torchrun agent or srun step that started it);
- "start"  rank 0, a cell begins: cell_id;
- "finish" rank 0, a cell ended: cell_id, status, error, row — "ok" | "diverged" with its measurement,
           "raced_out" with its measurements so far and the comparison that eliminated it, or a cell that
           left its group alone (bench/worker/guard.py: its trainer raised, its loss was not finite, torch
           refused to compile it) "failed" | "oom" | "skipped" with its own error, row empty; and carried_s
           (the timed-rounds budget left unspent so far: bench/worker/rounds.py's Budget);
- "error"  a rank whose cell raised: cell_ids, rank, status ("failed" | "oom"), phase, error; in a plan run
           (bench/worker/plan_mode.py) every rank writes one for a failed group, `peer: true` on the ranks
           that only learnt of it, and phase "start" when the process group never formed.
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


class EventReader:
    """Reads complete new lines of a JSON-lines file that another process appends to."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data, self.partial = self.partial + data, b""
        lines = data.split(b"\n")
        self.partial = lines.pop()  # incomplete last line (or b"")
        return [json.loads(line) for line in lines if line.strip()]
