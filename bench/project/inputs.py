"""A run folder's files in the projection's terms: bucket_timeline.csv (`bench analyze`) and
allreduce_sweep.csv (the worker's probe). Both may be absent; a file that is present but breaks its
contract is an InputError naming the file and the column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.project.simulate import Buckets
from bench.schema import WIRE_DTYPES

TIMELINE_FILE = run_folder.BUCKET_TIMELINE
TIMELINE_COLUMNS = ("cell_id", "trace_file", "rank", "step", "engine", "bucket", "bytes", "ready_ms",
                    "comm_start_ms", "comm_end_ms", "backward_ms")
SWEEP_FILE = run_folder.SWEEP
SWEEP_COLUMNS = ("cell_id", "world_size", "backend", "dtype", "size_bytes", "time_us", "algbw_gbps",
                 "busbw_gbps")
# The sweep's dtype words, normalised to the suite's names (torch prints "torch.float32", nccl-tests "float").
DTYPES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
          "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
          "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16"}
COMM_DTYPE_WIRE = {name: w.wire for name, w in WIRE_DTYPES.items()}  # results.csv comm_dtype → wire dtype


class InputError(ValueError):
    """A run file that breaks its contract."""


def _read(path: Path, columns: tuple[str, ...], numeric: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, dtype={"cell_id": str, "trace_file": str, "engine": str, "backend": str,
                                      "dtype": str}, keep_default_na=False, na_values={})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from exc
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing columns {missing}")
    for col in numeric:
        values = pd.to_numeric(df[col].replace("", float("nan")), errors="coerce")
        bad = values.isna() & (df[col].astype(str).str.strip() != "")
        if bad.any():
            raise InputError(f"{path}: column {col!r} holds non-numbers {sorted(set(df.loc[bad, col]))[:3]}")
        df[col] = values
    return df


def read_timeline(run_dir: Path) -> pd.DataFrame | None:
    """bucket_timeline.csv of the run, or None when the run has none (profiling off, not analysed)."""
    path = Path(run_dir) / TIMELINE_FILE
    if not path.is_file():
        return None
    return _read(path, TIMELINE_COLUMNS, ("rank", "bucket", "bytes", "ready_ms", "comm_start_ms",
                                          "comm_end_ms", "backward_ms"))


def read_sweep(run_dir: Path) -> pd.DataFrame | None:
    """allreduce_sweep.csv with `dtype` normalised (DTYPES), or None when the run has none."""
    path = Path(run_dir) / SWEEP_FILE
    if not path.is_file():
        return None
    df = _read(path, SWEEP_COLUMNS, ("world_size", "size_bytes", "time_us", "algbw_gbps", "busbw_gbps"))
    unknown = sorted(set(df["dtype"].str.strip().str.lower()) - set(DTYPES))
    if unknown:
        raise InputError(f"{path}: column 'dtype' holds unknown dtypes {unknown[:3]}; expected one of "
                         f"{sorted(set(DTYPES))}")
    df["dtype"] = df["dtype"].str.strip().str.lower().map(DTYPES)
    return df


@dataclass(frozen=True)
class ReadyTimes:
    """A trace's bucket ready times (fractions of backward, issue order) without their sizes."""

    ready: tuple[float, ...]


def timeline_buckets(timeline: pd.DataFrame | None, cell_id: str) -> Buckets | ReadyTimes | None:
    """The cell's buckets from the trace: per bucket index, the median over ranks and profiled steps of
    ready_ms / backward_ms (clipped to [0, 1]) and of the bytes. Steps whose bucket count differs from the
    most common one (e.g. torch DDP before it rebuilds its buckets) are left out. None: no rows;
    ReadyTimes: the trace recorded no message sizes (the caller takes them from the workload's layout)."""
    if timeline is None:
        return None
    rows = timeline[timeline["cell_id"] == cell_id]
    rows = rows[rows["backward_ms"] > 0]
    if rows.empty:
        return None
    keys = ["trace_file", "rank", "step"]
    counts = rows.groupby(keys)["bucket"].transform("count")
    rows = rows[counts == counts.mode().max()]
    rows = rows.assign(fraction=(rows["ready_ms"] / rows["backward_ms"]).clip(0.0, 1.0))
    per_bucket = rows.groupby("bucket").agg(size=("bytes", "median"), ready=("fraction", "median"))
    per_bucket = per_bucket.sort_index()
    if per_bucket["size"].isna().any():  # a CPU trace without record_shapes has no message sizes
        return ReadyTimes(tuple(float(r) for r in per_bucket["ready"]))
    try:
        return Buckets(tuple(int(round(s)) for s in per_bucket["size"]),
                       tuple(float(r) for r in per_bucket["ready"]), source="trace")
    except ValueError as exc:
        raise InputError(f"{TIMELINE_FILE}: cell {cell_id}: {exc}") from exc
