"""Open one Chrome-trace file (Kineto/torch.profiler JSON, optionally gzipped) into compact columns.

Only complete events (`"ph": "X"`) carry durations; they are all the analysis needs. Each is kept as one
row of parallel numpy arrays (ts and dur in microseconds, as the file has them) and the few `args` the
analysis reads are pulled out in the same pass, so the parsed dicts can be freed at once. A file that
cannot be read raises TraceError with one line naming the file and the reason; the caller reports it and
goes on with the other files.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.analyze import classify as C

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
    """One trace file's complete events as parallel arrays, plus its top-level metadata.

    Names, categories and threads are stored once each (`names`, `cats`, `threads`) and referred to by
    integer ids per event: a trace has millions of events but a few thousand distinct names.
    """

    path: Path
    meta: dict                    # top-level keys other than traceEvents (distributedInfo, deviceProperties…)
    names: np.ndarray             # object: the distinct event names
    name_id: np.ndarray           # int32 per event: index into names
    cats: np.ndarray              # object: the distinct categories, lower-cased ("kernel", "cpu_op"…)
    cat_id: np.ndarray            # int32 per event
    threads: list                 # the distinct (pid, tid) pairs (for GPU events tid is the stream)
    tid_id: np.ndarray            # int32 per event: index into threads
    ts: np.ndarray                # float64 µs
    dur: np.ndarray               # float64 µs
    correlation: np.ndarray       # float64, NaN when absent: links a runtime launch to its GPU event
    blocks_per_sm: np.ndarray     # float64, NaN when absent (kernels)
    occupancy: np.ndarray         # float64, NaN when absent (kernels)
    comm_args: dict[int, dict] = field(default_factory=dict)   # row → args, for collective-describing events

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def name_of(self, row: int) -> str:
        return self.names[self.name_id[row]]

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
    raw = _read_text(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text: {exc}") from exc
    del raw
    columns = _Columns()
    try:
        meta = _stream(text, columns.add)
    except (StopIteration, IndexError, ValueError) as exc:  # the scanner's ways of saying "not JSON here"
        raise TraceError(f"{path}: not valid JSON ({type(exc).__name__} at {_where(exc)})") from exc
    if meta is None:
        raise TraceError(f"{path}: not a Chrome trace: no 'traceEvents' list")
    return columns.trace(path, meta)


def _where(exc: Exception) -> str:
    value = exc.value if isinstance(exc, StopIteration) else getattr(exc, "pos", None)
    return f"character {value}" if isinstance(value, int) else str(exc)


_SPACE = re.compile(r"[ \t\n\r]*")


def _stream(text: str, add) -> dict | None:
    """Walk a Chrome trace, handing each element of `traceEvents` to `add` as soon as it is parsed (the
    whole list of dicts is never held), and return the other top-level keys; None without traceEvents.

    The top level is either {"traceEvents": [...], other keys} or a bare [...] of events. Everything else
    is parsed by json's own scanner.
    """
    scan = json.JSONDecoder().scan_once
    skip = lambda pos: _SPACE.match(text, pos).end()

    def events(pos: int) -> int:  # text[pos] == "[": stream the array, return the index after "]"
        pos = skip(pos + 1)
        if text[pos] == "]":
            return pos + 1
        while True:
            event, pos = scan(text, pos)
            add(event)
            pos = skip(pos)
            if text[pos] == "]":
                return pos + 1
            if text[pos] != ",":
                raise ValueError(f"expected ',' or ']' at character {pos}")
            pos = skip(pos + 1)

    pos = skip(0)
    if text[pos] == "[":
        pos = events(pos)
        if skip(pos) != len(text):
            raise ValueError(f"extra data at character {skip(pos)}")
        return {}
    if text[pos] != "{":
        raise ValueError(f"expected an object or an array at character {pos}")
    meta, found = {}, False
    pos = skip(pos + 1)
    while text[pos] != "}":
        key, pos = scan(text, pos)
        pos = skip(pos)
        if not isinstance(key, str) or text[pos] != ":":
            raise ValueError(f"expected a key and ':' at character {pos}")
        pos = skip(pos + 1)
        if key == "traceEvents" and text[pos] == "[":
            pos, found = events(pos), True
        else:
            meta[key], pos = scan(text, pos)
        pos = skip(pos)
        if text[pos] == ",":
            pos = skip(pos + 1)
        elif text[pos] != "}":
            raise ValueError(f"expected ',' or '}}' at character {pos}")
    if skip(pos + 1) != len(text):
        raise ValueError(f"extra data at character {skip(pos + 1)}")
    return meta if found else None


def _num(value) -> float:
    """A numeric arg as float, NaN when absent or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan


_CORRELATED = C.GPU_CATS | C.RUNTIME_CATS | {C.SYNC_CAT}  # the categories whose events carry a correlation id


def _describes_collective(name) -> bool:
    return isinstance(name, str) and (name == C.COLLECTIVE_ARGS_EVENT or bool(C.HOST_COLLECTIVE.match(name)))


class _Columns:
    """Accumulates complete events into column lists, one event at a time."""

    def __init__(self):
        self.name_ids, self.cat_ids, self.tid_ids, self.ts, self.dur = [], [], [], [], []
        self.corr, self.bps, self.occ, self.comm_args = {}, {}, {}, {}
        self.names, self.cats, self.threads = {}, {}, {}  # value → id, in order of first appearance
        self.lowered: dict[int, str] = {}                 # category id → lower-cased category
        self.comm_name: dict[int, bool] = {}              # name id → does this event describe a collective

    def add(self, e) -> None:
        if not isinstance(e, dict) or e.get("ph") != "X":
            return
        start, length = e.get("ts"), e.get("dur")
        if not isinstance(start, (int, float)) or not isinstance(length, (int, float)):
            return  # a complete event without times cannot be placed
        name = e.get("name", "")
        name = name if isinstance(name, str) else str(name)
        nid = self.names.setdefault(name, len(self.names))
        cat = e.get("cat") or ""
        cid = self.cats.setdefault(cat, len(self.cats))
        row = len(self.ts)
        self.name_ids.append(nid)
        self.cat_ids.append(cid)
        self.tid_ids.append(self.threads.setdefault((e.get("pid"), e.get("tid")), len(self.threads)))
        self.ts.append(start)
        self.dur.append(length)
        args = e.get("args")
        if not args:
            return
        lowered = self.lowered.get(cid)
        if lowered is None:
            lowered = self.lowered[cid] = cat.lower() if isinstance(cat, str) else ""
        if lowered in _CORRELATED:
            self.corr[row] = _num(args.get(ARG_CORRELATION))
            if lowered == "kernel":
                self.bps[row] = _num(args.get(ARG_BLOCKS_PER_SM))
                self.occ[row] = _num(args.get(ARG_OCCUPANCY))
            return
        hit = self.comm_name.get(nid)
        if hit is None:
            hit = self.comm_name[nid] = _describes_collective(name)
        if hit:
            self.comm_args[row] = {k: args[k] for k in COMM_ARG_KEYS if k in args}

    def trace(self, path: Path, meta: dict) -> Trace:
        n = len(self.ts)

        def sparse(values: dict) -> np.ndarray:
            out = np.full(n, np.nan)
            if values:
                rows = np.fromiter(values.keys(), dtype=np.int64)
                out[rows] = np.fromiter(values.values(), dtype=np.float64)
            return out

        def distinct(values: list) -> np.ndarray:
            out = np.empty(len(values), dtype=object)
            out[:] = values
            return out

        return Trace(
            path=path, meta=meta, names=distinct(list(self.names)),
            name_id=np.asarray(self.name_ids, dtype=np.int32),
            cats=distinct([str(c).lower() for c in self.cats]),
            cat_id=np.asarray(self.cat_ids, dtype=np.int32),
            threads=list(self.threads), tid_id=np.asarray(self.tid_ids, dtype=np.int32),
            ts=np.asarray(self.ts, dtype=np.float64), dur=np.asarray(self.dur, dtype=np.float64),
            correlation=sparse(self.corr), blocks_per_sm=sparse(self.bps), occupancy=sparse(self.occ),
            comm_args=self.comm_args,
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
