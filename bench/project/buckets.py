"""Where a DDP configuration's buckets come from (the all-reduce messages of its synced backward, in issue
order): the base cell's trace, else another cell's of the same configuration, else the uniform
approximation with sizes from the workload's layout or the row's counts; and the messages PowerSGD sends
instead, with the compute its compression adds.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import pandas as pd

from bench import engines
from bench.project.inputs import ReadyTimes, timeline_buckets
from bench.project.powersgd import compress
from bench.project.simulate import Buckets
from bench.schema import WIRE_DTYPES


def uniform_buckets(engine: str, sizes: list[int], how: str) -> Buckets:
    """No trace: gradients arrive uniformly in bytes over backward in reverse parameter order, so bucket i
    is ready once the bytes of buckets 0..i are; engines that reduce after backward get every bucket at its
    end."""
    if engines.get(engine).overlaps_backward:  # a bucket's all-reduce starts as soon as it is ready
        total = sum(sizes)
        ready = tuple(c / total for c in accumulate(sizes))
    else:
        ready = (1.0,) * len(sizes)
    return Buckets(tuple(sizes), ready, source=f"uniform ({how})")


def row_bucket_sizes(row: pd.Series) -> list[int]:
    """Sizes from the row alone: n_buckets messages, all but the last as large as the probed (largest)
    one, the last taking what remains of n_params·4 bytes (equal shares when that does not fit)."""
    n, largest = int(row["n_buckets"]), int(row["allreduce_bytes"])
    wire = WIRE_DTYPES[row["comm_dtype"]].bytes
    total = int(row["n_params"]) * wire
    rest = total - (n - 1) * largest
    return [largest] * (n - 1) + [rest] if 0 < rest <= largest else [max(1, total // n)] * n


def buckets_of(rows: pd.DataFrame, base: pd.Series, timeline: pd.DataFrame | None,
               layout: Callable[[pd.Series], list[int]] | None) -> Buckets:
    """The configuration's buckets: the base cell's trace, else another cell's trace of the same
    configuration (smallest world size first), else the uniform approximation with sizes from `layout`
    (the workload rebuilt on the meta device), else from the row."""
    for _, row in rows.sort_values("world_size").iterrows():
        found = timeline_buckets(timeline, row["cell_id"])
        own = "trace" if row["cell_id"] == base["cell_id"] else f"trace of {row['cell_id']}"
        if isinstance(found, ReadyTimes) and layout is not None:  # the trace's timing, the layout's sizes
            try:
                sizes = uniform_buckets(base["engine"], layout(base), "workload layout").sizes
            except (ValueError, ImportError, OSError, RuntimeError):
                continue
            if len(sizes) == len(found.ready):
                return Buckets(sizes, found.ready, f"{own} (ready times), workload layout (sizes)")
        elif isinstance(found, Buckets):
            return Buckets(found.sizes, found.ready, own)
    if layout is not None:
        try:
            return uniform_buckets(base["engine"], layout(base), "workload layout")
        except (ValueError, ImportError, OSError, RuntimeError) as exc:  # e.g. an hf: checkpoint not here
            how = f"row's bucket count; layout failed: {exc}"
    else:
        how = "row's bucket count"
    if any(pd.isna(base[c]) for c in ("n_buckets", "allreduce_bytes", "n_params")):
        raise ValueError(f"base cell {base['cell_id']} has neither a bucket timeline nor bucket counts")
    return uniform_buckets(base["engine"], row_bucket_sizes(base), how)


def powersgd_of(base: pd.Series, buckets: Buckets, shapes: Callable[[pd.Series], list] | None
                ) -> tuple[Buckets, float]:
    """PowerSGD's messages (three per bucket, each ready when its bucket is: bench/project/powersgd.py) and
    its compression compute (ms) at the FLOP rate the base cell's model computed at; ValueError says what is
    missing."""
    if shapes is None:
        raise ValueError("comm_hook=powersgd: the parameter shapes are needed (no workload to rebuild)")
    # the model's FLOP rate while it computes: model_tflops_per_s is per whole step (hook included), so
    # its FLOPs per step over the compute-only step
    achieved, step, compute_ms = (base.get(c) for c in ("model_tflops_per_s", "step_time_ms_p50",
                                                         "compute_only_ms_p50"))
    if any(pd.isna(x) or not x > 0 for x in (achieved, step, compute_ms)):
        raise ValueError(f"comm_hook=powersgd: base cell {base['cell_id']} has no model_tflops_per_s, step "
                         "and compute-only times: no rate its compression's FLOPs would run at")
    rate = achieved * step / compute_ms
    try:
        per_bucket = shapes(base)
    except (KeyError, ImportError, OSError, RuntimeError) as exc:
        raise ValueError(f"comm_hook=powersgd: parameter shapes not rebuilt: {exc}") from None
    compressed = compress(per_bucket, int(base["powersgd_rank"]))
    ready = [buckets.ready[min(b, len(buckets.ready) - 1)] for b in compressed.bucket_of]
    source = f"{buckets.source}; PowerSGD rank {int(base['powersgd_rank'])} messages"
    return Buckets(compressed.messages, tuple(ready), source), compressed.flops / (rate * 1e12) * 1e3
