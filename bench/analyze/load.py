"""Open one Chrome-trace file (Kineto/torch.profiler JSON, optionally gzipped) into compact columns.

Only complete events (`"ph": "X"`) carry durations; they are all the analysis needs. Each is kept as one
row of parallel numpy arrays (ts and dur in microseconds, as the file has them) and the few `args` the
analysis reads are pulled out in the same pass, so the parsed dicts can be freed at once. The file's text
is read a few MB at a time (gunzipped and decoded on the way), never whole: holding a big trace's text
(and its bytes, while decoding) was most of the peak memory. A file that
cannot be read raises TraceError with one line naming the file and the reason; the caller reports it and
goes on with the other files.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.analyze import classify as C

# Args the analysis reads, by the name Kineto gives them.
ARG_CORRELATION = "correlation"
ARG_BLOCKS_PER_SM = "blocks per SM"
ARG_OCCUPANCY = "est. achieved occupancy %"
# Events whose args describe a collective's message (see classify.COLLECTIVE_ARGS_EVENT / HOST_COLLECTIVE).
# Current torch also puts record_param_comms' args on the NCCL kernel itself; `Process Group Name` and `Seq`
# identify the collective across ranks (bench/analyze/collectives.py).
COMM_ARG_KEYS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Input Dims",
                 "Input type", "Process Group Name", "Seq")


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


CHUNK_BYTES = 1 << 22  # bytes read (after gunzip) at a time
AHEAD = 1 << 16        # text kept ahead of a scan (unless the file ends first): no number is cut in two


def _text_chunks(path: Path) -> Iterator[str]:
    """The file's text, CHUNK_BYTES at a time: gunzipped when it is gzip (by its magic number, not its
    name), decoded as UTF-8 incrementally (a character split between two reads is kept whole)."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    with fh:
        zipped = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        stream = gzip.GzipFile(fileobj=fh) if zipped else fh
        decoder = codecs.getincrementaldecoder("utf-8")()
        while True:
            try:
                block = stream.read(CHUNK_BYTES)
            except (EOFError, OSError, zlib.error) as exc:  # truncated: EOFError; corrupt: BadGzipFile, zlib
                if zipped:
                    raise TraceError(f"{path}: corrupt or truncated gzip: {exc}") from exc
                raise TraceError(f"{path}: cannot read: {exc}") from exc
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                raise TraceError(f"{path}: not UTF-8 text: {exc}") from exc
            if text:
                yield text
            if not block:
                return


def load_trace(path: str | Path) -> Trace:
    """Parse one Chrome-trace file (`*.json` or `*.json.gz`) into a Trace; TraceError when it cannot be."""
    path = Path(path)
    columns = _Columns()
    text = _Text(_text_chunks(path))
    try:
        meta = _stream(text, columns.add)
    except (StopIteration, IndexError, ValueError) as exc:  # the scanner's ways of saying "not JSON here"
        raise TraceError(f"{path}: not valid JSON ({type(exc).__name__} at {_where(exc, text)})") from exc
    if meta is None:
        raise TraceError(f"{path}: not a Chrome trace: no 'traceEvents' list")
    return columns.trace(path, meta)


def _where(exc: Exception, text: _Text) -> str:
    value = exc.value if isinstance(exc, StopIteration) else getattr(exc, "pos", None)
    return f"character {text.base + value}" if isinstance(value, int) else str(exc)


_SPACE = re.compile(r"[ \t\n\r]*")


class _Text:
    """The part of a file's text being parsed: `text` starts at character `base` of the file. Scans refill
    it so that at least AHEAD characters (or the rest of the file) lie ahead; a value longer than what is
    held (an event straddling two reads) is retried with the next chunk appended."""

    def __init__(self, chunks: Iterator[str]):
        self.chunks, self.text, self.base, self.eof = chunks, "", 0, False
        self.scan_once = json.JSONDecoder().scan_once

    def _next(self) -> str:
        chunk = next(self.chunks, None)
        if chunk is None:
            self.eof = True
            return ""
        return chunk

    def ensure(self, pos: int) -> int:
        """Keep the text from pos on, with at least AHEAD characters after it unless the file ends first;
        returns pos in the kept text."""
        if self.eof or len(self.text) - pos >= AHEAD:
            return pos
        parts, held = [self.text[pos:]], len(self.text) - pos
        while held < max(CHUNK_BYTES, 2 * AHEAD) and not self.eof:
            parts.append(self._next())
            held += len(parts[-1])
        self.base += pos
        self.text = "".join(parts)
        return 0

    def scan(self, pos: int):
        """(value, end) of the JSON value at pos (pos is valid in the text after ensure)."""
        pos = self.ensure(pos)
        while True:
            try:
                return self.scan_once(self.text, pos)
            except (StopIteration, ValueError):
                if self.eof:
                    raise
                self.text += self._next()  # cut off by the end of what is held: read on, then retry

    def skip(self, pos: int) -> int:
        """The first non-whitespace position at or after pos (len(text) at the file's end)."""
        pos = self.ensure(pos)
        end = _SPACE.match(self.text, pos).end()
        while end == len(self.text) and not self.eof:
            pos = self.ensure(end)
            end = _SPACE.match(self.text, pos).end()
        return end

    def at(self, pos: int) -> str:
        return self.text[pos]  # IndexError past the end: not valid JSON

    def done(self, pos: int) -> bool:
        pos = self.skip(pos)
        return pos == len(self.text) and self.eof


def _stream(text: _Text, add) -> dict | None:
    """Walk a Chrome trace, handing each element of `traceEvents` to `add` as soon as it is parsed (the
    whole list of dicts is never held), and return the other top-level keys; None without traceEvents.

    The top level is either {"traceEvents": [...], other keys} or a bare [...] of events. Everything else
    is parsed by json's own scanner.
    """
    scan, skip, at = text.scan, text.skip, text.at
    where = lambda pos: f"character {text.base + pos}"  # noqa: E731  (positions in the whole file)

    def events(pos: int) -> int:  # at(pos) == "[": stream the array, return the index after "]"
        pos = skip(pos + 1)
        if at(pos) == "]":
            return pos + 1
        while True:
            event, pos = scan(pos)
            add(event)
            pos = skip(pos)
            if at(pos) == "]":
                return pos + 1
            if at(pos) != ",":
                raise ValueError(f"expected ',' or ']' at {where(pos)}")
            pos = skip(pos + 1)

    pos = skip(0)
    if at(pos) == "[":
        pos = events(pos)
        if not text.done(pos):
            raise ValueError(f"extra data at {where(skip(pos))}")
        return {}
    if at(pos) != "{":
        raise ValueError(f"expected an object or an array at {where(pos)}")
    meta, found = {}, False
    pos = skip(pos + 1)
    while at(pos) != "}":
        key, pos = scan(pos)
        pos = skip(pos)
        if not isinstance(key, str) or at(pos) != ":":
            raise ValueError(f"expected a key and ':' at {where(pos)}")
        pos = skip(pos + 1)
        if key == "traceEvents" and at(pos) == "[":
            pos, found = events(pos), True
        else:
            meta[key], pos = scan(pos)
        pos = skip(pos)
        if at(pos) == ",":
            pos = skip(pos + 1)
        elif at(pos) != "}":
            raise ValueError(f"expected ',' or '}}' at {where(pos)}")
    if not text.done(pos + 1):
        raise ValueError(f"extra data at {where(skip(pos + 1))}")
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
                if C.COLLECTIVE_NAME_ARG in args:
                    self.comm_args[row] = {k: args[k] for k in COMM_ARG_KEYS if k in args}
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
