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
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import results
from bench.config import BenchConfig
from bench.matrix import Cell, groups
from bench.progress import Progress
from bench.schema import ERROR_TAIL_LINES

POLL_S = 0.05          # events-file poll period
TERM_GRACE_S = 5.0     # SIGTERM → SIGKILL grace when a launch is killed


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    """The last lines of a log file ('' when missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def launch_env(device: str, threads: int) -> dict[str, str]:
    """The variables a launch sets on top of the caller's environment (recorded in env.json)."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if device == "cpu":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback: no dependence on the machine's network setup
    return env


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


def _children() -> dict[int, list[int]]:
    """ppid → pids of every process, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def kill_groups(proc: subprocess.Popen, extra_pgids: set[int]) -> None:
    """Stop a launch: SIGTERM, then SIGKILL after a grace period, to the launch's process group and the
    groups of its workers (torchrun starts each worker in a session of its own), by id only."""
    own = os.getpgid(0)
    pgids = {proc.pid, *extra_pgids} | {g for p in descendants(proc.pid) if (g := _pgid(p)) is not None}
    pgids.discard(own)

    def signal_all(sig):
        for pgid in pgids:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or any(_alive_group(g) for g in pgids)):
        time.sleep(0.05)
    signal_all(signal.SIGKILL)
    proc.wait()


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclass
class SweepStats:
    overhead_s: list[float] = field(default_factory=list)        # per cell: wall − all its step loops
    overhead_timed_s: list[float] = field(default_factory=list)  # per cell: wall − its timed steps
    launches: int = 0


class Sweep:
    """Runs cells group by group and records every outcome through `results.append_record`."""

    def __init__(self, config: BenchConfig, run_dir: Path, threads_per_rank: dict[int, int],
                 progress: Progress, verbose: bool = True):
        self.config, self.run_dir, self.threads = config, run_dir, threads_per_rank
        self.progress, self.verbose = progress, verbose
        self.stats = SweepStats()
        self.backend = "nccl" if config.run.device == "cuda" else "gloo"
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        # A resumed run keeps the earlier launches' logs: number the new ones after them.
        self.first_launch = len(list((run_dir / "logs").glob("launch-*.cmd")))

    def record(self, cell: Cell, status: str, error: str | None = None, measured: dict | None = None):
        record = results.make_record(cell, self.config, status, error, measured, backend=self.backend)
        results.append_record(self.run_dir, record)
        self.progress.finish(summary_line(record))

    def run(self, cells: list[Cell]) -> SweepStats:
        for ws, group in groups(cells).items():
            pending = list(group)
            while pending:
                pending = self._launch(ws, pending)
        return self.stats

    def _launch(self, ws: int, pending: list[Cell]) -> list[Cell]:
        """One torchrun launch over `pending`; returns the cells still to run after it ends."""
        k = self.first_launch + self.stats.launches
        self.stats.launches += 1
        logs = self.run_dir / "logs"
        plan_path, events_path = logs / f"launch-{k}.plan.json", logs / f"launch-{k}.events.jsonl"
        write_plan(plan_path, self.config, self.run_dir, pending, self.threads[ws], launcher_pid=os.getpid())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ws),
               "-m", "bench.worker", "--plan", str(plan_path), "--events", str(events_path)]
        env = os.environ | launch_env(self.config.run.device, self.threads[ws]) | {"PYTHONUNBUFFERED": "1"}
        (logs / f"launch-{k}.cmd").write_text(" ".join(cmd) + "\n")
        by_id = {c.cell_id: c for c in pending}
        remaining = dict(by_id)
        reader = EventReader(events_path)
        worker_pgids: set[int] = set()
        errors: dict[str, dict] = {}
        current: Cell | None = None
        r = self.config.run
        with open(logs / f"launch-{k}.out", "w") as out, open(logs / f"launch-{k}.err", "w") as err:
            t_launch = time.time()
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
            (logs / f"launch-{k}.pid").write_text(f"{proc.pid}\n")
            mark, started_any = t_launch, False
            try:
                while True:
                    exited = proc.poll() is not None
                    for ev in reader.read():
                        kind = ev["event"]
                        if kind == "hello":
                            worker_pgids.add(ev["pgid"])
                        elif kind == "start":
                            current, started_any = by_id[ev["cell_id"]], True
                            self.progress.start(current.cell_id)
                        elif kind == "error":
                            errors.setdefault(ev["cell_id"], ev)  # the first rank to fail says why
                        elif kind == "finish":
                            cell = remaining.pop(ev["cell_id"])
                            row = ev["row"]
                            gap = ev["t"] - mark
                            self.stats.overhead_s.append(gap - row.get("steps_wall_s", 0.0))
                            self.stats.overhead_timed_s.append(gap - sum(row.get("step_times_ms", [])) / 1e3)
                            mark, current = ev["t"], None
                            self.record(cell, "ok", measured=row)
                    if exited:
                        break
                    # A cell's clock runs from the previous finish; the first cell of a launch also gets
                    # startup_timeout_s (imports, rendezvous, first collectives).
                    first = len(remaining) == len(pending)
                    limit = r.cell_timeout_s + (r.startup_timeout_s if first else 0)
                    if time.time() - mark > limit:
                        victim = current or next(iter(remaining.values()))
                        kill_groups(proc, worker_pgids)
                        self.record(victim, "timeout",
                                    f"no result within run.cell_timeout_s={r.cell_timeout_s:g}s"
                                    + (f" + run.startup_timeout_s={r.startup_timeout_s:g}s" if first else "")
                                    + "; launch killed")
                        remaining.pop(victim.cell_id)
                        return list(remaining.values())
                    time.sleep(POLL_S)
            except BaseException:  # Ctrl-C / SIGTERM: stop the launch and leave nothing behind
                kill_groups(proc, worker_pgids)
                for ev in reader.read():  # keep the cells that finished before the launch was stopped
                    if ev["event"] == "finish" and ev["cell_id"] in remaining:
                        self.record(remaining.pop(ev["cell_id"]), "ok", measured=ev["row"])
                raise
        # Workers may outlive a torchrun that died abnormally: make sure none is left.
        kill_groups(proc, worker_pgids)
        rc = proc.returncode
        if current is not None:  # the launch ended inside a cell
            ev = errors.get(current.cell_id, {})
            why = ev.get("error") or f"launch exited with code {rc}:\n{tail(logs / f'launch-{k}.err')}"
            self.record(current, ev.get("status", "failed"), why)
            remaining.pop(current.cell_id)
        elif remaining and not started_any:  # nothing ran: a start-up failure, same for every cell
            why = f"launch exited with code {rc} before its first cell:\n{tail(logs / f'launch-{k}.err')}"
            for cell in remaining.values():
                self.record(cell, "failed", why)
            return []
        elif remaining and len(remaining) == len(pending):  # no progress: do not relaunch forever
            cell = next(iter(remaining.values()))
            self.record(cell, "failed", f"launch exited with code {rc} without running it")
            remaining.pop(cell.cell_id)
        return list(remaining.values())


def write_plan(path: Path, config: BenchConfig, run_dir: Path, cells: list[Cell], threads: int,
               launcher_pid: int | None) -> None:
    """The worker's input: resolved config, the cells, threads per rank, and who to watch for."""
    plan = {"run_dir": str(run_dir.resolve()), "config": config.to_dict(),
            "cells": [c.to_dict() for c in cells], "threads_per_rank": threads, "launcher_pid": launcher_pid}
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
        line += f"  ({record['error'].strip().splitlines()[-1][:160]})"
    return line
