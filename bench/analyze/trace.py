"""A loaded trace (bench/analyze/load.py's result): one file's complete events as parallel columns
(`Trace`), and `Columns`, the loader's last stage, which fills them a run of decoded events at a time,
pulling out the few args the analyses read."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import msgspec
import numpy as np

from bench.analyze import classify as C
from bench.analyze.trace_json import COMM_FIELDS, Args, Event


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


def _num(value) -> float:
    """A numeric arg as float, NaN when absent or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan


_NUMBER = (int, float)  # bool is neither here: a class test, not isinstance
_CORRELATED = C.GPU_CATS | C.RUNTIME_CATS | {C.SYNC_CAT}  # the categories whose events carry a correlation id


def _comm_args(a: Args) -> dict:
    """The COMM_ARG_KEYS an event's args carry, by Kineto's names (the raw shapes decoded)."""
    out = {}
    for key, field_name in COMM_FIELDS.items():
        value = getattr(a, field_name)
        if isinstance(value, msgspec.Raw):
            value = msgspec.json.decode(value)
        if value is not None:
            out[key] = value
    return out


def _describes_collective(name) -> bool:
    return isinstance(name, str) and (name == C.COLLECTIVE_ARGS_EVENT or bool(C.HOST_COLLECTIVE.match(name)))


class Columns:
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
