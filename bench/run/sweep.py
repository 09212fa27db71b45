"""The sweep: a run's cells launch by launch, world size by world size, in the scheduler's order
(bench/run/schedule.py), each launch's lanes at once (packed: bench/run/packing.py), every outcome recorded
in the run folder (bench/run/merge.py LaunchRecords); one Launch (bench/run/launch.py) per torchrun.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench import anatomy, race, run_folder
from bench.config import BenchConfig
from bench.matrix import Cell, by_launch
from bench.run import packing, results, schedule
from bench.run.launch import Launch
from bench.run.merge import MEASURED, LaunchRecords
from bench.run.packing import Slot
from bench.run.progress import Progress, summary_line
from bench.schema import RACE_COLUMNS, search

POLL_S = 0.05          # events-file poll period


@dataclass
class SweepStats:
    """Totals over the recorded cells, for the launcher's overhead figure."""

    cells: int = 0
    wall_s: float = 0.0     # from launch start (or the previous finish) to each finish
    steps_s: float = 0.0    # inside the cells' step loops
    timed_s: float = 0.0    # inside their timed steps
    launches: int = 0


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
        self.carried_s = 0.0  # timed-rounds budget the launches so far left unspent (worker.rounds.Budget)
        # the run's and its launches' parts of the cost anatomy (anatomy.PARTS); the cells' are in rows
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
        anatomy.add(self.anatomy, "writing", time.perf_counter() - t0)
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
        for ws, j in schedule.launch_order(list(by_ws), r.launches, r.seed, in_order):
            if in_order and j == 0:
                by_ws[ws] = self.carry_over(by_ws[ws])
            pending = schedule.launch_cells([c for c in by_ws[ws] if self.records.needs(c, j)], r.seed, ws,
                                            j, r.launches)
            if pending:
                self.run_lanes(ws, j, pending)
            self.records.remerge(by_ws[ws])  # the family's prior has the launch's cells now
        return self.stats

    def lanes(self, ws: int, j: int, pending: list[Cell]) -> list[tuple[Slot, list[Cell]]]:
        """(slot, its share of `pending`) for each launch of world size `ws` that runs at once: one with
        every cell, or, packed (run.pack: bench/run/packing.py), a share of whole groups per slot, rotated
        over the slots by the repeat `j` (bench/run/schedule.py lanes)."""
        r = self.config.run
        slots = packing.slots(r.pack, r.device, ws, self.gpus, r.threads_per_rank)
        if len(slots) == 1:
            return [(slots[0], pending)]
        from bench.run.estimate import slot_shares

        return schedule.lanes(slots, slot_shares(self.config, pending, len(slots)), j)

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
