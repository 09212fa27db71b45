"""A run's configurations read from its result rows: each configuration's base cell, its compute side (the
phase pass split, the compute-only step's total), and how it communicates (DDP's buckets: buckets.py; a
sharded engine's fully_shard groups), or why the model cannot project it; with its fixed cost where the run
measured a second per-rank batch (fixed_costs.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from bench import engines
from bench.project.buckets import buckets_of, powersgd_of
from bench.project.columns import config_key
from bench.project.configuration import Configuration
from bench.project.fixed_costs import with_fixed_costs
from bench.project.inputs import InputError
from bench.project.sharded import Sharding, estimated_blocks, uniform_blocks
from bench.project.simulate import Buckets, Compute
from bench.schema import WIRE_DTYPES


def not_projected(base: pd.Series) -> str:
    """Why the model cannot project this configuration ("" when it can): an engine whose collectives are
    neither DDP's all-reduces nor a sharded engine's all-gathers and reduce-scatters."""
    engine = engines.get(base["engine"])
    if engine.collectives not in (("all_reduce",), ("all_gather", "reduce_scatter")):
        return (f"engine {base['engine']} issues {' + '.join(engine.collectives)}: the model projects "
                "all-reduces and sharded all-gathers with reduce-scatters")
    return ""


def sharding_of(base: pd.Series) -> Sharding:
    """How the fsdp2 engine communicates (bench/engines/fsdp2.py): FULL_SHARD-like with
    reshard_after_forward, else SHARD_GRAD_OP-like; parameters gathered in the precision's dtype (its
    MixedPrecisionPolicy), gradients reduced in comm_dtype's (fp32 for none); accumulation under
    set_requires_gradient_sync(False), so only the last micro-step reduce-scatters."""
    raf = base.get("reshard_after_forward")
    reshard = True if pd.isna(raf) else str(raf).lower() not in ("false", "0", "0.0")
    param_bytes = 2 if base["precision"] in ("bf16", "fp16") else 4
    return Sharding("full" if reshard else "grad_op", param_bytes, WIRE_DTYPES[base["comm_dtype"]].bytes,
                    reduce_every_micro_step=False)


def sharded_blocks(base: pd.Series, layout: Callable[[pd.Series], list[int]] | None) -> tuple[tuple[int, ...],
                                                                                             str]:
    """(parameters per fully_shard group in forward order, source): the cell's recorded groups (the
    engine's bucket_sizes_bytes: fp32 bytes in backward order, on the wire at comm_dtype), else equal
    blocks of the row's n_params at the transformer estimate (sharded.estimated_blocks)."""
    why = "no workload layout"
    if layout is not None:
        try:
            wire = WIRE_DTYPES[base["comm_dtype"]].bytes
            sizes = [max(1, round(s / wire)) for s in layout(base)]
            if sizes:
                return tuple(reversed(sizes)), "fully_shard groups (recorded layout)"
            why = "the layout has no groups"
        except (ValueError, ImportError, OSError, RuntimeError) as exc:  # e.g. an hf: checkpoint not here
            why = f"layout failed: {exc}"
    if pd.isna(base.get("n_params")):
        raise ValueError(f"base cell {base['cell_id']} has neither its fully_shard groups nor n_params "
                         f"({why})")
    params = int(base["n_params"])
    blocks = estimated_blocks(params)
    return (uniform_blocks(params, blocks),
            f"{blocks} equal blocks of n_params (transformer estimate; {why})")


def compute_of(row: pd.Series) -> Compute:
    """The base cell's compute side: the phase pass gives the split into forward, backward and optimizer,
    the compute-only step (timed like the real step, gradients not synchronised) gives the total."""
    phases = [row[c] for c in ("forward_ms_p50", "backward_ms_p50", "optimizer_ms_p50")]
    if any(pd.isna(p) for p in phases) or sum(phases) <= 0:
        raise ValueError(f"base cell {row['cell_id']} has no phase times (forward/backward/optimizer)")
    total = row["compute_only_ms_p50"] if not pd.isna(row["compute_only_ms_p50"]) else sum(phases)
    f = total / sum(phases)
    return Compute(phases[0] * f, phases[1] * f, phases[2] * f, int(row["grad_accum"]),
                   int(row["per_rank_batch"]))


def configurations(results: pd.DataFrame, timeline: pd.DataFrame | None,
                   layout: Callable[[pd.Series], list[int]] | None,
                   shapes: Callable[[pd.Series], list] | None = None) -> list[Configuration]:
    """Every configuration with at least one ok cell, each from its smallest ok world size. `shapes`:
    the parameter shapes per DDP bucket (bench.project.layout.bucket_shapes), for PowerSGD."""
    ok = results[results["status"] == "ok"]
    out: list[Configuration] = []
    if ok.empty:
        return out
    for _, rows in ok.groupby(ok.apply(config_key, axis=1), sort=False):
        rows = rows.sort_values("world_size")
        base = rows.iloc[0]
        if not_projected(base):
            out.append(Configuration(base, rows, None, None, reason=not_projected(base)))
            continue
        try:
            out.append(_configuration(base, rows, timeline, layout, shapes))
        except InputError:  # a broken file is the run's error, not this configuration's
            raise
        except ValueError as exc:
            out.append(Configuration(base, rows, None, None, reason=str(exc)))
    return with_fixed_costs(out)


def _configuration(base, rows, timeline, layout, shapes) -> Configuration:
    compute = compute_of(base)
    if engines.get(base["engine"]).sharded:
        blocks, source = sharded_blocks(base, layout)
        sharding = sharding_of(base)
        # the reduce-scatters' bytes as one message: what timeline_source and validation's conditions read
        summary = Buckets((max(1, int(sum(blocks) * sharding.grad_bytes)),), (1.0,), source)
        return Configuration(base, rows, compute, summary, sharded=(sharding, blocks))
    buckets = buckets_of(rows, base, timeline, layout)
    if base.get("comm_hook") == "powersgd":
        buckets, extra = powersgd_of(base, buckets, shapes)
        return Configuration(base, rows, compute, buckets, extra_compute_ms=extra)
    return Configuration(base, rows, compute, buckets)


def workload_shapes(workload_table: dict) -> Callable[[pd.Series], list]:
    """A configuration's parameter shapes per DDP bucket, its workload rebuilt on the meta device
    (bench.project.layout imports torch, on first use)."""
    def shapes(base: pd.Series) -> list:
        from bench.project.layout import bucket_shapes, workload_options

        cap = None if pd.isna(base["bucket_cap_mb"]) else float(base["bucket_cap_mb"])
        return bucket_shapes(base["model"], base["model_size"], cap, workload_options(workload_table))

    return shapes
