"""One torchrun launch of a sweep (bench/run/sweep.py runs them), a watchdog per cell, relaunch after a
fault.

Each launch runs `python -m torch.distributed.run --standalone --nproc-per-node N -m bench.worker --plan
logs/launch-<k>.plan.json --events logs/launch-<k>.events.jsonl` in its own process session. The launcher
tails the events file that rank 0 writes: "start" names the cell in flight, "finish" carries its row,
"error" (any rank) its traceback. A cell past `run.cell_timeout_s` gets only its own launch killed
(os.killpg on the launch's and its workers' process groups) and is recorded `timeout`; a launch that
dies records its cell `failed` (or `oom`); either way the remaining cells are relaunched. A cell that failed
on one rank only (guard.Peers) is recorded with its own cause and its group's other cells relaunched; a
worker killed by a signal before its first cell (the OOM killer, kill -9) gets its world size launched
once more before its cells are recorded `failed`.
The launcher alone writes cells.jsonl.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench import anatomy, run_folder
from bench.config import usable_cpus
from bench.lifetime import die_with_parent, kill_groups
from bench.matrix import Cell
from bench.run import nccl_log, packing
from bench.run.launch_log import CappedLog, killed_by, tail
from bench.run.packing import ALONE, Slot
from bench.run.plan_file import LaunchWork, write_plan
from bench.schema import TRACE_GLOB, Passes
from bench.worker import hangs
from bench.worker.events import EventReader

FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a rank's write failing for these stops the sweep


def launch_env(device: str, threads: int) -> dict[str, str]:
    """The variables a launch sets on top of the caller's environment (recorded in env.json)."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if device == "cpu":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback: no dependence on the machine's network setup
    return env


class Launch:
    """One torchrun launch over the pending cells of one world size: start it, follow its events, stop it
    when a group stops making progress, and say which cells are still to run when it ends. `sweep`: the
    Sweep that runs it (bench/run/sweep.py; not annotated: that module imports this one), whose config,
    run folder, progress line and records it writes to."""

    def __init__(self, sweep, ws: int, pending: list[Cell], carried: list[Cell], k: int,
                 repeat: int = 0, slot: Slot = ALONE, carried_s: float = 0.0):
        self.sweep, self.config, self.ws, self.k = sweep, sweep.config, ws, k
        self.slot = slot  # its GPUs and CPUs when packed (bench/run/packing.py)
        self.carried_s = carried_s  # the timed-rounds budget it starts with, then what its groups left
        # repeat 0 of a world size runs every pass, the profiled ones too; the others time the steps only
        # (run.launches): its Passes say which
        self.repeat, self.passes = repeat, Passes.of_repeat(repeat)
        self.logs = sweep.run_dir / run_folder.LOGS
        self.pending = list(pending)
        self.remaining = {c.cell_id: c for c in pending}
        self.to_profile = carried + (sweep.profile_list(pending) if self.passes.profiles else [])
        self.untraced = {c.cell_id: c for c in self.to_profile}  # profiled pass still to come
        self.reader = EventReader(self.logs / run_folder.launch_file(k, "events.jsonl"))
        self.worker_pgids: set[int] = set()
        self.rank_pids: dict[int, int] = {}  # from the ranks' "hello": whom to ask for a stack (hangs.py)
        self.errors: dict[str, dict] = {}
        self.alone: dict | None = None    # a cell that failed on one rank only ended the launch (guard.Peers)
        self.current: list[str] = []      # the group in flight (cells not yet finished)
        self.profiling: str | None = None  # the cell whose profiled pass is in flight
        self.profile_errors: dict[str, str] = {}  # cell → why its profiled pass failed (its row is kept)
        self.started_any = False
        self.times: dict[str, float] = {}  # the events' times its anatomy reads (hello, start, last)
        self.spawned_at = time.time()
        # launch start; last finish (overhead figure); last sign of progress
        self.started_at = self.mark = self.heard = time.time()
        # NCCL's INFO log (which transport it chose): ours per rank, or the user's own NCCL_DEBUG_FILE
        self.nccl_vars = nccl_log.debug_env(self.config.run.device, self.logs, k, os.environ)
        self.nccl_file = (self.nccl_vars or os.environ).get("NCCL_DEBUG_FILE")
        self.nccl_parsed: dict[Path, tuple[int, Counter]] = {}  # path → (size when parsed, its counts)

    def command(self) -> list[str]:
        plan_path = self.logs / run_folder.launch_file(self.k, run_folder.PLAN)
        work = LaunchWork(self.pending, self.to_profile, self.passes, self.carried_s, self.slot)
        write_plan(plan_path, self.config, self.sweep.run_dir, work, launcher_pid=os.getpid())
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(self.ws), "-m", "bench.worker", "--plan", str(plan_path.resolve()),
                "--events", str(self.reader.path.resolve())]

    def start(self) -> None:
        """Start torchrun (in its slot, when packed) with its logs; `poll` then follows it, `end` ends it,
        `abort` stops it (Sweep.run_lanes)."""
        cmd, r = self.command(), self.config.run
        threads = packing.threads_per_rank(self.slot, self.ws, r.threads_per_rank, usable_cpus())
        env = (os.environ | launch_env(r.device, threads) | self.slot.env() | self.nccl_vars
               | hangs.env(hangs.launch_dir(self.sweep.run_dir, self.k)) | {"PYTHONUNBUFFERED": "1"})
        (self.logs / run_folder.launch_file(self.k, "cmd")).write_text(
            " ".join(cmd) + "\n" + "".join(f"{k}={v}\n" for k, v in self.slot.env().items())
            + (f"cpus={','.join(map(str, self.slot.cpus))}\n" if self.slot.of > 1 else ""))
        slot = self.slot

        def enter() -> None:  # in the child: a SIGKILLed launcher takes torchrun along; the slot's CPUs
            die_with_parent()
            slot.enter()

        self.spawned_at = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     start_new_session=True, preexec_fn=enter)
        self.logs_open = [CappedLog(pipe, self.logs / run_folder.launch_file(self.k, part))
                          for pipe, part in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        (self.logs / run_folder.launch_file(self.k, "pid")).write_text(f"{self.proc.pid}\n")
        self.stopped = False

    def poll(self) -> bool:
        """Follow the events written since the last call; False once the launch has ended (or the watchdog
        stopped it: its group in flight recorded `timeout`)."""
        if self.proc.poll() is None:
            self.follow_events()
            if self.overdue():
                self.stop_overdue(self.proc)
                self.stopped = True
                return False
            return True
        self.follow_events()
        return False

    def close_logs(self) -> None:
        """Each log then holds all its pipe gave (the processes are gone)."""
        for log in self.logs_open:
            log.__exit__(None, None, None)
        self.logs_open = []

    def abort(self) -> None:
        """Ctrl-C / SIGTERM: stop the launch, keep the cells that finished before the stop."""
        kill_groups(self.proc, self.worker_pgids)
        self.follow_events(outcomes_only=True)
        self.close_logs()

    def end(self) -> list[Cell]:
        """After `poll` said it ended: make sure no worker is left (they may outlive a torchrun that died
        abnormally), record what it leaves unfinished; returns the cells to relaunch."""
        kill_groups(self.proc, self.worker_pgids)
        self.close_logs()
        self.sweep.launch_anatomy.append({"launch": self.k, "world_size": self.ws, "repeat": self.repeat,
                                          "parts": self.anatomy(time.time())})
        if self.stopped:
            return list(self.remaining.values())
        if self.config.run.device == "cuda":
            nccl_log.record_launch(self.sweep.run_dir, self.k, self.ws, self.nccl_files(), self.nccl_vars)
        return self.after_exit(self.proc.returncode)

    def anatomy(self, ended_at: float) -> dict[str, float]:
        """The launch's parts of the cost anatomy (anatomy.PARTS) from its events' times: spawn (to the
        last rank's hello), rendezvous (to its first group's start), teardown (its last event to its end)."""
        hello, first, last = self.times.get("hello"), self.times.get("start"), self.times.get("last")
        parts = {}
        if hello is not None:
            parts["spawn"] = max(0.0, hello - self.spawned_at)
            if first is not None:
                parts["rendezvous"] = max(0.0, first - hello)
        if last is not None:
            parts["teardown"] = max(0.0, ended_at - last)
        return parts

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
            self.heard = self.times["last"] = ev["t"]
            if kind == "hello":  # the last hello ends the spawn, the first start the rendezvous
                self.times["hello"] = max(self.times.get("hello", 0.0), ev["t"])
            elif kind == "start":
                self.times.setdefault("start", ev["t"])
            if kind == "finish" and ev["cell_id"] in self.remaining:
                self.finished(self.remaining.pop(ev["cell_id"]), ev)
            elif kind == "traced" and ev["cell_id"] in self.untraced:
                self.untraced.pop(ev["cell_id"])
                self.profiling = None
                self.traced(ev["cell_id"], ev["trace_dir"], ev.get("profile_s"))
                self.sweep.progress.profiled_pass()
            elif outcomes_only:
                continue
            elif kind == "hello":
                self.worker_pgids.add(ev["pgid"])
                self.rank_pids[ev["rank"]] = ev["pid"]
            elif kind == "start":
                self.current, self.started_any = list(ev["cell_ids"]), True
                self.sweep.progress.start("running " + ", ".join(self.current))
            elif kind == "profile":
                self.profiling = ev["cell_id"]
                self.sweep.progress.start(f"profiling {ev['cell_id']}")
            elif kind == "error" and ev.get("phase") == "profile":
                self.profile_failed(ev)
            elif kind == "error":
                if ev.get("alone") and self.alone is None:
                    self.alone = ev
                for cell_id in ev["cell_ids"]:
                    self.errors.setdefault(cell_id, ev)  # the first rank to fail says why

    def profile_failed(self, ev: dict) -> None:
        """A profiled pass that failed: its cell's row stays, its trace files go (a rank's may be cut short:
        a corrupt gzip the analysis would read), and a full disk stops the sweep (OSError: `bench run` exits
        1 saying so) rather than end as "done ... ok" with the traces missing."""
        why = str(ev.get("error") or "").strip().splitlines()
        for cell_id in ev["cell_ids"]:
            self.profile_errors.setdefault(cell_id, why[0] if why else "failed")
            folder = self.sweep.run_dir / run_folder.TRACES / cell_id
            for path in folder.glob(TRACE_GLOB) if folder.is_dir() else ():
                path.unlink(missing_ok=True)
        refused = next((n for n in FULL_DISK if f"[Errno {n}]" in (why[0] if why else "")), None)
        if refused is not None:
            where = self.sweep.run_dir / run_folder.TRACES / ev["cell_ids"][0]
            raise OSError(refused, os.strerror(refused), str(where))

    def traced(self, cell_id: str, trace_dir: str, profile_s: float | None = None) -> None:
        """Complete a recorded cell with its traces (and its profiled pass's seconds): a new line for it in
        cells.jsonl supersedes the old."""
        t0 = time.perf_counter()
        self.sweep.records.with_traces(cell_id, trace_dir, profile_s)
        anatomy.add(self.sweep.anatomy, "writing", time.perf_counter() - t0)

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
        if ev["status"] == "raced_out" and self.untraced.pop(cell.cell_id, None) is not None:
            self.sweep.progress.drop_pass()  # a race eliminated it: the ranks skip its profiled pass
        # the launcher owns nccl_transport: NCCL's log of this launch, read when the cell finishes
        self.sweep.record(cell, self, ev["status"], ev.get("error"), ev["row"], self.nccl_transport())
        self.carried_s = ev.get("carried_s", self.carried_s)

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
        folder = hangs.launch_dir(self.sweep.run_dir, self.k)
        hangs.dump_stacks(self.rank_pids, folder)  # before the kill: what each rank was doing
        kill_groups(proc, self.worker_pgids)
        if self.profiling is not None or not self.remaining:
            return
        victims = [self.remaining[i] for i in self.current if i in self.remaining]
        victims = victims or [next(iter(self.remaining.values()))]
        why = (f"no progress within run.cell_timeout_s={r.cell_timeout_s:g}s"
               + (f" + run.startup_timeout_s={r.startup_timeout_s:g}s" if first else "") + "; launch killed")
        stuck = hangs.summary(self.sweep.run_dir, folder)
        why += f"; {stuck}" if stuck else ""
        for cell in victims:
            self.sweep.record(cell, self, "timeout", why)
            self.remaining.pop(cell.cell_id)

    def after_exit(self, rc: int) -> list[Cell]:
        """Record what an ended launch leaves unfinished; returns the cells to relaunch. A cell that failed
        on one rank only (its "error" event says `alone`) ended the launch: it is recorded with its own
        cause, and the other cells of its group, whose collectives it broke, are relaunched."""
        alone = self.remaining.pop(self.alone["cell_ids"][0], None) if self.alone else None
        if alone is not None:  # (a companion that failed alone is recorded already: the usual path below)
            self.sweep.record(alone, self, self.alone["status"], self.alone["error"])
            return list(self.remaining.values())
        err_tail = tail(self.logs / run_folder.launch_file(self.k, "err"))
        in_flight = [self.remaining[i] for i in self.current if i in self.remaining]
        if in_flight:  # the launch ended inside a group
            killed = killed_by(self.logs / run_folder.launch_file(self.k, "err"))
            # NCCL's watchdog ends a rank whose collective timed out, after dumping its flight recorder
            stuck = hangs.read(self.sweep.run_dir)
            stuck = hangs.lines(stuck[stuck["launch"] == self.k]) if len(stuck) else []
            for cell in in_flight:
                ev = self.errors.get(cell.cell_id)
                why = (f"a worker was killed ({killed}) during this cell" if killed
                       else f"launch exited with code {rc}") + f":\n{err_tail}"
                status = "timeout" if stuck else "failed"
                why = "; ".join(stuck) + f"; {why}" if stuck else why
                self.sweep.record(cell, self, *((ev["status"], ev["error"]) if ev else (status, why)))
                self.remaining.pop(cell.cell_id)
        elif self.remaining and not self.started_any:  # nothing ran: a start-up failure, same for every cell
            killed = killed_by(self.logs / run_folder.launch_file(self.k, "err"))
            if killed and not self.sweep.restarts[self.ws]:  # killed from outside, not the cells' fault:
                self.sweep.restarts[self.ws] += 1            # once more, then it is the world size's
                self.sweep.progress.note(f"a worker of world size {self.ws} was killed ({killed}) before "
                                         "its first cell; launching again")
                return list(self.remaining.values())
            why = (f"a worker was killed ({killed}) before its first cell, twice" if killed
                   else f"launch exited with code {rc} before its first cell") + f":\n{err_tail}"
            for cell in self.remaining.values():
                self.sweep.record(cell, self, "failed", why)
            return []
        elif self.remaining and len(self.remaining) == len(self.pending):  # no progress: do not loop
            cell = next(iter(self.remaining.values()))
            self.sweep.record(cell, self, "failed", f"launch exited with code {rc} without running it")
            self.remaining.pop(cell.cell_id)
        return list(self.remaining.values())
