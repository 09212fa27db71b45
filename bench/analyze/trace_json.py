"""Walking a Chrome trace's JSON (the loader's second stage, bench/analyze/load.py): the top level with
json's scanner, the `traceEvents` array cut into runs of whole events a few MB long, each decoded by msgspec
straight into typed records that keep only the fields the analysis reads (`Event`, `Args`: no dict per
event, no unread arg decoded). A cut is only taken where the text before it decodes as whole events, so a
`},{` inside a string cannot split one."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from bench.analyze.trace_text import TextWindow

# Args the analysis reads, by the name Kineto gives them.
ARG_CORRELATION = "correlation"
ARG_BLOCKS_PER_SM = "blocks per SM"
ARG_OCCUPANCY = "est. achieved occupancy %"
# Events whose args describe a collective's message (see classify.COLLECTIVE_ARGS_EVENT / HOST_COLLECTIVE).
# Current torch also puts record_param_comms' args on the NCCL kernel itself; `Process Group Name` and `Seq`
# identify the collective across ranks (bench/analyze/collectives.py).
COMM_ARG_KEYS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Input Dims",
                 "Input type", "Process Group Name", "Seq")

RUN_CHARS = 1 << 22    # events text decoded at once: 4 MiB, ~15k events of the public A100 trace (284 B each)

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
COMM_FIELDS = {f.encode_name: f.name for f in msgspec.structs.fields(Args) if f.encode_name in COMM_ARG_KEYS}


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


def stream_events(text: TextWindow, add) -> dict | None:
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
