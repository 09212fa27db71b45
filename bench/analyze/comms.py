"""Collectives' message sizes and the trace-derived bus bandwidth.

Sizes come from the args torch records with each collective: `record_param_comms` (`Collective name`,
`dtype`, `In msg nelems`, `Out msg nelems`, `Group size`; torch ≥ 2.1 with NCCL) when the trace has them,
else the `Input Dims` / `Input type` that record_shapes=True adds to the backend's own event
(`nccl:all_reduce` on the issuing thread, `gloo:all_reduce` on gloo's worker thread). One source per file,
so a collective is never counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.analyze import classify as C
from bench.analyze.trace import Trace


@dataclass(frozen=True)
class Collective:
    ts: float                 # µs, host time the collective was issued (or began, for gloo's worker events)
    name: str                 # "allreduce", "all_reduce", "broadcast", …
    nbytes: float | None      # message bytes; None when the trace does not say
    group_size: int | None


def _dims_bytes(dims, types) -> float | None:
    """Σ over tensor inputs of prod(dims) × bytes(type); None when a tensor's type is unknown."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0.0
    for d, t in zip(dims, types):
        if not isinstance(d, list) or not d or not all(isinstance(x, int) for x in d):
            continue  # a scalar or a non-tensor argument
        size = C.DTYPE_BYTES.get(str(t).lower())
        if size is None:
            return None
        total += float(np.prod(d)) * size
    return total if total else None


def _sole_group_size(trace: Trace) -> int | None:
    """The size of the job's only process group (distributedInfo.pg_config), else None: with several
    groups we cannot tell which one a collective used."""
    info = trace.meta.get("distributedInfo") or {}
    groups = info.get("pg_config")
    if isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0].get("pg_size"), int):
        return groups[0]["pg_size"]
    return None


def row_bytes(trace: Trace, r: int) -> float | None:
    """Message bytes recorded on event row `r` (record_param_comms' nelems × dtype, or Input Dims × type)."""
    a = trace.comm_args.get(r, {})
    if "In msg nelems" in a:
        size = C.DTYPE_BYTES.get(str(a.get("dtype", "")).lower())
        nelems = max(a.get("In msg nelems") or 0, a.get("Out msg nelems") or 0)  # all_gather: the output
        return nelems * size if size is not None else None
    return _dims_bytes(a.get("Input Dims"), a.get("Input type"))


def collectives(trace: Trace) -> list[Collective]:
    """Every collective the trace describes, with its size where known, in time order."""
    rows = sorted(trace.comm_args)
    param_rows = [r for r in rows if trace.name_of(r) == C.COLLECTIVE_ARGS_EVENT
                  and "In msg nelems" in trace.comm_args[r]]
    fallback_group = _sole_group_size(trace)
    out = []
    for r in param_rows:
        a = trace.comm_args[r]
        group = a.get("Group size") if isinstance(a.get("Group size"), int) else fallback_group
        name = str(a.get("Collective name", ""))
        out.append(Collective(float(trace.ts[r]), name, row_bytes(trace, r), group))
    if not param_rows:
        for r in rows:
            name = trace.name_of(r)
            if isinstance(name, str) and C.HOST_COLLECTIVE.match(name):
                out.append(Collective(float(trace.ts[r]), name.split(":", 1)[1], row_bytes(trace, r),
                                      fallback_group))
    return sorted(out, key=lambda c: c.ts)


def window_bytes_busbw(colls: list[Collective], lo: float, hi: float,
                       comm_ms: float | None) -> tuple[float | None, float | None]:
    """(comm_bytes, comm_busbw_gbps) for the collectives issued in [lo, hi].

    busbw = Σ bytes·factor(collective, group size) / comm time, in GB/s (1e9 B/s, as nccl-tests);
    empty when any collective's size or group is unknown, or there was no communication time.
    """
    inside = [c for c in colls if lo <= c.ts <= hi]
    if not inside or any(c.nbytes is None for c in inside):
        return None, None
    total = float(sum(c.nbytes for c in inside))
    if not comm_ms:
        return total, None
    weighted = 0.0
    for c in inside:
        factor = C.busbw_factor(c.name, c.group_size) if c.group_size else None
        if factor is None:
            return total, None
        weighted += c.nbytes * factor
    return total, weighted / (comm_ms * 1e-3) / 1e9
