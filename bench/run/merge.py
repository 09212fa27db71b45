"""A cell measured in several launches (run.launches) as one row: each launch's outcome kept, their steps
pooled, and the step-time columns recomputed over the launches with the two-level interval
(bench/run/between.py), moderated over the cells of the same world size (the family measured in the same
launches).

A record's `launch_rows` holds one entry per launch that ran the cell, in the order they ran: {launch,
passes, status, error, n_steps, n_warmup, n_ratios, nccl_transport, row}, where `row` is that launch's
measured row without its lists; the lists (`step_times_ms`, `warmup_times_ms`, `speed_vs_torch_ratios`) are
the record's own, the launches' concatenated in that order (n_* say where each launch's part ends), and
`passes` the names of the passes that launch ran (bench.schema.Passes; a folder written before it kept a
`full` boolean instead, still read: `passes_of`).

The merged row: the first launch of a world size (the one whose Passes gives every column: it also ran the
phase, probe and memory passes and the profiler) gives every column the others do not measure; over the
launches that measured the cell come the step time (exp of the mean of the launches' log medians) and its
interval, `between_launch_cv_pct`, `launches`, throughputs at that step time, p90/mean/min/std over the pooled
steps, the pooled speed_vs_torch (its rounds are pairs in every launch), the compute-only time the same way as
the step (every launch runs its compute-only rounds) and exposed communication as their difference, so step,
compute-only and exposed communication come from the same launches and add up, the longest warm-up found, the
outlier steps summed, and the wall times summed. A launch that failed ends the cell: its status and error
(naming the launch) are the cell's, the launches before it stay in `launch_rows`. A racing search's
elimination (raced_out) ends the cell the same way, its row the rounds of the launch that eliminated it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from bench import anatomy, metrics, stats
from bench.run import between, results
from bench.schema import PASSES, REPEAT_PASSES, Passes

MEASURED = ("ok", "diverged")  # a launch's outcomes that carry steps (diverged: measured, ranks differ)
LISTS = ("step_times_ms", "warmup_times_ms", "speed_vs_torch_ratios")
# Columns proportional to 1 / step time: recomputed at the merged step time from the base row's value.
PER_STEP_TIME = ("tokens_per_s", "model_tflops_per_s", "mfu")
WALL = ("cell_wall_s", "steps_wall_s")  # the cell's cost: summed over its launches


def launch_entry(launch: int, passes: Passes, status: str, error: str | None, row: dict | None,
                 nccl_transport: str | None) -> tuple[dict, dict[str, list]]:
    """One launch's outcome for a cell → (its `launch_rows` entry, its lists to append to the record's).
    `passes`: what the launch ran (its names kept in the entry)."""
    row = dict(row or {})
    lists = {key: list(row.pop(key, None) or []) for key in LISTS}
    entry = {"launch": launch, "passes": list(passes), "status": status, "error": error,
             "n_steps": len(lists["step_times_ms"]),
             "n_warmup": len(lists["warmup_times_ms"]), "n_ratios": len(lists["speed_vs_torch_ratios"]),
             "nccl_transport": nccl_transport, "row": row}
    return entry, lists


def passes_of(entry: dict) -> Passes:
    """The passes a `launch_rows` entry's launch ran: its `passes`, or, in a record written before they were
    kept, its `full` boolean (True: every pass; a resumed older folder's records are merged again)."""
    if "passes" in entry:
        return Passes(tuple(entry["passes"]))
    return PASSES if entry.get("full") else REPEAT_PASSES


def base_entry(entries: list[dict]) -> dict:
    """The measured entry whose row gives the columns a repeat launch does not measure: the first whose
    launch ran every pass, else the first measured."""
    measured = [e for e in entries if e["status"] in MEASURED]
    return next((e for e in measured if passes_of(e).gives_every_column), measured[0])


def split(entries: list[dict], pooled: list, count: str) -> list[list]:
    """The pooled list cut back into each launch's part (`count`: the entries' n_steps, n_warmup, ...)."""
    out, at = [], 0
    for entry in entries:
        out.append(pooled[at:at + entry[count]])
        at += entry[count]
    return out


def compute_only_parts(entries: list[dict]) -> list[list[float]]:
    """Each launch's compute-only rounds (per round the slowest rank: as the row's compute_only_ms_p50 is),
    from its row's `compute_only_ms_per_rank` (empty where a launch ran none)."""
    return [metrics.step_times_over_ranks(e["row"].get("compute_only_ms_per_rank") or []) for e in entries]


def spread_from(entries: list[dict], parts: list[list[float]]) -> between.Spread | None:
    """The between-launch Spread of one series (a launch's part: its samples) from the launches that
    measured the cell and have samples of it (their own medians and intervals, by launch), or None."""
    measured = [(e, p) for e, p in zip(entries, parts) if e["status"] in MEASURED and p]
    medians = [metrics.percentile(p, 50) for _, p in measured]
    intervals = [stats.median_ci(p) for _, p in measured]
    return between.spread(medians, [i[0] for i in intervals], [i[1] for i in intervals],
                          [e["launch"] for e, _ in measured])


def spread_of(entries: list[dict], step_times: list[float]) -> between.Spread | None:
    """The cell's between-launch Spread of its step times (the record's pooled list cut by launch)."""
    return spread_from(entries, split(entries, step_times, "n_steps"))


def family_of(records: Iterable[dict], series: str = "step") -> between.Family | None:
    """The family (between.fit_family) of one world size's measured records: of their step times, or
    (series "compute_only") of their compute-only rounds."""
    def spread(r):
        if series == "compute_only":
            return spread_from(r["launch_rows"], compute_only_parts(r["launch_rows"]))
        return spread_of(r["launch_rows"], r.get("step_times_ms") or [])

    return between.fit_family([spread(r) for r in records if r.get("status") in MEASURED
                               and r.get("launch_rows")])


def half_width(low: float | None, high: float | None) -> float | None:
    return None if low is None or high is None else (high - low) / 2


def merged_compute_only(entries: list[dict], step_p50: float, step_low: float | None,
                        step_high: float | None, family: between.Family | None) -> dict:
    """compute_only_ms_p50 over the launches (the geometric mean of their medians, as the step's) and
    exposed communication from the same launches: merged step − merged compute-only, so the two add up to
    the step in every table, bar and projection. Its interval: the two half-widths added in quadrature (as if
    independent: a launch that slows both moves them together, so it is on the wide side). Empty when no
    launch ran compute-only rounds."""
    spread = spread_from(entries, compute_only_parts(entries))
    if spread is None:
        return {}
    combined = between.combine(spread, family)
    center = combined.center
    exposed = metrics.exposed_comm_ms(step_p50, center)
    a, b = half_width(step_low, step_high), half_width(combined.low, combined.high)
    spread_ms = None if a is None or b is None else math.hypot(a, b)
    return {"compute_only_ms_p50": center, "exposed_comm_ms": exposed,
            "exposed_comm_ms_ci95_low": None if spread_ms is None else exposed - spread_ms,
            "exposed_comm_ms_ci95_high": None if spread_ms is None else exposed + spread_ms}


def merged_row(entries: list[dict], lists: dict[str, list], global_batch: int,
               family: between.Family | None, compute_family: between.Family | None = None) -> dict:
    """The measured part of the cell's row over its launches (module docstring); `lists` are the record's
    pooled lists; `compute_family` the world size's family of compute-only rounds. Columns the launches did
    not measure stay as the base row (`base_entry`) gives them."""
    measured = [i for i, e in enumerate(entries) if e["status"] in MEASURED]
    base = base_entry(entries)["row"]
    row = dict(base) | {key: list(values) for key, values in lists.items()}
    steps = [p for i, p in enumerate(split(entries, lists["step_times_ms"], "n_steps")) if i in measured]
    rows = [entries[i]["row"] for i in measured]
    pooled = [x for part in steps for x in part]
    row["launches"] = len(measured)
    row["warmup_steps_detected"] = max((r.get("warmup_steps_detected") or 0 for r in rows), default=0)
    outliers = [r.get("outlier_steps") for r in rows]
    row["outlier_steps"] = None if None in outliers else sum(outliers)
    for key in WALL:
        row[key] = sum(r.get(key) or 0.0 for r in rows)
    row["anatomy_s"] = anatomy.total(r.get("anatomy_s") or {} for r in rows)  # summed, as WALL
    spread = spread_of(entries, lists["step_times_ms"])
    if len(measured) == 1 or spread is None:  # one launch, or no steps to merge: its own row
        return row | {"between_launch_cv_pct": None}
    combined = between.combine(spread, family)
    p50 = combined.center
    row |= {"step_time_ms_p50": p50, "step_time_ms_ci95_low": combined.low,
            "step_time_ms_ci95_high": combined.high,
            "step_time_half_width_pct": stats.half_width_pct(p50, combined.low, combined.high),
            "between_launch_cv_pct": combined.cv_pct, "n_timed_steps": len(pooled),
            "step_time_ms_p90": metrics.percentile(pooled, 90),
            "step_time_ms_mean": sum(pooled) / len(pooled),
            "step_time_ms_min": min(pooled), "step_time_ms_std": _std(pooled),
            "samples_per_s": metrics.throughput(global_batch, p50),
            "rank_skew_ms_p50": metrics.percentile([r["rank_skew_ms_p50"] for r in rows
                                                    if r.get("rank_skew_ms_p50") is not None], 50),
            "stopped_by": _most_common(r.get("stopped_by") for r in rows),
            "slowest_rank": _most_common(r.get("slowest_rank") for r in rows)}
    row |= merged_compute_only(entries, p50, combined.low, combined.high, compute_family)
    for key in PER_STEP_TIME:
        value, base_p50 = base.get(key), base.get("step_time_ms_p50")
        row[key] = None if value is None or not base_p50 else value * base_p50 / p50
    ratio_parts = [p for i, p in enumerate(split(entries, lists["speed_vs_torch_ratios"], "n_ratios"))
                   if i in measured]
    if all(ratio_parts):  # paired with torch in every launch: the launches' rounds pooled
        row |= stats.speed_vs_torch_columns([x for part in ratio_parts for x in part])
    return row


def profiled_s(record: dict) -> float | None:
    """The seconds of the record's profiled pass (its anatomy's `profile` part), None before it ran."""
    return (record.get("anatomy_s") or {}).get("profile")


def with_profile(record: dict, profile_s: float | None) -> dict:
    """The record with its profiled pass's seconds as its anatomy's `profile` part (set, not added: a record
    merged again keeps the one figure)."""
    if profile_s is None:
        return record
    parts = {k: v for k, v in (record.get("anatomy_s") or {}).items() if k != "profile"}
    return record | {"anatomy_s": anatomy.total([parts, {"profile": profile_s}])}


def merged_status(entries: list[dict], total: int) -> tuple[str, str | None]:
    """The cell's status and error over its launches: the first failure's (naming its launch: "launch 2 of
    3: ..."), else diverged when any launch diverged, else ok."""
    for i, entry in enumerate(entries):
        if entry["status"] not in MEASURED:
            return entry["status"], _in_launch(i, total, entry["error"])
    for i, entry in enumerate(entries):
        if entry["status"] == "diverged":
            return "diverged", _in_launch(i, total, entry["error"])
    return "ok", None


def _in_launch(i: int, total: int, error: str | None) -> str | None:
    return error if total == 1 or error is None else f"launch {i + 1} of {total}: {error}"


def _std(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _most_common(values: Iterable):
    counts = Counter(v for v in values if v is not None)
    return counts.most_common(1)[0][0] if counts else None


class LaunchRecords:
    """The latest record of every cell of a sweep, kept in memory and written through to cells.jsonl: each
    launch's outcome for a cell becomes a new merged record (the latest line wins), and at the end of a
    launch the cells of its world size are merged again under their family's updated prior."""

    def __init__(self, run_dir, config, fresh: Iterable[str] = ()):
        """`fresh`: cells measured again from scratch (a --retry of their earlier failure): their old
        records do not count."""
        self.run_dir, self.config, self.results = run_dir, config, results
        skip = set(fresh)
        self.latest = {r["cell_id"]: r for r in results.read_records(run_dir) if r["cell_id"] not in skip}

    @property
    def launches(self) -> int:
        return self.config.run.launches

    def needs(self, cell, launch: int) -> bool:
        """Whether `cell` still needs launch `launch`: not measured there, and not ended by a failure."""
        record = self.latest.get(cell.cell_id)
        if record is None:
            return True
        entries = record.get("launch_rows") or [{"launch": 0, "status": record["status"]}]
        if any(e["status"] not in MEASURED for e in entries):
            return False
        return all(e["launch"] != launch for e in entries)

    def outcome(self, cell, launch: int, passes: Passes, status: str, error: str | None, row: dict | None,
                nccl_transport: str | None = None) -> dict:
        """Record one launch's outcome for `cell`; returns the cell's new merged record."""
        previous = self.latest.get(cell.cell_id) or {}
        entries = list(previous.get("launch_rows") or [])
        lists = {key: list(previous.get(key) or []) for key in LISTS}
        entry, new = launch_entry(launch, passes, status, error, row, nccl_transport)
        entries.append(entry)
        for key in LISTS:
            lists[key] += new[key]
        record = self.merged(cell, entries, lists, previous.get("trace_dir"), profiled_s(previous))
        self.write([record])
        return record

    def merged(self, cell, entries: list[dict], lists: dict[str, list], trace_dir: str | None,
               profile_s: float | None = None) -> dict:
        """The cell's record from its launches' entries and pooled lists, under its family's prior; its
        profiled pass's seconds (`profile_s`, recorded with its traces) kept in its anatomy."""
        return with_profile(self._merged(cell, entries, lists, trace_dir), profile_s)

    def _merged(self, cell, entries: list[dict], lists: dict[str, list], trace_dir: str | None) -> dict:
        status, error = merged_status(entries, self.launches)
        if status not in MEASURED:  # a failure ends the cell: no row; the launches before it stay listed.
            # A race's elimination ends it too, keeping the rounds it was compared on (that launch's row)
            ended = next(e for e in entries if e["status"] not in MEASURED)
            kept = ended["row"] | lists if status == "raced_out" else None
            record = self.results.make_record(cell, self.config, status, error, measured=kept)
            return record | {"launch_rows": entries} | lists
        family = [r for r in self.latest.values()
                  if r["cell_id"] != cell.cell_id and r.get("world_size") == cell.world_size]
        members = family + [{"status": "ok", "launch_rows": entries} | lists]
        row = merged_row(entries, lists, cell.global_batch, family_of(members),
                         family_of(members, "compute_only"))
        record = self.results.make_record(cell, self.config, status, error,
                                          measured=row | {"launch_rows": entries})
        return record | {"nccl_transport": base_entry(entries)["nccl_transport"], "trace_dir": trace_dir}

    def remerge(self, cells) -> None:
        """Merge `cells` (one world size's) again under their family's prior now; write the records whose
        values changed."""
        changed = []
        for cell in cells:
            record = self.latest.get(cell.cell_id)
            if not record or not record.get("launch_rows"):
                continue
            again = self.merged(cell, record["launch_rows"], {k: record.get(k) or [] for k in LISTS},
                                record.get("trace_dir"), profiled_s(record))
            if again != record:
                changed.append(again)
        self.write(changed)

    def with_traces(self, cell_id: str, trace_dir: str, profile_s: float | None = None) -> None:
        """The cell's record again with its profiled pass's trace folder (and its seconds: the anatomy's
        `profile` part)."""
        record = self.latest.get(cell_id)
        if record is not None:
            self.write([with_profile(self.results.record_with_traces(record, trace_dir), profile_s)])

    def write(self, records: list[dict]) -> None:
        if records:
            self.results.append_records(self.run_dir, records)
            for record in records:
                self.latest[record["cell_id"]] = record
