"""The launcher: one torchrun launch per world size, a watchdog per cell, relaunch after a fault.

Each launch runs `python -m torch.distributed.run --standalone --nproc-per-node N -m bench.worker --plan
logs/launch-<k>.plan.json --events logs/launch-<k>.events.jsonl` in its own process session. The launcher
tails the events file that rank 0 writes: "start" names the cell in flight, "finish" carries its row,
"error" (any rank) its traceback. A cell past `run.cell_timeout_s` gets only its own launch killed
(os.killpg on the launch's and its workers' process groups) and is recorded `timeout`; a launch that
dies records its cell `failed` (or `oom`); either way the remaining cells are relaunched.
The launcher alone writes cells.jsonl.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench import run_folder
from bench.config import BenchConfig
from bench.lifetime import die_with_parent, kill_groups
from bench.matrix import Cell, by_launch
from bench.run import nccl_log
from bench.run.merge import LaunchRecords
from bench.run.progress import Progress
from bench.schema import ERROR_TAIL_LINES, error_text
from bench.worker.events import EventReader

POLL_S = 0.05          # events-file poll period


# A Python exception's line in a log: "ValueError: ...", "torch.OutOfMemoryError: ..." (torchrun's
# "Root Cause" box and tensor dumps come after it and can fill a tail).
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b(?::.*)?$")


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    """The log's last exception line first, then its last lines ('' when missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    all_lines = text.strip().splitlines()
    exceptions = [line.strip() for line in all_lines if EXCEPTION_LINE.match(line.strip())]
    if lines != ERROR_TAIL_LINES:  # an explicit length: just the tail
        return "\n".join(all_lines[-lines:])
    return error_text(exceptions[-1] if exceptions else None, all_lines)


def launch_env(device: str, threads: int) -> dict[str, str]:
    """The variables a launch sets on top of the caller's environment (recorded in env.json)."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if device == "cpu":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback: no dependence on the machine's network setup
    return env


@dataclass
class SweepStats:
    """Totals over the recorded cells, for the launcher's overhead figure."""

    cells: int = 0
    wall_s: float = 0.0     # from launch start (or the previous finish) to each finish
    steps_s: float = 0.0    # inside the cells' step loops
    timed_s: float = 0.0    # inside their timed steps
    launches: int = 0


def launch_schedule(world_sizes: list[int], launches: int, seed: int) -> list[tuple[int, int]]:
    """(world size, repeat) of every launch of a sweep: run.launches per world size, in an order shuffled
    with the run's seed, so that a drift of the machine over the run lands on every world size and repeat
    alike (Google Benchmark's random interleaving of repetitions). One launch each: the world sizes in
    order, as before."""
    schedule = [(ws, j) for ws in world_sizes for j in range(launches)]
    if launches > 1:
        random.Random(seed).shuffle(schedule)
    return schedule


class Sweep:
    """Runs cells group by group, one launch at a time, and records every outcome in the run folder: a cell
    is measured in run.launches launches (bench/run/merge.py merges them into its row)."""

    def __init__(self, config: BenchConfig, run_dir: Path, progress: Progress, fresh: set[str] = frozenset()):
        self.config, self.run_dir, self.progress = config, run_dir, progress
        self.stats = SweepStats()
        self.records = LaunchRecords(run_dir, config, fresh)
        self.carried_s = 0.0  # timed-rounds budget the launches so far left unspent (worker.cell.Budget)
        (run_dir / run_folder.LOGS).mkdir(parents=True, exist_ok=True)
        # A resumed run keeps the earlier launches' logs: number the new ones after them.
        self.first_launch = len(list((run_dir / run_folder.LOGS).glob(run_folder.launch_file("*", "cmd"))))

    def record(self, cell: Cell, launch: Launch, status: str, error: str | None, row: dict | None = None,
               nccl_transport: str | None = None) -> None:
        record = self.records.outcome(cell, launch.repeat, launch.full, status, error, row, nccl_transport)
        self.progress.finish(summary_line(record))

    def measurements(self, cells: list[Cell]) -> int:
        """The (cell, launch) measurements still to run: what the progress bar counts."""
        return sum(self.records.needs(c, j) for c in cells for j in range(self.config.run.launches))

    def run(self, cells: list[Cell]) -> SweepStats:
        r = self.config.run
        by_ws = by_launch(cells)
        for ws, j in launch_schedule(list(by_ws), r.launches, r.seed):
            pending, carried = [c for c in by_ws[ws] if self.records.needs(c, j)], []
            if r.launches > 1:  # no group always first in its launch, right after start-up
                random.Random(f"{r.seed}-{ws}-{j}").shuffle(pending)
            launch = None
            while pending:
                launch = Launch(self, ws, pending, carried, self.first_launch + self.stats.launches, j)
                self.stats.launches += 1
                pending = launch.run()
                # cells timed in a launch that was stopped early are profiled by the next one
                carried = list(launch.untraced.values()) if pending else []
            if launch is not None and launch.untraced:
                self.progress.note(f"no traces for {len(launch.untraced)} cell(s) of world size {ws}: "
                                   f"their launch ended before their profiled pass (rows kept)")
            self.records.remerge(by_ws[ws])  # the family's prior has the launch's cells now
        return self.stats

    def profile_list(self, cells: list[Cell]) -> list[Cell]:
        """The cells whose profiled pass a launch runs after its timed steps."""
        return [c for c in cells if self.config.profile.covers(c.cell_id)]


class Launch:
    """One torchrun launch over the pending cells of one world size: start it, follow its events, stop it
    when a group stops making progress, and say which cells are still to run when it ends."""

    def __init__(self, sweep: Sweep, ws: int, pending: list[Cell], carried: list[Cell], k: int,
                 repeat: int = 0):
        self.sweep, self.config, self.ws, self.k = sweep, sweep.config, ws, k
        # repeat 0 of a world size is its full launch: every phase and the profiled passes; the others
        # time the steps only (run.launches)
        self.repeat, self.full = repeat, repeat == 0
        self.logs = sweep.run_dir / run_folder.LOGS
        self.pending = list(pending)
        self.remaining = {c.cell_id: c for c in pending}
        self.to_profile = carried + (sweep.profile_list(pending) if self.full else [])
        self.untraced = {c.cell_id: c for c in self.to_profile}  # profiled pass still to come
        self.reader = EventReader(self.logs / run_folder.launch_file(k, "events.jsonl"))
        self.worker_pgids: set[int] = set()
        self.errors: dict[str, dict] = {}
        self.current: list[str] = []      # the group in flight (cells not yet finished)
        self.profiling: str | None = None  # the cell whose profiled pass is in flight
        self.started_any = False
        # launch start; last finish (overhead figure); last sign of progress
        self.started_at = self.mark = self.heard = time.time()
        # NCCL's INFO log (which transport it chose): ours per rank, or the user's own NCCL_DEBUG_FILE
        self.nccl_vars = nccl_log.debug_env(self.config.run.device, self.logs, k, os.environ)
        self.nccl_file = (self.nccl_vars or os.environ).get("NCCL_DEBUG_FILE")
        self.nccl_parsed: dict[Path, tuple[int, Counter]] = {}  # path → (size when parsed, its counts)

    def command(self) -> list[str]:
        plan_path = self.logs / run_folder.launch_file(self.k, "plan.json")
        write_plan(plan_path, self.config, self.sweep.run_dir, self.pending, launcher_pid=os.getpid(),
                   profile=self.to_profile, timing_only=not self.full, carried_s=self.sweep.carried_s)
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(self.ws), "-m", "bench.worker", "--plan", str(plan_path.resolve()),
                "--events", str(self.reader.path.resolve())]

    def run(self) -> list[Cell]:
        """Start the launch and follow it to its end; returns the cells still to run."""
        cmd, r = self.command(), self.config.run
        env = (os.environ | launch_env(r.device, r.threads_for(self.ws)) | self.nccl_vars
               | {"PYTHONUNBUFFERED": "1"})
        (self.logs / run_folder.launch_file(self.k, "cmd")).write_text(" ".join(cmd) + "\n")
        with open(self.logs / run_folder.launch_file(self.k, "out"), "w") as out, \
                open(self.logs / run_folder.launch_file(self.k, "err"), "w") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True,
                                    preexec_fn=die_with_parent)  # a SIGKILLed launcher takes torchrun along
            (self.logs / run_folder.launch_file(self.k, "pid")).write_text(f"{proc.pid}\n")
            try:
                while proc.poll() is None:
                    self.follow_events()
                    if self.overdue():
                        self.stop_overdue(proc)
                        return list(self.remaining.values())
                    time.sleep(POLL_S)
                self.follow_events()
            except BaseException:  # Ctrl-C / SIGTERM: stop the launch and leave nothing behind
                kill_groups(proc, self.worker_pgids)
                self.follow_events(outcomes_only=True)  # keep the cells that finished before the stop
                raise
        # Workers may outlive a torchrun that died abnormally: make sure none is left.
        kill_groups(proc, self.worker_pgids)
        if self.config.run.device == "cuda":
            nccl_log.record_launch(self.sweep.run_dir, self.k, self.ws, self.nccl_files(), self.nccl_vars)
        return self.after_exit(proc.returncode)

    def nccl_files(self) -> list[Path]:
        """This launch's NCCL log files (a user's fixed file name: only if written since the launch began);
        the user's NCCL_DEBUG without a file prints to the ranks' stdout: the launch's .out and .err."""
        if self.nccl_file is None:
            outputs = (self.logs / run_folder.launch_file(self.k, part) for part in ("out", "err"))
            return [p for p in outputs if p.is_file()]
        return nccl_log.log_files(self.nccl_file, since=None if self.nccl_vars else self.started_at)

    def nccl_transport(self) -> str | None:
        """The transports NCCL's log shows so far for this launch (None on CPU or without connections).
        Called at every finished cell: a file is parsed again only when it has grown since."""
        if self.config.run.device != "cuda":
            return None
        counts: Counter = Counter()
        for path in self.nccl_files():
            size = path.stat().st_size if path.exists() else 0
            if self.nccl_parsed.get(path, (None,))[0] != size:
                self.nccl_parsed[path] = (size, nccl_log.parse_files([path]))
            counts += self.nccl_parsed[path][1]
        return nccl_log.summary(counts)

    def follow_events(self, outcomes_only: bool = False) -> None:
        """Read the events written since the last call; record finished cells and their traces."""
        for ev in self.reader.read():
            kind = ev["event"]
            self.heard = ev["t"]
            if kind == "finish" and ev["cell_id"] in self.remaining:
                self.finished(self.remaining.pop(ev["cell_id"]), ev)
            elif kind == "traced" and ev["cell_id"] in self.untraced:
                self.untraced.pop(ev["cell_id"])
                self.profiling = None
                self.traced(ev["cell_id"], ev["trace_dir"])
                self.sweep.progress.profiled_pass()
            elif outcomes_only:
                continue
            elif kind == "hello":
                self.worker_pgids.add(ev["pgid"])
            elif kind == "start":
                self.current, self.started_any = list(ev["cell_ids"]), True
                self.sweep.progress.start("running " + ", ".join(self.current))
            elif kind == "profile":
                self.profiling = ev["cell_id"]
                self.sweep.progress.start(f"profiling {ev['cell_id']}")
            elif kind == "error":
                for cell_id in ev["cell_ids"]:
                    self.errors.setdefault(cell_id, ev)  # the first rank to fail says why

    def traced(self, cell_id: str, trace_dir: str) -> None:
        """Complete a recorded cell with its traces: a new line for it in cells.jsonl supersedes the old."""
        self.sweep.records.with_traces(cell_id, trace_dir)

    def finished(self, cell: Cell, ev: dict) -> None:
        """Record a finished cell and the launcher's overhead beyond its steps."""
        row, gap = ev["row"], ev["t"] - self.mark
        self.sweep.stats.wall_s += gap
        self.sweep.stats.steps_s += row.get("steps_wall_s", 0.0)
        self.sweep.stats.timed_s += sum(row.get("step_times_ms", [])) / 1e3
        self.sweep.stats.cells += 1
        self.mark = ev["t"]
        if cell.cell_id in self.current:
            self.current.remove(cell.cell_id)
        # the launcher owns nccl_transport: NCCL's log of this launch, read when the cell finishes
        self.sweep.record(cell, self, ev["status"], ev.get("error"), ev["row"], self.nccl_transport())
        self.sweep.carried_s = ev.get("carried_s", self.sweep.carried_s)

    def time_limit_s(self) -> float:
        """The watchdog's limit on silence (RunConfig.watchdog_limit_s): run.cell_timeout_s since the last
        sign of progress; the launch's first cell also gets startup_timeout_s."""
        first = not self.started_any or len(self.remaining) == len(self.pending)
        return self.config.run.watchdog_limit_s(first_cell=first)

    def overdue(self) -> bool:
        return time.time() - self.heard > self.time_limit_s()

    def stop_overdue(self, proc: subprocess.Popen) -> None:
        """Kill the launch; record the group in flight (or the next cell) `timeout`. A profiled pass that
        hangs costs only its traces: its cell's row is already recorded."""
        r = self.config.run
        first = len(self.remaining) == len(self.pending)
        kill_groups(proc, self.worker_pgids)
        if self.profiling is not None or not self.remaining:
            return
        victims = [self.remaining[i] for i in self.current if i in self.remaining]
        victims = victims or [next(iter(self.remaining.values()))]
        why = (f"no progress within run.cell_timeout_s={r.cell_timeout_s:g}s"
               + (f" + run.startup_timeout_s={r.startup_timeout_s:g}s" if first else "") + "; launch killed")
        for cell in victims:
            self.sweep.record(cell, self, "timeout", why)
            self.remaining.pop(cell.cell_id)

    def after_exit(self, rc: int) -> list[Cell]:
        """Record what an ended launch leaves unfinished; returns the cells to relaunch."""
        err_tail = tail(self.logs / run_folder.launch_file(self.k, "err"))
        in_flight = [self.remaining[i] for i in self.current if i in self.remaining]
        if in_flight:  # the launch ended inside a group
            for cell in in_flight:
                ev = self.errors.get(cell.cell_id)
                why = f"launch exited with code {rc}:\n{err_tail}"
                self.sweep.record(cell, self, *((ev["status"], ev["error"]) if ev else ("failed", why)))
                self.remaining.pop(cell.cell_id)
        elif self.remaining and not self.started_any:  # nothing ran: a start-up failure, same for every cell
            why = f"launch exited with code {rc} before its first cell:\n{err_tail}"
            for cell in self.remaining.values():
                self.sweep.record(cell, self, "failed", why)
            return []
        elif self.remaining and len(self.remaining) == len(self.pending):  # no progress: do not loop
            cell = next(iter(self.remaining.values()))
            self.sweep.record(cell, self, "failed", f"launch exited with code {rc} without running it")
            self.remaining.pop(cell.cell_id)
        return list(self.remaining.values())


def write_plan(path: Path, config: BenchConfig, run_dir: Path, cells: list[Cell], launcher_pid: int | None,
               profile: list[Cell], timing_only: bool = False, carried_s: float = 0.0) -> None:
    """The worker's input: resolved config, the cells to time, the cells to profile after them, the
    launcher to watch for (None: the user's own torchrun/srun), whether the launch times the steps only
    (a repeat launch of run.launches), and the timed-rounds budget earlier launches left unspent
    (worker.cell.Budget)."""
    plan = {"run_dir": str(run_dir.resolve()), "config": config.to_dict(),
            "cells": [c.to_dict() for c in cells], "profile": [c.to_dict() for c in profile],
            "launcher_pid": launcher_pid, "timing_only": timing_only, "carried_s": carried_s}
    path.write_text(json.dumps(plan, indent=1))


def summary_line(record: dict) -> str:
    """One line per finished cell."""
    def num(key, fmt):
        value = record.get(key)
        return "-" if value is None else format(value, fmt)

    line = (f"{record['status']:<8} {record['cell_id']}  step p50 {num('step_time_ms_p50', '.2f')} ms"
            f"  p90 {num('step_time_ms_p90', '.2f')} ms  {num('samples_per_s', '.1f')} samples/s"
            f"  exposed comm {num('exposed_comm_ms', '.2f')} ms")
    if record["status"] not in ("ok",) and record.get("error"):
        lines = record["error"].strip().splitlines()
        line += f"  ({next((x for x in lines if EXCEPTION_LINE.match(x.strip())), lines[-1])[:160]})"
    return line
