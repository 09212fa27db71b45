"""Open one Chrome-trace file (Kineto/torch.profiler JSON, optionally gzipped) into compact columns.

Only complete events (`"ph": "X"`) carry durations; they are all the analysis needs. Each is kept as one
row of parallel numpy arrays (ts and dur in microseconds, as the file has them) and the few `args` the
analysis reads are pulled out in the same pass. The file's text is read a few MB at a time (gunzipped and
decoded on the way), never whole: holding a big trace's text (and its bytes, while decoding) was most of
the peak memory. The top level is walked with json's scanner; the `traceEvents` array is cut into runs of
whole events a few MB long, each decoded by msgspec straight into typed records that keep only the fields
read here (`Event`, `Args`: no dict per event, no unread arg decoded), then appended to the columns and
dropped. A cut is only taken where the text before it decodes as whole events, so a `},{` inside a string
cannot split one. A file that cannot be read raises TraceError with one line naming the file and the
reason; the caller reports it and goes on with the other files.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
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

    @cached_property
    def end(self) -> np.ndarray:
        """ts + dur, computed once (the analyses read it thousands of times)."""
        return self.ts + self.dur

    def name_of(self, row: int) -> str:
        return self.names[self.name_id[row]]

    def __len__(self) -> int:
        return len(self.ts)


CHUNK_BYTES = 1 << 22  # bytes read (after gunzip) at a time
AHEAD = 1 << 16        # text kept ahead of a scan (unless the file ends first): no number is cut in two
RUN_CHARS = 1 << 22    # events text decoded at once: 4 MiB, ~15k events of the public A100 trace (284 B each)
# The longest single value (an event, a top-level key's value) held to parse it: a profiler's events are
# hundreds of bytes; a 300 KB gzip holding one 300 MB event took 1 GB before this bound (issue 45).
MAX_VALUE_CHARS = 1 << 25  # 32 Mi characters


class TooLong(ValueError):
    """A single value of the trace longer than MAX_VALUE_CHARS."""


_ABSENT = msgspec.Raw(b"null")  # a raw arg the event does not carry


class Args(msgspec.Struct, gc=False):
    """The `args` an event may carry that the analysis reads; every other arg is skipped undecoded.
    Input Dims / Input type (record_shapes, on every operator) stay raw until an event needs them."""

    correlation: Any = None
    blocks_per_sm: Any = msgspec.field(name=ARG_BLOCKS_PER_SM, default=None)
    occupancy: Any = msgspec.field(name=ARG_OCCUPANCY, default=None)
    collective: Any = msgspec.field(name="Collective name", default=None)
    dtype: Any = None
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_ABSENT)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=_ABSENT)
    process_group: Any = msgspec.field(name="Process Group Name", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)


# Args' fields by the name Kineto gives them (COMM_ARG_KEYS): what Trace.comm_args holds for an event
_COMM_FIELDS = {f.encode_name: f.name for f in msgspec.structs.fields(Args) if f.encode_name in COMM_ARG_KEYS}


class Event(msgspec.Struct, gc=False):
    """One element of traceEvents, as far as the analysis reads it."""

    ph: Any = None
    name: Any = ""
    cat: Any = ""
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: Args | None = None


_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
_RUN = msgspec.json.Decoder(list[Event])
_ARGS = msgspec.json.Decoder(Args)
_BETWEEN = re.compile(r"\}\s*,\s*\{")  # where one event ends and the next begins (or a string says so)
_LAST = re.compile(r"\}\s*\]")          # where the last event ends and the array closes


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
    except TooLong as exc:
        raise TraceError(f"{path}: not a profiler trace: {exc}") from exc
    except (StopIteration, IndexError) as exc:  # no value where one must be; past the end: cut short
        pos = exc.value if isinstance(exc, StopIteration) else None
        if isinstance(pos, int) and pos < len(text.text):
            what = f"no JSON value at character {text.base + pos}"
        else:
            empty = text.eof and text.base + len(text.text) == 0
            what = "empty" if empty else "cut short: it ends inside a value"
        raise TraceError(f"{path}: not valid JSON ({what})") from exc
    except ValueError as exc:  # the scanner's ways of saying "not JSON here"
        raise TraceError(f"{path}: not valid JSON ({_where(exc, text)})") from exc
    if meta is None:
        raise TraceError(f"{path}: not a Chrome trace: no 'traceEvents' list")
    return columns.trace(path, meta)


def _where(exc: ValueError, text: _Text) -> str:
    """What is wrong, and where: json's message at its character of the file, or the walk's own words."""
    pos = getattr(exc, "pos", None)
    return f"{exc.msg} at character {text.base + pos}" if isinstance(pos, int) else str(exc)


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

    def ensure(self, pos: int, ahead: int | None = None) -> int:
        """Keep the text from pos on, with at least `ahead` (default AHEAD) characters after it unless the
        file ends first; returns pos in the kept text."""
        ahead = AHEAD if ahead is None else ahead
        if self.eof or len(self.text) - pos >= ahead:
            return pos
        parts, held = [self.text[pos:]], len(self.text) - pos
        while held < max(CHUNK_BYTES, 2 * ahead) and not self.eof:
            parts.append(self._next())
            held += len(parts[-1])
        self.base += pos
        self.text = "".join(parts)
        return 0

    def more(self) -> None:
        """Append the next chunk to what is held (TooLong past MAX_VALUE_CHARS: one value that long)."""
        if len(self.text) > MAX_VALUE_CHARS:
            raise TooLong(f"one value longer than {MAX_VALUE_CHARS >> 20} Mi characters from character "
                          f"{self.base}: no profiler writes one")
        self.text += self._next()

    def scan(self, pos: int):
        """(value, end) of the JSON value at pos (pos is valid in the text after ensure)."""
        pos = self.ensure(pos)
        while True:
            try:
                return self.scan_once(self.text, pos)
            except (StopIteration, ValueError):
                if self.eof:
                    raise
                self.more()  # cut off by the end of what is held: read on, then retry

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
            pos = text.ensure(pos, RUN_CHARS)
            held = text.text
            end = _closing(held, pos)
            if end is not None:  # the last events: decode them and leave the array
                add(_decode_run(held[pos:end[0]]))
                return end[1]
            cut = _cut(held, pos)
            if cut is None:  # no whole event held: read on (an event longer than what is held)
                if text.eof:
                    raise ValueError(f"unterminated traceEvents array after {where(pos)}")
                text.more()
                continue
            add(_decode_run(held[pos:cut[0]]))
            pos = cut[1]

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


def _decodes(run: str) -> bool:
    try:
        _EVENTS.decode(f"[{run}]")
    except msgspec.DecodeError:
        return False
    return True


def _cut(held: str, pos: int) -> tuple[int, int] | None:
    """(end of the run, start of the next event) for the longest run of whole events from pos in `held`
    (at most what is held), or None when no boundary in it ends a run of whole events."""
    at = len(held)
    while True:
        at = held.rfind("}", pos, at)
        if at < 0:
            return None
        m = _BETWEEN.match(held, at)
        if m and _decodes(held[pos:at + 1]):
            return at + 1, m.end() - 1
        # not a boundary, or one inside a string: an earlier one


def _closing(held: str, pos: int) -> tuple[int, int] | None:
    """(end of the last event, index after the array's "]") when the array closes in what is held."""
    for m in _LAST.finditer(held, pos):
        if _decodes(held[pos:m.start() + 1]):
            return m.start() + 1, m.end()
    return None


def _decode_run(run: str) -> list[Event]:
    """A run of whole events as Events. A run with an odd element (not an object, or args that are not an
    object) is taken one element at a time: such an element is dropped, or its args, as unreadable."""
    try:
        return _RUN.decode(f"[{run}]")
    except msgspec.ValidationError:
        out = []
        for raw in _EVENTS.decode(f"[{run}]"):
            item = msgspec.json.decode(raw)
            if not isinstance(item, dict):
                continue
            args = item.get("args")
            args = _ARGS.decode(msgspec.json.encode(args)) if isinstance(args, dict) else None
            out.append(Event(ph=item.get("ph"), name=item.get("name", ""), cat=item.get("cat", ""),
                             ts=item.get("ts"), dur=item.get("dur"), pid=item.get("pid"),
                             tid=item.get("tid"), args=args))
        return out


def _num(value) -> float:
    """A numeric arg as float, NaN when absent or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan


_NUMBER = (int, float)  # bool is neither here: a class test, not isinstance
_CORRELATED = C.GPU_CATS | C.RUNTIME_CATS | {C.SYNC_CAT}  # the categories whose events carry a correlation id


def _comm_args(a: Args) -> dict:
    """The COMM_ARG_KEYS an event's args carry, by Kineto's names (the raw shapes decoded)."""
    out = {}
    for key, field_name in _COMM_FIELDS.items():
        value = getattr(a, field_name)
        if isinstance(value, msgspec.Raw):
            value = msgspec.json.decode(value)
        if value is not None:
            out[key] = value
    return out


def _describes_collective(name) -> bool:
    return isinstance(name, str) and (name == C.COLLECTIVE_ARGS_EVENT or bool(C.HOST_COLLECTIVE.match(name)))


class _Columns:
    """Accumulates complete events into column lists, a run of events at a time."""

    def __init__(self):
        self.name_ids, self.cat_ids, self.tid_ids, self.ts, self.dur = [], [], [], [], []
        self.corr, self.bps, self.occ, self.comm_args = {}, {}, {}, {}
        self.names, self.cats, self.threads = {}, {}, {}  # value → id, in order of first appearance
        self.correlated: dict[int, bool] = {}             # category id → do its events carry a correlation
        self.kernel: dict[int, bool] = {}                 # category id → is it "kernel"
        self.comm_name: dict[int, bool] = {}              # name id → does this event describe a collective

    def add(self, events: list[Event]) -> None:
        names, cats, threads = self.names, self.cats, self.threads
        for e in events:
            start, length = e.ts, e.dur
            if e.ph != "X" or start.__class__ not in _NUMBER or length.__class__ not in _NUMBER:
                continue  # only complete events; one without times cannot be placed
            name = e.name if e.name.__class__ is str else str(e.name)
            nid = names.setdefault(name, len(names))
            cat = e.cat or ""
            cid = cats.get(cat)
            if cid is None:
                cid = cats[cat] = len(cats)
                lowered = cat.lower() if isinstance(cat, str) else ""
                self.correlated[cid], self.kernel[cid] = lowered in _CORRELATED, lowered == "kernel"
            row = len(self.ts)
            self.name_ids.append(nid)
            self.cat_ids.append(cid)
            self.tid_ids.append(threads.setdefault((e.pid, e.tid), len(threads)))
            self.ts.append(start)
            self.dur.append(length)
            a = e.args
            if a is None:
                continue
            if self.correlated[cid]:
                self.corr[row] = _num(a.correlation)
                if self.kernel[cid]:
                    self.bps[row] = _num(a.blocks_per_sm)
                    self.occ[row] = _num(a.occupancy)
                    if a.collective is not None:
                        self.comm_args[row] = _comm_args(a)
                continue
            hit = self.comm_name.get(nid)
            if hit is None:
                hit = self.comm_name[nid] = _describes_collective(name)
            if hit and (described := _comm_args(a)):  # an event that says nothing of its message: no size
                self.comm_args[row] = described

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
