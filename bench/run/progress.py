"""A progress bar on stderr over a sweep's work — its cells, then the profiled passes that follow their timed
steps — with ETA and what runs now, and one line per finished cell.

A profiled pass is counted as work of its own: without it the bar sat at "112/112 cells, ETA 0:00:00" for the
tens of seconds the passes take. The ETA treats a pass like a cell (the mean time per unit of work so far)."""

from __future__ import annotations

import sys
import time

from bench.run.launch_log import EXCEPTION_LINE


def _hms(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Redrawn in place on a terminal; on a pipe or file, one bar line per started cell."""

    WIDTH = 24

    def __init__(self, total: int, stream=None, profiled: int = 0, unit: str = "cells"):
        self.total, self.done, self.unit = total, 0, unit
        self.profiled_total, self.profiled_done = profiled, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.current = ""

    def _bar(self) -> str:
        elapsed = time.perf_counter() - self.t0
        done, total = self.done + self.profiled_done, self.total + self.profiled_total
        eta = elapsed / done * (total - done) if done else None
        fill = int(self.WIDTH * done / max(1, total))
        passes = (f", {self.profiled_done}/{self.profiled_total} profiled passes" if self.profiled_total
                  else "")
        return (f"[{'#' * fill}{'.' * (self.WIDTH - fill)}] {self.done}/{self.total} {self.unit}{passes}"
                f"  elapsed {_hms(elapsed)}  ETA {_hms(eta) if eta is not None else '?'}"
                f"  {self.current}")

    def _draw(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self._bar())
        else:
            self.stream.write(self._bar() + "\n")
        self.stream.flush()

    def start(self, activity: str) -> None:
        """Show what runs now (e.g. "running <cell ids>", "profiling <cell id>")."""
        self.current = activity
        self._draw()

    def note(self, text: str) -> None:
        """A line above the bar that is not a cell's summary."""
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        if self.tty:
            self._draw()
        self.stream.flush()

    def finish(self, summary: str) -> None:
        """Count a finished cell (any status) and print its summary line above the bar."""
        self.done += 1
        self.current = ""
        if self.tty:
            self.stream.write("\r\033[K" + summary + "\n")
            self._draw()
        else:  # a log: the summary line only (the bar is printed when the next cell starts)
            self.stream.write(summary + "\n")
            self.stream.flush()

    def profiled_pass(self) -> None:
        """Count a finished profiled pass (its traces are written)."""
        self.profiled_done = min(self.profiled_done + 1, self.profiled_total)
        if self.tty:
            self._draw()

    def drop_pass(self) -> None:
        """A profiled pass that will not run (its cell was raced out): no longer counted as work to do."""
        self.profiled_total = max(self.profiled_done, self.profiled_total - 1)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def summary_line(record: dict) -> str:
    """One line per finished cell."""
    def num(key, fmt):
        value = record.get(key)
        return "-" if value is None else format(value, fmt)

    # one rank communicates nothing: step − compute-only is then the sync work no_sync skips (design.md,
    # "Two witnesses": sync_overhead_ms), not exposed communication
    comm = "sync overhead (1 rank)" if record.get("world_size") == 1 else "exposed comm"
    exposed = f"{num('exposed_comm_ms', '.2f')} ms"
    if (record.get("exposed_comm_ms") or 0) < 0:  # step − compute-only below 0: the two medians' noise
        exposed = f"~0 ms ({record['exposed_comm_ms']:.2f}: the step and the compute-only step within noise)"
    line = (f"{record['status']:<8} {record['cell_id']}  step p50 {num('step_time_ms_p50', '.2f')} ms"
            f"  p90 {num('step_time_ms_p90', '.2f')} ms  {num('samples_per_s', '.1f')} samples/s"
            f"  {comm} {exposed}")
    if record["status"] == "raced_out" and record.get("error"):  # one sentence (bench/race.py): whole
        line += f"  ({record['error']})"
    elif record["status"] not in ("ok",) and record.get("error"):
        lines = record["error"].strip().splitlines()
        line += f"  ({next((x for x in lines if EXCEPTION_LINE.match(x.strip())), lines[-1])[:160]})"
    return line
