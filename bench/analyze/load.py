"""Open one Chrome-trace file (Kineto/torch.profiler JSON, optionally gzipped) into compact columns.

Only complete events (`"ph": "X"`) carry durations; they are all the analysis needs. Each is kept as one
row of parallel numpy arrays (ts and dur in microseconds, as the file has them) and the few `args` the
analysis reads are pulled out in the same pass, so the parsed dicts can be freed at once and memory stays a
small multiple of the file. A file that cannot be read raises TraceError with one line naming the file and
the reason; the caller reports it and goes on with the other files.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Args the analysis reads, by the name Kineto gives them.
ARG_CORRELATION = "correlation"
ARG_BLOCKS_PER_SM = "blocks per SM"
ARG_OCCUPANCY = "est. achieved occupancy %"
# Events whose args describe a collective's message (see classify.COLLECTIVE_ARGS_EVENT / HOST_COLLECTIVE).
COMM_ARG_KEYS = ("Collective name", "dtype", "In msg nelems", "Group size", "Input Dims", "Input type")


class TraceError(Exception):
    """A trace file that cannot be analysed (unreadable, corrupt, not a Chrome trace)."""


@dataclass
class Trace:
    """One trace file's complete events as parallel arrays, plus its top-level metadata."""

    path: Path
    meta: dict                    # top-level keys other than traceEvents (distributedInfo, deviceProperties…)
    name: np.ndarray              # object: event name
    cat: np.ndarray               # object: category, lower-cased ("kernel", "cpu_op", "user_annotation"…)
    pid: np.ndarray               # object: process id as written (an int, or a string for spans)
    tid: np.ndarray               # object: thread id (for GPU events: the stream)
    ts: np.ndarray                # float64 µs
    dur: np.ndarray               # float64 µs
    correlation: np.ndarray       # float64, NaN when absent: links a runtime launch to its GPU event
    blocks_per_sm: np.ndarray     # float64, NaN when absent (kernels)
    occupancy: np.ndarray         # float64, NaN when absent (kernels)
    comm_args: dict[int, dict] = field(default_factory=dict)   # row → args, for collective-describing events
    thread_names: dict = field(default_factory=dict)          # (pid, tid) → thread name from metadata

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def __len__(self) -> int:
        return len(self.ts)


def _read_text(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip (by its magic number, not its name)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:  # truncated: EOFError; corrupt: BadGzipFile, zlib.error
        raise TraceError(f"{path}: corrupt or truncated gzip: {exc}") from exc


def load_trace(path: str | Path) -> Trace:
    """Parse one Chrome-trace file (`*.json` or `*.json.gz`) into a Trace; TraceError when it cannot be."""
    path = Path(path)
    text = _read_text(path)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not valid JSON: {exc}") from exc
    del text
    if isinstance(doc, list):  # the Chrome trace format also allows a bare array of events
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Chrome trace: no 'traceEvents' list")
    events = doc.pop("traceEvents")
    return _columns(path, doc, events)


def _num(value) -> float:
    """A numeric arg as float, NaN when absent or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan


def _columns(path: Path, meta: dict, events: list) -> Trace:
    names, cats, pids, tids, ts, dur, corr, bps, occ = [], [], [], [], [], [], [], [], []
    comm_args, thread_names = {}, {}
    interned: dict[str, str] = {}  # one string object per distinct name: millions of events, few names
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "thread_name":
                thread_names[(e.get("pid"), e.get("tid"))] = (e.get("args") or {}).get("name", "")
            continue
        if ph != "X":
            continue
        start, length = e.get("ts"), e.get("dur")
        if not isinstance(start, (int, float)) or not isinstance(length, (int, float)):
            continue  # a complete event without times cannot be placed
        name = e.get("name", "")
        name = interned.setdefault(name, name) if isinstance(name, str) else str(name)
        cat = e.get("cat") or ""
        cat = interned.setdefault(cat, cat.lower())
        args = e.get("args") or {}
        row = len(ts)
        names.append(name)
        cats.append(cat)
        pids.append(e.get("pid"))
        tids.append(e.get("tid"))
        ts.append(start)
        dur.append(length)
        corr.append(_num(args.get(ARG_CORRELATION)))
        bps.append(_num(args.get(ARG_BLOCKS_PER_SM)))
        occ.append(_num(args.get(ARG_OCCUPANCY)))
        if any(k in args for k in COMM_ARG_KEYS):
            comm_args[row] = {k: args[k] for k in COMM_ARG_KEYS if k in args}
    as_obj = lambda xs: np.array(xs, dtype=object) if xs else np.empty(0, dtype=object)
    return Trace(
        path=path, meta=meta, name=as_obj(names), cat=as_obj(cats), pid=as_obj(pids), tid=as_obj(tids),
        ts=np.asarray(ts, dtype=np.float64), dur=np.asarray(dur, dtype=np.float64),
        correlation=np.asarray(corr, dtype=np.float64), blocks_per_sm=np.asarray(bps, dtype=np.float64),
        occupancy=np.asarray(occ, dtype=np.float64), comm_args=comm_args, thread_names=thread_names,
    )


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def trace_rank(trace: Trace) -> int | None:
    """The rank: `distributedInfo.rank` in the trace, else `rank<N>` in the file name, else None."""
    info = trace.meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    m = _RANK_IN_NAME.search(trace.path.name)
    return int(m.group(1)) if m else None


def find_trace_files(folder: Path) -> list[Path]:
    """Every `*.json` / `*.json.gz` file under `folder` (recursively), sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
