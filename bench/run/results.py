"""The run folder's result files: cells.jsonl (append-only, the source of truth) and results.csv (derived).

A cells.jsonl line holds every RESULT_COLUMNS key (None for what was not measured), `step_times_ms`
(per-step max-over-ranks samples), `cell` (the cell's full config) and the worker's other keys
(`allreduce_sweep`: the probe's size sweep). results.csv is rewritten from cells.jsonl after each cell:
exactly RESULT_COLUMNS, in order, empty for None; allreduce_sweep.csv (SWEEP_COLUMNS) with it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from bench import run_folder
from bench.matrix import Cell
from bench.schema import (
    CONFIG_KEYS,
    ENGINE_OPTION_NAMES,
    RESULT_COLUMNS,
    ROUND_FIGURES,
    SWEEP_COLUMNS,
    backend_for,
    partial_race_row,
)

# The row's keys the cell, the launcher's config and the event own: a worker's row never overrides them.
RECORD_OWNED = frozenset({"cell_id", "status", "error", "device", "backend", *CONFIG_KEYS,
                          *ENGINE_OPTION_NAMES})

CELLS_FILE, CSV_FILE, SWEEP_FILE = run_folder.CELLS, run_folder.RESULTS, run_folder.SWEEP
read_records = run_folder.read_records  # the one reader of cells.jsonl


def cell_config(cell: Cell, config) -> dict:
    """The cell's full config: its axes plus the workload options and the run's fixed fields."""
    w, r = config.workload, config.run
    return cell.to_dict() | {
        "task": w.task, "data": w.data, "seq_len": w.seq_len, "fixed_length": w.fixed_length,
        "image_size": w.image_size, "device": r.device, "warmup_steps": r.warmup_steps,
        "timed_steps": r.timed_steps, "repeats": r.repeats, "compute_only_steps": r.compute_only_steps,
        "seed": r.seed,
    }


def make_record(cell: Cell, config, status: str, error: str | None = None,
                measured: dict | None = None, launches: int | None = None) -> dict:
    """One cells.jsonl record: the cell's columns, its status and error, then what the worker measured
    (RESULT_COLUMNS first, then `step_times_ms`, `cell` and any extra measured keys). `launches`: those the
    run times every cell in (None: run.launches); a raced_out row of several leaves out its ROUND_FIGURES
    (bench/schema.py partial_race_row)."""
    measured = dict(measured or {})
    step_times = measured.pop("step_times_ms", [])
    row = {col: None for col in RESULT_COLUMNS}
    row.update({key: getattr(cell, key) for key in (*CONFIG_KEYS, *ENGINE_OPTION_NAMES, "micro_batch",
                                                     "micro_splits")})
    row.update({"cell_id": cell.cell_id, "status": status, "error": error,
                "device": config.run.device, "backend": backend_for(config.run.device)})
    row.update({k: v for k, v in measured.items() if k in row and k not in RECORD_OWNED})
    if partial_race_row(status, config.run.launches if launches is None else launches):
        row.update({key: None for key in ROUND_FIGURES})
    for key, value in row.items():  # NaN/inf never reach the files: not measured means empty
        if isinstance(value, float) and not math.isfinite(value):
            row[key] = None
    extras = {k: v for k, v in measured.items() if k not in row}
    return row | {"step_times_ms": step_times, "cell": cell_config(cell, config)} | extras


def record_from_event(cell: Cell, config, event: dict) -> dict:
    """The record of a worker's "finish" (a measurement) or "error" (a failure) event for `cell`, in a run
    by the user's own torchrun or srun (one launch of every cell)."""
    if event["event"] == "finish":
        return make_record(cell, config, event["status"], event.get("error"), measured=event["row"],
                           launches=1)
    if event["event"] == "error":  # a failed group: the same status and error for each of its cells
        return make_record(cell, config, event["status"], event["error"])
    raise ValueError(f"event {event['event']!r} of {cell.cell_id} carries no outcome")


def latest_record(run_dir: Path, cell_id: str) -> dict | None:
    """The cell's current record in cells.jsonl, or None."""
    return next((r for r in read_records(run_dir) if r["cell_id"] == cell_id), None)


def record_with_traces(record: dict, trace_dir: str) -> dict:
    """The same record with its profiled pass's trace folder (relative to the run folder)."""
    return record | {"trace_dir": trace_dir}


def append_record(run_dir: Path, record: dict) -> None:
    """Append one line to cells.jsonl and flush it to disk, then rewrite results.csv."""
    append_records(run_dir, [record])


def append_records(run_dir: Path, records: list[dict]) -> None:
    """Append a line per record to cells.jsonl and flush them to disk, then rewrite results.csv once."""
    path = run_dir / CELLS_FILE
    # A previous run killed mid-write may have left a partial last line: start on a fresh line.
    needs_newline = path.exists() and path.stat().st_size and not _ends_with_newline(path)
    with open(path, "a") as f:
        f.write(("\n" if needs_newline else "") + "".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())
    write_csv(run_dir)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def write_csv(run_dir: Path) -> None:
    """results.csv (RESULT_COLUMNS) and allreduce_sweep.csv (SWEEP_COLUMNS: one line per entry of a
    record's `allreduce_sweep`) from cells.jsonl, None → empty; each atomically replaced."""
    records = read_records(run_dir)
    _write_atomically(run_dir / CSV_FILE, RESULT_COLUMNS, (
        [record.get(c) for c in RESULT_COLUMNS] for record in records))
    _write_atomically(run_dir / SWEEP_FILE, SWEEP_COLUMNS, (
        [(record | point).get(c) for c in SWEEP_COLUMNS]
        for record in records for point in record.get("allreduce_sweep") or []))


def _write_atomically(path: Path, header, rows) -> None:
    """A CSV written beside `path` and renamed over it: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for row in rows:
                writer.writerow([csv_text(value) for value in row])
        os.replace(tmp, path)
    except OSError:  # disk full, read-only: no half-written .tmp left behind; the old file stays whole
        tmp.unlink(missing_ok=True)
        raise


def csv_text(value) -> str | object:
    """A record's value as a CSV writes it: empty for None, true/false for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value
