"""The launcher: one torchrun launch per world size, a watchdog per cell, relaunch after a fault.

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
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from bench import race, run_folder, schema
from bench.config import BenchConfig, usable_cpus
from bench.lifetime import die_with_parent, kill_groups
from bench.matrix import Cell, by_launch
from bench.run import nccl_log, packing, results
from bench.run.merge import MEASURED, LaunchRecords
from bench.run.packing import ALONE, Slot
from bench.run.progress import Progress
from bench.schema import (
    ERROR_TAIL_LINES,
    PASSES,
    RACE_COLUMNS,
    Passes,
    TRACE_GLOB,
    error_text,
    search,
)
from bench.worker import hangs
from bench.worker.events import EventReader

POLL_S = 0.05          # events-file poll period
# A launch's stdout and stderr are kept whole up to LOG_HEAD_BYTES each, then only their last LOG_TAIL_BYTES:
# a model that prints every step must not fill the disk (4 cells of one wrote 38 MB of logs), and the end of
# a log (the exception that stopped a launch, which `tail` reads) is always kept. 4 MiB holds a launch's
# start-up, warnings and NCCL INFO lines (NCCL_DEBUG without a file: about 100 lines per rank) many times.
LOG_HEAD_BYTES = 4 * 2**20
LOG_TAIL_BYTES = 2**20
LOG_DRAIN_S = 10.0     # how long a finished launch's logs may take to receive the end of their pipes
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a rank's write failing for these stops the sweep


# A Python exception's line in a log: "ValueError: ...", "torch.OutOfMemoryError: ..." (torchrun's
# "Root Cause" box and tensor dumps come after it and can fill a tail).
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b(?::.*)?$")


# torchrun's own exception when a rank fails: its line names no cause (that is the rank's exception, printed
# above it in the same log), so a rank's exception line is preferred to it
TORCHRUN_EXCEPTIONS = ("ChildFailedError",)
# torchrun's report of a worker ended by a signal (its ChildFailedError box: "traceback : Signal 9 (SIGKILL)
# received by PID 1234"): the kernel's OOM killer, an operator's kill -9, a node going down
KILLED_BY = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID \d+")


def killed_by(path: Path) -> str | None:
    """"SIGKILL (signal 9)" when the launch's log says a worker was ended by a signal, else None: the root
    cause's (torchrun's "Root Cause (first observed failure)"; the other workers, which torchrun itself then
    stops, are listed before it with SIGTERM)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    root = text.rfind("Root Cause")
    found = KILLED_BY.search(text, root if root >= 0 else 0)
    return f"{found[2]} (signal {found[1]})" if found else None


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    """The log's last exception line first (a rank's, rather than torchrun's ChildFailedError that follows
    it), then its last lines ('' when missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    all_lines = text.strip().splitlines()
    exceptions = [line.strip() for line in all_lines if EXCEPTION_LINE.match(line.strip())]
    causes = [e for e in exceptions if not any(n in e.split(":")[0] for n in TORCHRUN_EXCEPTIONS)]
    if lines != ERROR_TAIL_LINES:  # an explicit length: just the tail
        return "\n".join(all_lines[-lines:])
    return error_text((causes or exceptions or [None])[-1], all_lines)


def launch_env(device: str, threads: int) -> dict[str, str]:
    """The variables a launch sets on top of the caller's environment (recorded in env.json)."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if device == "cpu":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback: no dependence on the machine's network setup
    return env


class CappedLog(threading.Thread):
    """Copies a launch's pipe into its log file: the first LOG_HEAD_BYTES as they come (a reader of the log
    sees them live), then only the last LOG_TAIL_BYTES, written at the end after a line saying how much was
    left out. The pipe is drained to its end whatever the file does (a full disk), so the launch never
    blocks on its output. Used as a context: leaving it waits (at most LOG_DRAIN_S) for the pipe's end."""

    def __init__(self, pipe, path: Path):
        super().__init__(daemon=True, name=f"log {path.name}")
        self.pipe, self.path = pipe, path
        self.start()

    def run(self) -> None:
        head, tail, dropped = 0, bytearray(), 0
        try:  # unbuffered: a write the disk refuses is dropped then, never again when the file closes
            f = open(self.path, "wb", buffering=0)
        except OSError:  # a full disk: the pipe is drained all the same (the launcher says why it stops)
            f = open(os.devnull, "wb", buffering=0)
        with f:
            for chunk in iter(lambda: self.pipe.read1(1 << 16), b""):
                keep = chunk[:max(0, LOG_HEAD_BYTES - head)]
                head += len(keep)
                tail += chunk[len(keep):]
                if len(tail) > LOG_TAIL_BYTES:
                    dropped += len(tail) - LOG_TAIL_BYTES
                    del tail[:-LOG_TAIL_BYTES]
                if keep:
                    _write(f, keep)
            if dropped:
                _write(f, f"\n[bench: {dropped} bytes of this output left out here (LOG_HEAD_BYTES="
                          f"{LOG_HEAD_BYTES}, LOG_TAIL_BYTES={LOG_TAIL_BYTES}, bench/run/launch.py); its "
                          f"last {LOG_TAIL_BYTES} bytes follow]\n".encode())
            _write(f, bytes(tail))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # the pipe ends when the launch's last process does (they have been stopped by now); a process that
        # somehow still holds it costs the log's end, never the launcher's progress
        self.join(timeout=LOG_DRAIN_S)


def _write(f, data: bytes) -> None:
    """Write and flush; a failed write (disk full, read-only) loses only log text, never the launch."""
    try:
        f.write(data)
        f.flush()
    except OSError:
        pass


@dataclass
class SweepStats:
    """Totals over the recorded cells, for the launcher's overhead figure."""

    cells: int = 0
    wall_s: float = 0.0     # from launch start (or the previous finish) to each finish
    steps_s: float = 0.0    # inside the cells' step loops
    timed_s: float = 0.0    # inside their timed steps
    launches: int = 0


def launch_schedule(world_sizes: list[int], launches: int, seed: int,
                    in_order: bool = False) -> list[tuple[int, int]]:
    """(world size, repeat) of every launch of a sweep: run.launches per world size, in an order shuffled
    with the run's seed, so that a drift of the machine over the run lands on every world size and repeat
    alike (Google Benchmark's random interleaving of repetitions). One launch each, or `in_order` (a
    `race` search: a world size's eliminations carry over to the larger ones): the world sizes in order,
    each one's launches in a row."""
    schedule = [(ws, j) for ws in world_sizes for j in range(launches)]
    if launches > 1 and not in_order:
        random.Random(seed).shuffle(schedule)
    return schedule


class Sweep:
    """Runs cells group by group, one launch at a time, and records every outcome in the run folder: a cell
    is measured in run.launches launches (bench/run/merge.py merges them into its row)."""

    def __init__(self, config: BenchConfig, run_dir: Path, progress: Progress, fresh: set[str] = frozenset(),
                 gpus: int = 0):
        self.config, self.run_dir, self.progress = config, run_dir, progress
        self.gpus = gpus  # the node's GPUs a CUDA run packs its smaller world sizes into (run.pack)
        self.stats = SweepStats()
        self.records = LaunchRecords(run_dir, config, fresh)
        self.restarts: Counter = Counter()  # world size → launches relaunched after a worker was killed
        self.carried_s = 0.0  # timed-rounds budget the launches so far left unspent (worker.cell.Budget)
        # the run's and its launches' parts of the cost anatomy (schema.ANATOMY_PARTS); the cells' are in rows
        self.anatomy: dict[str, float] = {}
        self.launch_anatomy: list[dict] = []
        self.first_spawn: float | None = None  # perf_counter() at the first launch's start
        (run_dir / run_folder.LOGS).mkdir(parents=True, exist_ok=True)
        # A resumed run keeps the earlier launches' logs: number the new ones after them.
        self.first_launch = len(list((run_dir / run_folder.LOGS).glob(run_folder.launch_file("*", "cmd"))))

    def record(self, cell: Cell, launch: Launch, status: str, error: str | None, row: dict | None = None,
               nccl_transport: str | None = None) -> None:
        t0 = time.perf_counter()
        record = self.records.outcome(cell, launch.repeat, launch.passes, status, error, row, nccl_transport)
        schema.anatomy_add(self.anatomy, "writing", time.perf_counter() - t0)
        self.finish(record)

    def finish(self, record: dict) -> None:
        """One measurement done; a cell ended before its last launch (a failure, a race's elimination) takes
        its launches still to come off the progress bar's total."""
        if record["status"] not in MEASURED:
            self.progress.total -= self.config.run.launches - len(record.get("launch_rows") or [None])
        self.progress.finish(summary_line(record))

    def measurements(self, cells: list[Cell]) -> int:
        """The (cell, launch) measurements still to run: what the progress bar counts."""
        return sum(self.records.needs(c, j) for c in cells for j in range(self.config.run.launches))

    def run(self, cells: list[Cell]) -> SweepStats:
        r = self.config.run
        by_ws = by_launch(cells)
        in_order = search(r.search).carries_over  # smaller world sizes' eliminations carry over
        for ws, j in launch_schedule(list(by_ws), r.launches, r.seed, in_order):
            if in_order and j == 0:
                by_ws[ws] = self.carry_over(by_ws[ws])
            pending = [c for c in by_ws[ws] if self.records.needs(c, j)]
            if r.launches > 1:  # no group always first in its launch, right after start-up
                random.Random(f"{r.seed}-{ws}-{j}").shuffle(pending)
            if pending:
                self.run_lanes(ws, j, pending)
            self.records.remerge(by_ws[ws])  # the family's prior has the launch's cells now
        return self.stats

    def lanes(self, ws: int, j: int, pending: list[Cell]) -> list[tuple[Slot, list[Cell]]]:
        """(slot, its share of `pending`) for each launch of world size `ws` that runs at once: one with
        every cell, or, packed (run.pack: bench/run/packing.py), a share of whole groups per slot, the
        shares rotated over the slots by the repeat `j` so that each meets other GPUs."""
        r = self.config.run
        slots = packing.slots(r.pack, r.device, ws, self.gpus, r.threads_per_rank)
        if len(slots) == 1:
            return [(slots[0], pending)]
        from bench.run.estimate import slot_shares

        shares = slot_shares(self.config, pending, len(slots))
        # `of`: the launches that do run at once (fewer than the slots when there are fewer groups)
        return [(replace(slots[(i + j) % len(slots)], of=len(shares)), share)
                for i, share in enumerate(shares)]

    def run_lanes(self, ws: int, j: int, pending: list[Cell]) -> None:
        """The launches of world size `ws`, repeat `j`: each lane (`lanes`) runs its launch, then relaunches
        for the cells a stopped or failed launch left, until none is left; the lanes at once, followed in one
        loop (one thread: records and progress are written by it alone). The timed-rounds budget carried
        in is split evenly over the lanes, and what each leaves is summed."""
        lanes = self.lanes(ws, j, pending)
        carried_in, self.carried_s = self.carried_s / len(lanes), 0.0
        live: list[Launch] = []

        def begin(slot: Slot, cells: list[Cell], to_profile: list[Cell], carried_s: float) -> None:
            launch = Launch(self, ws, cells, to_profile, self.first_launch + self.stats.launches, j, slot,
                            carried_s)
            self.stats.launches += 1
            if self.first_spawn is None:
                self.first_spawn = time.perf_counter()
            launch.start()
            live.append(launch)

        try:
            for slot, share in lanes:
                begin(slot, share, [], carried_in)
            while live:
                time.sleep(POLL_S)
                for launch in [x for x in live if not x.poll()]:
                    live.remove(launch)
                    left = launch.end()
                    if left:  # cells timed in a launch that was stopped early are profiled by the next one
                        begin(launch.slot, left, list(launch.untraced.values()), launch.carried_s)
                        continue
                    self.carried_s += launch.carried_s
                    self.untraced_note(ws, launch)
        except BaseException:  # Ctrl-C / SIGTERM: stop every launch and leave nothing behind
            for launch in live:
                launch.abort()
            raise

    def untraced_note(self, ws: int, launch: Launch) -> None:
        """A lane's last launch: say which of its cells have no traces, and why."""
        if not launch.untraced:
            return
        failed = {c: why for c, why in launch.profile_errors.items() if c in launch.untraced}
        ended = len(launch.untraced) - len(failed)
        for cell_id, why in failed.items():
            self.progress.note(f"no traces for {cell_id}: its profiled pass failed ({why}; row kept)")
        if ended:
            self.progress.note(f"no traces for {ended} cell(s) of world size {ws}: their launch "
                               "ended before their profiled pass (rows kept)")

    def carry_over(self, cells: list[Cell]) -> list[Cell]:
        """A `race` search, world sizes smallest first: the cells of one world size whose configuration a
        smaller one raced out in every recipe (race.not_launched) are recorded raced_out, with that
        comparison, and not launched; returns the rest."""
        records = list(self.records.latest.values())
        keep = []
        for cell in cells:
            source = race.not_launched(cell, records)
            if source is None:
                keep.append(cell)
                continue
            why = race.not_launched_reason(cell, source)
            copied = {k: source.get(k) for k in RACE_COLUMNS}
            record = results.make_record(cell, self.config, "raced_out", why, measured=copied)
            self.records.write([record])
            self.finish(record)
            if self.config.profile.covers(cell.cell_id):
                self.progress.drop_pass()
        return keep

    def profile_list(self, cells: list[Cell]) -> list[Cell]:
        """The cells whose profiled pass a launch runs after its timed steps."""
        return [c for c in cells if self.config.profile.covers(c.cell_id)]


class Launch:
    """One torchrun launch over the pending cells of one world size: start it, follow its events, stop it
    when a group stops making progress, and say which cells are still to run when it ends."""

    def __init__(self, sweep: Sweep, ws: int, pending: list[Cell], carried: list[Cell], k: int,
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
        write_plan(plan_path, self.config, self.sweep.run_dir, self.pending, launcher_pid=os.getpid(),
                   profile=self.to_profile, passes=self.passes,
                   carried_s=self.carried_s, slot=self.slot)
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
        """The launch's parts of the cost anatomy (schema.ANATOMY_PARTS) from its events' times: spawn (to the
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
        schema.anatomy_add(self.sweep.anatomy, "writing", time.perf_counter() - t0)

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


def write_plan(path: Path, config: BenchConfig, run_dir: Path, cells: list[Cell], launcher_pid: int | None,
               profile: list[Cell], passes: Passes = PASSES, carried_s: float = 0.0,
               slot: Slot = ALONE, slots: dict[int, list[list[str]]] | None = None) -> None:
    """The worker's input: resolved config, the cells to time, the cells to profile after them, the
    launcher to watch for (None: the user's own torchrun/srun), the passes the launch runs (bench.schema
    PASSES; a repeat launch of run.launches REPEAT_PASSES), the timed-rounds budget earlier launches
    left unspent (worker.cell.Budget), and the slot it runs in (packing.Slot.facts: into every row); a
    plan run's packed world sizes (`slots`: per world size, each launch's cell ids; bench slurm)."""
    plan = {"run_dir": str(run_dir.resolve()), "config": config.to_dict(),
            "cells": [c.to_dict() for c in cells], "profile": [c.to_dict() for c in profile],
            "launcher_pid": launcher_pid, "passes": list(passes), "carried_s": carried_s,
            "slot": slot.facts()}
    if slots:
        plan["slots"] = {str(ws): shares for ws, shares in slots.items()}
    path.write_text(json.dumps(plan, indent=1))


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
