"""The run folder's result files: cells.jsonl (append-only, the source of truth) and results.csv (derived).

A cells.jsonl line holds every RESULT_COLUMNS key (None for what was not measured), `step_times_ms`
(per-step max-over-ranks samples) and `cell` (the cell's full config). results.csv is rewritten from
cells.jsonl after each cell: exactly RESULT_COLUMNS, in order, empty for None.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from bench.matrix import Cell
from bench.schema import RESULT_COLUMNS

CELLS_FILE, CSV_FILE = "cells.jsonl", "results.csv"


def cell_config(cell: Cell, config) -> dict:
    """The cell's full config: its axes plus the workload options and the run's fixed fields."""
    w, r = config.workload, config.run
    return cell.to_dict() | {
        "task": w.task, "data": w.data, "seq_len": w.seq_len, "fixed_length": w.fixed_length,
        "image_size": w.image_size, "device": r.device, "warmup_steps": r.warmup_steps,
        "timed_steps": r.timed_steps, "repeats": r.repeats, "compute_only_steps": r.compute_only_steps,
        "seed": r.seed,
    }


def make_record(cell: Cell, config, status: str, error: str | None = None, measured: dict | None = None,
                backend: str | None = None) -> dict:
    """One cells.jsonl record: the cell's columns, then what the worker measured, then the extras."""
    measured = dict(measured or {})
    step_times = measured.pop("step_times_ms", [])
    row = {col: None for col in RESULT_COLUMNS}
    row.update({
        "cell_id": cell.cell_id, "engine": cell.engine, "model": cell.model, "model_size": cell.model_size,
        "world_size": cell.world_size, "bucket_cap_mb": cell.bucket_cap_mb, "precision": cell.precision,
        "comm_dtype": cell.comm_dtype, "grad_accum": cell.grad_accum, "scaling": cell.scaling,
        "per_rank_batch": cell.per_rank_batch, "global_batch": cell.global_batch,
        "device": config.run.device, "backend": backend,
    })
    row.update({k: v for k, v in measured.items() if k in row})
    if status == "ok" and measured.get("status") == "diverged":
        status = "diverged"  # measured, but the parity check after the timed steps failed
    row["status"] = status
    row["error"] = error or ("parameters differ across ranks after the timed steps"
                             if status == "diverged" else None)
    for key, value in row.items():  # NaN/inf never reach the files: not measured means empty
        if isinstance(value, float) and not math.isfinite(value):
            row[key] = None
    extras = {k: v for k, v in measured.items() if k not in row and k != "status"}
    return row | {"step_times_ms": step_times, "cell": cell_config(cell, config)} | extras


def read_records(run_dir: Path) -> list[dict]:
    """Every complete line of cells.jsonl (a line cut short by a kill is ignored)."""
    path = run_dir / CELLS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def append_record(run_dir: Path, record: dict) -> None:
    """Append one line to cells.jsonl and flush it to disk, then rewrite results.csv."""
    path = run_dir / CELLS_FILE
    # A previous run killed mid-write may have left a partial last line: start on a fresh line.
    needs_newline = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
    with open(path, "a") as f:
        f.write(("\n" if needs_newline else "") + json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    write_csv(run_dir)


def write_csv(run_dir: Path) -> None:
    """results.csv from cells.jsonl: RESULT_COLUMNS in order, None → empty; atomically replaced."""
    tmp = run_dir / (CSV_FILE + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(RESULT_COLUMNS)
        for record in read_records(run_dir):
            writer.writerow(["" if record.get(c) is None else record[c] for c in RESULT_COLUMNS])
    os.replace(tmp, run_dir / CSV_FILE)
