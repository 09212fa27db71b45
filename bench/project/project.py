"""A run's configurations, projected over world sizes (projection.csv) and checked against the world sizes
the run measured (validation.csv). Definitions: docs/design.md "Projection".

A configuration is every result row that shares the keys below except the world size. Its base cell is its
smallest world size with status ok: the compute side (forward, backward, optimizer) comes from there only,
so validation never sees the step times it predicts. On the run's own network (`measured`), and on the
preset the user says the run measured on (`bench project --measured-on`), a projection to n is anchored to
the largest world size the run measured between the base and n (anchor_of): the model's step times the
measured step over the model's step there, the model predicting the change from that measurement
(docs/design.md "Anchored projections"; checked on the published tables by the lab,
benchmarks/projection_lab/). When what was measured is a validated protocol (a whole node, projected
across nodes; 1 and 2 GPUs, projected within the node: bench/project/protocol.py), the row prints that
protocol's band and its median correction instead of the regime's band (protocol_of).
Another preset describes another machine, whose error the run did not measure: no anchor there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate

import pandas as pd

from bench import engines, metrics
from bench.project import interval, protocol
from bench.project.evidence import TraceEvidence, host_ms_of, interference_of
from bench.project.inputs import COMM_DTYPE_WIRE, InputError, ReadyTimes, timeline_buckets
from bench.project.measured import Measured
from bench.project.network import Network, scaled_network
from bench.project.physics import Physics, expected_max_normal
from bench.project.powersgd import compress
from bench.project.sharded import Sharding, estimated_blocks, simulate_sharded, uniform_blocks
from bench.project.simulate import Buckets, Compute, Step, simulate_step
from bench.schema import ENGINE_OPTION_NAMES, WIRE_DTYPES

CONFIG_COLUMNS = ("engine", "model", "model_size", "bucket_cap_mb", "precision", "comm_dtype", "grad_accum",
                  "scaling")
PROJECTION_COLUMNS = ("cell_id",) + CONFIG_COLUMNS + (
    "network", "algorithm", "world_size", "nodes", "per_rank_batch", "global_batch", "predicted_step_ms",
    "predicted_samples_per_s", "efficiency_pct", "exposed_comm_ms", "comm_ms", "comm_latency_ms",
    "comm_bandwidth_ms", "bottleneck", "timeline_source", "network_source", "reason", "straggler_ms",
    "interference_ms", "host_floor_ms", "dominant_term", "efficiency_pct_low", "efficiency_pct_high",
    "predicted_samples_per_s_low", "predicted_samples_per_s_high", "interval_regime", "anchor_world_size",
    "anchor_step_ratio", "protocol", "fixed_ms")
VALIDATION_COLUMNS = ("cell_id", "world_size", "measured_step_ms", "predicted_step_ms", "error_pct",
                      "base_cell_id", "measured_compute_only_ms", "predicted_compute_ms",
                      "measured_exposed_comm_ms", "predicted_exposed_comm_ms",
                      "error_with_measured_compute_pct", "conditions", "timeline_source", "network_source",
                      "reason")
INT_COLUMNS = ("grad_accum", "world_size", "nodes", "per_rank_batch", "global_batch", "anchor_world_size")


@dataclass(frozen=True)
class Configuration:
    """A measured configuration: its base cell's row, compute side and buckets (or why it has none)."""

    base: pd.Series
    rows: pd.DataFrame              # every ok cell of the configuration, by world size
    compute: Compute | None
    buckets: Buckets | None
    reason: str = ""
    physics: Physics | None = None  # the terms from the run's evidence (with_evidence); None: physics_of's
    physics_source: str = ""
    sharded: tuple[Sharding, tuple[int, ...]] | None = None   # a sharded engine: how, and its blocks
    extra_compute_ms: float = 0.0   # compute a comm hook adds once per synced step (PowerSGD's compression)
    fixed_source: str = ""          # where compute.fixed_ms came from ("" none measured: 0)

    @property
    def micro_batch(self) -> int:
        """Samples per micro-step over all ranks (what strong scaling keeps)."""
        return int(self.base["per_rank_batch"]) * int(self.base["world_size"])


def config_key(row: pd.Series) -> tuple:
    """The keys that make two rows one configuration: CONFIG_COLUMNS plus the batch scaling keeps."""
    batch = row["global_batch"] if row["scaling"] == "strong" else row["per_rank_batch"]
    options = tuple("" if pd.isna(row[c]) else row[c] for c in OPTION_COLUMNS if c in row.index)
    return tuple("" if pd.isna(row[c]) else row[c] for c in CONFIG_COLUMNS) + (batch,) + options


# engine options make two rows different configurations; a run folder written before they existed has
# none of these columns
OPTION_COLUMNS = ENGINE_OPTION_NAMES


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


def _micro_ms(config: Configuration) -> float:
    return (config.compute.forward_ms + config.compute.backward_ms) / config.compute.grad_accum


def with_fixed_costs(configs: list[Configuration]) -> list[Configuration]:
    """Each configuration with its micro-step's fixed cost (protocol.fixed_cost_ms) when the run measured it
    at a second per-rank batch: another configuration that differs only in the batch, with its base at the
    same world size (the farthest batch of those). Only base cells are used, so validation still never
    sees the step times it predicts."""
    def sibling_key(c: Configuration) -> tuple:
        # the configuration less its batch and batch rule (at one world size strong and weak scaling run
        # the same trainers), at its base's world size
        key = config_key(c.base)
        kept = [v for col, v in zip(CONFIG_COLUMNS, key) if col != "scaling"]
        return tuple(kept) + key[len(CONFIG_COLUMNS) + 1:] + (int(c.base["world_size"]),)

    out = []
    for config in configs:
        if config.compute is None or config.sharded is not None:
            out.append(config)
            continue
        b = int(config.base["per_rank_batch"])
        others = [c for c in configs if c.compute is not None and c is not config
                  and sibling_key(c) == sibling_key(config) and int(c.base["per_rank_batch"]) != b]
        if not others:
            out.append(config)
            continue
        other = max(others, key=lambda c: abs(int(c.base["per_rank_batch"]) - b))
        b2 = int(other.base["per_rank_batch"])
        fixed = protocol.fixed_cost_ms(b, _micro_ms(config), b2, _micro_ms(other))
        out.append(replace(config, compute=replace(config.compute, fixed_ms=fixed),
                           fixed_source=f"fixed cost {fixed:.3g} ms per micro-step from per-rank batches {b} "
                                        f"({config.base['cell_id']}) and {b2} ({other.base['cell_id']})"))
    return out


def fixed_cost_needed(config: Configuration, table: pd.DataFrame) -> str:
    """A note when the configuration's projected rows change the per-rank batch and no second batch was
    measured ("" otherwise): the fixed cost is then 0, compute in proportion to the batch."""
    if config.compute is None or config.fixed_source:
        return ""
    mine = table[(table["cell_id"] == config.base["cell_id"]) & table["per_rank_batch"].notna()]
    changed = mine[mine["per_rank_batch"].astype(int) != int(config.base["per_rank_batch"])]
    if changed.empty:
        return ""
    smallest = int(changed["per_rank_batch"].min())
    return (f"{config.base['cell_id']}: the per-rank batch changes from {int(config.base['per_rank_batch'])} "
            f"to {smallest} and no second batch was measured at world size {int(config.base['world_size'])}: "
            "the step's fixed cost is taken as 0 (compute in proportion to the batch), which overstates "
            "strong scaling; measure the same configuration at a second workload.per_rank_batch (e.g. half) "
            "to fit it (docs/projection.md \"Fixed cost\")")


def workload_shapes(workload_table: dict) -> Callable[[pd.Series], list]:
    """A configuration's parameter shapes per DDP bucket, its workload rebuilt on the meta device
    (bench.project.layout imports torch, on first use)."""
    def shapes(base: pd.Series) -> list:
        from bench.project.layout import bucket_shapes, workload_options

        cap = None if pd.isna(base["bucket_cap_mb"]) else float(base["bucket_cap_mb"])
        return bucket_shapes(base["model"], base["model_size"], cap, workload_options(workload_table))

    return shapes


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


def step_of(config: Configuration, compute: Compute, net: Network | None, n: int, algorithm: str,
            physics: Physics) -> Step:
    """The configuration's step on n ranks: sharded (sharded.py) or DDP's buckets (simulate.py), with the
    compute a comm hook adds once per synced step (none at n = 1: DDP runs no hook on one rank here)."""
    if config.sharded is not None:
        return simulate_sharded(compute, config.sharded[1], config.sharded[0], net, n, physics)
    if n > 1 and config.extra_compute_ms:
        compute = replace(compute, optimizer_ms=compute.optimizer_ms + config.extra_compute_ms)
    return simulate_step(compute, config.buckets, net, n, algorithm, physics)


def protocol_of(config: Configuration, anchor: tuple[int, float] | None, net: Network | None, n: int
                ) -> tuple[str, float, protocol.ProtocolBand] | None:
    """(protocol, reach, its band) when what the run measured is one of the validated protocols
    (bench/project/protocol.py): anchored to a whole node and projected across nodes (`node`), or from 1 GPU
    anchored at 2 and projected within the node (`two-gpus`); None otherwise (the regime bands)."""
    if anchor is None or net is None or net.gpus_per_node <= 1:
        return None
    m = anchor[0]
    if m == net.gpus_per_node and net.nodes(n) > 1:
        name = protocol.NODE
    elif m == 2 and int(config.base["world_size"]) == 1 and net.nodes(n) == 1:
        name = protocol.TWO_GPUS
    else:
        return None
    return name, n / m, protocol.read_bands()[name]


def protocol_columns(config: Configuration, measured: tuple[str, float, protocol.ProtocolBand], eff: float,
                     step_ms: float, samples: float, delta: float) -> tuple[float, float, float, dict]:
    """(efficiency, step ms, samples/s, interval columns) a protocol's row prints: the model's efficiency
    moved by the band's median miss at the reach, and the band around the model's, widened by δ (the
    busbw fit's, and T1's for samples/s: interval_of), at most 100 % (protocol.ProtocolBand)."""
    name, reach, band = measured
    printed = band.predicted(eff, reach)
    step_ms, samples = step_ms * eff / printed, samples * printed / eff
    low, high = band.bounds(eff * 100, reach, delta)
    t1_rel = interval.t1_relative_90(config.base.get("step_time_half_width_pct"))
    return printed, step_ms, samples, dict(
        efficiency_pct_low=low, efficiency_pct_high=high,
        predicted_samples_per_s_low=samples * low / (printed * 100) * math.exp(-t1_rel),
        predicted_samples_per_s_high=samples * high / (printed * 100) * math.exp(t1_rel),
        interval_regime=f"{protocol.band_of(name, reach)} (protocol {name})")


CALIBRATION_HALVINGS = 40   # bisection steps: the compute factor to 2^-40 of its bracket


def _scaled(compute: Compute, c: float) -> Compute:
    return replace(compute, forward_ms=compute.forward_ms * c, backward_ms=compute.backward_ms * c,
                   optimizer_ms=compute.optimizer_ms * c, fixed_ms=compute.fixed_ms * c)


def node_calibrated(config: Configuration, compute: Compute, net: Network, n: int, anchor: tuple[int, float],
                    network_at: NetworkAt, algorithm: str, physics: Physics) -> tuple[Step, float]:
    """(step at n, the ratio still to apply) under the node protocol: the compute scaled by the factor c
    whose simulated step on the measured node equals the measured one (the node's own communication,
    straggler and interference taken out, as the lab calibrates a published node row:
    benchmarks/projection_lab/published.py calibrate), then simulated at n; ratio 1. When even c → 0 is
    slower than the measurement (the model's communication alone exceeds it), the anchor's step ratio, as
    on any other anchored row."""
    m, ratio = anchor
    net_m, _ = network_at(m, COMM_DTYPE_WIRE[config.base["comm_dtype"]])
    at_m = config.compute.at_batch(per_rank_of(config, m)[0])
    target = ratio * step_of(config, at_m, net_m, m, algorithm, physics).step_ms
    if step_of(config, _scaled(at_m, 1e-9), net_m, m, algorithm, physics).step_ms > target:
        return step_of(config, compute, net, n, algorithm, physics), ratio
    lo, hi = 0.0, max(1.0, ratio) * 2
    while step_of(config, _scaled(at_m, hi), net_m, m, algorithm, physics).step_ms < target:
        hi *= 2
    for _ in range(CALIBRATION_HALVINGS):
        mid = (lo + hi) / 2
        if step_of(config, _scaled(at_m, mid), net_m, m, algorithm, physics).step_ms > target:
            hi = mid
        else:
            lo = mid
    return step_of(config, _scaled(compute, (lo + hi) / 2), net, n, algorithm, physics), 1.0


def bands() -> dict:
    """The stored model-error bands (bench/project/interval.py, model_error.csv)."""
    return interval.read_bands()[0]


def interval_of(config: Configuration, compute: Compute, net: Network | None, n: int, algorithm: str,
                physics: Physics, step: Step, efficiency_pct: float, samples: float,
                band_table: dict, anchored: bool = False) -> dict:
    """The 90 % interval columns of one projected row (bench/project/interval.py): the band of its regime
    and basis (`anchored`) at the row's scale (interval.scale_of), widened by the busbw fit's residual
    (measured networks) and, for samples/s, by T1's own interval; never past the physical limit (100 %
    efficiency; N × T1's rate for samples/s)."""
    t1_rel = interval.t1_relative_90(config.base.get("step_time_half_width_pct"))
    if n == 1:   # nothing projected: the measured compute's interval only
        low, high = math.exp(-t1_rel), math.exp(t1_rel)
        return dict(efficiency_pct_low=efficiency_pct, efficiency_pct_high=efficiency_pct,
                    predicted_samples_per_s_low=samples * low, predicted_samples_per_s_high=samples * high,
                    interval_regime="none (one rank: T1's interval)")
    delta_bw = 0.0
    if net is not None and net.bandwidth_rel_error > 0:
        # the fit's RMS relative residual as a standard deviation; floor 0.05: a busbw never goes to 0
        slow = scaled_network(net, max(0.05, 1 - interval.HALF_90 * net.bandwidth_rel_error))
        delta_bw = math.log(step_of(config, compute, slow, n, algorithm, physics).step_ms / step.step_ms)
    basis = interval.ANCHORED if anchored else ""
    regime_name = interval.regime_of_network(config.sharded is not None, net, n)
    name = interval.band_name(regime_name, basis)
    band = band_table[name]
    # the band's unit: the model's own predicted loss at n (1 − efficiency), held at the regime's
    # calibrated edge beyond it (SCALE_CAP); 1 anchored
    scale = interval.scale_of(basis, efficiency_pct / 100, regime_name)
    # the physical limit: 100 % efficiency, and for samples/s the linear bound N × T1's rate (T1 at the
    # fast end of its own interval)
    linear = samples / (efficiency_pct / 100) * math.exp(t1_rel)
    eff = interval.bounds(efficiency_pct, band, delta_bw, interval.LIMIT_PCT, scale)
    rate = interval.bounds(samples, band, delta_bw + t1_rel, linear, scale)
    return dict(efficiency_pct_low=eff[0], efficiency_pct_high=eff[1], predicted_samples_per_s_low=rate[0],
                predicted_samples_per_s_high=rate[1],
                interval_regime=name + (" (pooled band)" if band.pooled else ""), delta=delta_bw)


Z90 = 1.2816  # the standard normal's 90th percentile


def step_cv_of(row: pd.Series) -> tuple[float, str]:
    """σ, the per-rank step-time spread (standard deviation / median) the straggler term draws from, and
    where it came from. On more than one rank the median slowest-minus-fastest gap is the expected range
    of n draws, 2·σ·T·E[Z_(n)]: the gap is rank_skew_ms_p50, taken in the compute-only rounds where each
    rank's step is its own work (a timed step ends on every rank with its last collective, so its gap is
    ≈ 0 under NCCL), over those rounds' median compute_only_ms_p50 (else the step's); on one rank,
    (p90 − p50)/z90 over p50; else 0 (nothing measured)."""
    t = row.get("step_time_ms_p50")
    if pd.isna(t) or not t > 0:
        return 0.0, "no step times"
    n = int(row["world_size"])
    skew, compute = row.get("rank_skew_ms_p50"), row.get("compute_only_ms_p50")
    if n > 1 and not pd.isna(skew):
        base = compute if not pd.isna(compute) and compute > 0 else t
        return max(0.0, skew / (2 * base * expected_max_normal(n))), f"rank_skew_ms_p50 of {row['cell_id']}"
    p90 = row.get("step_time_ms_p90")
    if not pd.isna(p90):
        return max(0.0, (p90 - t) / Z90 / t), f"step_time_ms p90/p50 of {row['cell_id']}"
    return 0.0, "no step-time spread"


def physics_of(config: Configuration) -> Physics:
    """The physics terms of a measured configuration: those with_evidence attached, else σ from its base
    cell (step_cv_of), interference at its documented default and no host floor."""
    return config.physics if config.physics is not None else Physics(step_cv=step_cv_of(config.base)[0])


def with_evidence(config: Configuration, evidence: TraceEvidence | None) -> Configuration:
    """The configuration with its physics from the run: σ from its base cell (step_cv_of), γ from the
    traces of its communicating cells (the base cell first), host_ms from the base cell's launch
    statistics (bench/project/evidence.py); physics_source says where each came from."""
    cv, cv_source = step_cv_of(config.base)
    cells = [c for c, n in zip(config.rows["cell_id"], config.rows["world_size"]) if int(n) > 1]
    evidence = evidence or TraceEvidence(None, None, None)
    gamma, gamma_source = interference_of(evidence, cells)
    host, host_source = host_ms_of(evidence, config.base["cell_id"], str(config.base.get("device", "")))
    source = f"σ {cv:.4g}: {cv_source}; γ {gamma:.4g}: {gamma_source}; host {host:.4g} ms: {host_source}"
    return replace(config, physics=Physics(step_cv=cv, interference_factor=gamma, host_ms=host),
                   physics_source=source)


NetworkAt = Callable[[int, str], tuple[Network, str]]  # (world size, wire dtype) → (network, source words)


def _row(config: Configuration, **values) -> dict:
    base = {c: config.base[c] for c in ("cell_id",) + CONFIG_COLUMNS}
    return base | values


def per_rank_of(config: Configuration, n: int) -> tuple[int, int]:
    """(per-rank batch on n ranks, the batch T1 is taken at): weak scaling keeps the base's per-rank batch,
    strong scaling its global batch per micro-step; ValueError when that does not divide among n."""
    if config.base["scaling"] == "strong":
        if config.micro_batch % n:
            raise ValueError(f"global batch {config.micro_batch} per micro-step does not divide among {n} "
                             "ranks")
        return config.micro_batch // n, config.micro_batch
    per_rank = int(config.base["per_rank_batch"])
    return per_rank, per_rank


def anchor_of(config: Configuration, n: int, network_at: NetworkAt, algorithm: str,
              physics: Physics) -> tuple[int, float] | None:
    """(m, measured step / model step at m): the configuration's largest ok world size m between its base
    and n with a step time, and how far the model's step there is from the measured one (module
    docstring); None when there is none or the model cannot step there."""
    rows = config.rows
    between = rows[(rows["world_size"] > int(config.base["world_size"])) & (rows["world_size"] < n)]
    between = between.dropna(subset=["step_time_ms_p50"]).sort_values("world_size")
    if between.empty:
        return None
    cell = between.iloc[-1]
    m = int(cell["world_size"])
    try:
        net, _ = network_at(m, COMM_DTYPE_WIRE[config.base["comm_dtype"]])
        model = step_of(config, config.compute.at_batch(per_rank_of(config, m)[0]), net, m, algorithm,
                        physics).step_ms
    except (LookupError, ValueError):
        return None
    return m, float(cell["step_time_ms_p50"]) / model


def project(config: Configuration, network_name: str, network_at: NetworkAt, world_sizes: list[int],
            algorithm: str, physics: Physics | None = None, anchored: bool = False) -> list[dict]:
    """projection.csv rows of one configuration on one network; a world size that cannot be predicted is
    a row with empty numbers and its reason. `physics`: the terms (default physics_of(config));
    `anchored`: the network describes the machine the run measured on, so each world size is anchored to
    the largest measured one below it (anchor_of)."""
    physics = physics_of(config) if physics is None and config.compute is not None else physics
    band_table = bands()
    rows = []
    k = int(config.base["grad_accum"])
    for n in world_sizes:
        row = {"network": network_name, "world_size": n}
        if config.compute is None:
            rows.append(_row(config, **row, reason=config.reason))
            continue
        try:
            per_rank, t1_batch = per_rank_of(config, n)
        except ValueError as exc:
            rows.append(_row(config, **row, reason=str(exc)))
            continue
        try:
            net, source = network_at(n, COMM_DTYPE_WIRE[config.base["comm_dtype"]]) if n > 1 else (None, "")
            compute = config.compute.at_batch(per_rank)
            step = step_of(config, compute, net, n, algorithm, physics)
        except (LookupError, ValueError) as exc:
            rows.append(_row(config, **row, per_rank_batch=per_rank, reason=str(exc).strip("'\"")))
            continue
        anchor = anchor_of(config, n, network_at, algorithm, physics) if anchored and n > 1 else None
        measured = protocol_of(config, anchor, net, n)
        ratio = anchor[1] if anchor else 1.0
        if measured is not None and measured[0] == protocol.NODE:   # the lab's node protocol, exactly
            step, ratio = node_calibrated(config, compute, net, n, anchor, network_at, algorithm, physics)
        t1 = config.compute.at_batch(t1_batch).step_ms
        # never faster than linear (the physical limit): an anchor measured below the model's step does
        # not carry N past T1 (weak scaling) or T1 / N (strong)
        ideal = t1 / n if config.base["scaling"] == "strong" else t1
        step_ms = max(step.step_ms * ratio, ideal)
        eff = (metrics.strong_scaling_efficiency(t1, step_ms, n) if config.base["scaling"] == "strong"
               else metrics.weak_scaling_efficiency(t1, step_ms))
        global_batch = per_rank * n * k
        samples = metrics.throughput(global_batch, step_ms)
        columns = interval_of(config, compute, net, n, algorithm, physics, step, eff * 100, samples,
                              band_table, anchored=anchor is not None)
        delta = columns.pop("delta", 0.0)
        if measured is not None:   # what the user measured has a validated band: print that one
            eff, step_ms, samples, printed_columns = protocol_columns(config, measured, eff, step_ms, samples,
                                                                      delta)
            columns |= printed_columns
        rows.append(_row(
            config, **row, algorithm="+".join(step.algorithms) or "none",
            nodes=_nodes(net, n), per_rank_batch=per_rank, global_batch=global_batch,
            predicted_step_ms=step_ms, predicted_samples_per_s=samples,
            efficiency_pct=eff * 100, exposed_comm_ms=step.exposed_comm_ms, comm_ms=step.comm_ms,
            comm_latency_ms=step.latency_ms, comm_bandwidth_ms=step.bandwidth_ms, bottleneck=step.bottleneck,
            timeline_source=config.buckets.source, network_source=source, reason="",
            straggler_ms=step.straggler_ms, interference_ms=step.interference_ms,
            host_floor_ms=step.host_floor_ms, dominant_term=step.dominant_term,
            anchor_world_size=anchor[0] if anchor else None, anchor_step_ratio=anchor[1] if anchor else None,
            protocol=measured[0] if measured else "", fixed_ms=compute.fixed_ms, **columns))
    return rows


def from_cell(config: Configuration, cell: pd.Series, n: int) -> Configuration:
    """`config` re-based on one of its cells for a projection to n ranks (`bench advise`: the user's recipe
    at the target): strong scaling from the cell's global micro-batch (per_rank_batch × world_size, the
    recipe kept) where that divides among n ranks, else weak scaling from its per-rank batch (the per-GPU
    micro-batch held, the global batch growing with n). The compute side is the configuration's own (it
    scales with the per-rank batch); the rows' cell_id is the cell's, their scaling the rule used."""
    micro, per_rank = int(cell["per_rank_batch"]) * int(cell["world_size"]), int(cell["per_rank_batch"])
    keep = micro % n == 0
    base = config.base.copy()
    base["cell_id"], base["scaling"] = cell["cell_id"], "strong" if keep else "weak"
    base["per_rank_batch"], base["world_size"] = (micro, 1) if keep else (per_rank, 1)
    return replace(config, base=base)


def cells_table(configs: list[Configuration], cells: pd.DataFrame, networks: dict[str, NetworkAt],
                world_sizes: list[int], algorithm: str, anchored: tuple[str, ...] = ()) -> pd.DataFrame:
    """projection.csv's rows for the given cells only, each from its own batch (from_cell) within its
    configuration; a cell of no projected configuration (not ok) is left out. The networks named in
    `anchored` are the run's own (projection_table)."""
    by_key = {config_key(c.base): c for c in configs}
    rows = []
    for _, cell in cells.iterrows():
        config = by_key.get(config_key(cell))
        if config is None:
            continue
        for name, at in networks.items():
            for n in world_sizes:
                rows += project(from_cell(config, cell, n), name, at, [n], algorithm,
                                anchored=name in anchored)
    return _typed(pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS)))


def _nodes(net: Network | None, n: int) -> int | None:
    """Nodes n ranks fill; empty for flat networks, whose ranks sit on no stated node layout."""
    if net is None:
        return 1
    return net.nodes(n) if net.gpus_per_node > 1 else None


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Integer columns as nullable integers (an empty cell stays empty, a count is written as 4, not 4.0)."""
    for col in INT_COLUMNS:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col]).round().astype("Int64")
    return df


def projection_table(configs: list[Configuration], networks: dict[str, NetworkAt], world_sizes: list[int],
                     algorithm: str, anchored: tuple[str, ...] = ()) -> pd.DataFrame:
    """projection.csv: every configuration × network × world size; the networks named in `anchored` are
    the run's own (project's `anchored`)."""
    rows = [r for c in configs for name, at in networks.items()
            for r in project(c, name, at, world_sizes, algorithm, anchored=name in anchored)]
    return _typed(pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS)))


def _error_pct(predicted: float, measured: float) -> float:
    return 100 * (predicted - measured) / measured if measured > 0 else math.nan


def conditions(cell: pd.Series, buckets: Buckets, alpha_known: bool, cpu_cores: int | None) -> str:
    """Where the model is known to break down, as far as the row and the environment tell:
    ranks × threads filling every core (on CPU, gloo's threads and any other process then take time from
    compute, which the compute side measured on fewer ranks never saw), and buckets smaller than the probe
    when the probe could not give α (they come out too cheap)."""
    out = []
    threads = cell.get("threads_per_rank")
    if cell["device"] == "cpu" and cpu_cores and not pd.isna(threads):
        used = int(cell["world_size"]) * int(threads)
        if used >= cpu_cores:
            out.append(f"{int(cell['world_size'])} ranks × {int(threads)} threads fill all {cpu_cores} cores")
    probe = cell.get("allreduce_bytes")
    if not alpha_known and not pd.isna(probe) and min(buckets.sizes) < probe:
        out.append(f"α unknown (α = 0) and buckets down to {min(buckets.sizes)} B, below the probe's "
                   f"{int(probe)} B")
    return "; ".join(out)


def validation_table(configs: list[Configuration], measured: Measured,
                     cpu_cores: int | None = None) -> pd.DataFrame:
    """validation.csv: every ok cell above its configuration's base world size, predicted from the base
    cell's compute side and the run's probe at the cell's own world size. As a diagnostic only, the same
    simulation with the cell's own measured compute-only time (error_with_measured_compute_pct) separates
    the communication model's error from the compute side's."""
    rows = []
    for config in configs:
        for _, cell in config.rows.iloc[1:].iterrows():
            n = int(cell["world_size"])
            measured_ms = cell["step_time_ms_p50"]
            row = {"cell_id": cell["cell_id"], "world_size": n, "measured_step_ms": measured_ms,
                   "base_cell_id": config.base["cell_id"],
                   "measured_compute_only_ms": cell["compute_only_ms_p50"],
                   "measured_exposed_comm_ms": cell["exposed_comm_ms"]}
            if config.compute is None:
                rows.append(row | {"reason": config.reason})
                continue
            try:
                net, source = measured.network_at(n, COMM_DTYPE_WIRE[cell["comm_dtype"]], exact=True)
            except LookupError as exc:
                rows.append(row | {"reason": str(exc).strip("'\"")})
                continue
            compute = config.compute.at_batch(int(cell["per_rank_batch"]))
            physics = physics_of(config)
            step = step_of(config, compute, net, n, "auto", physics)
            diagnostic = math.nan
            if not pd.isna(cell["compute_only_ms_p50"]):
                f = cell["compute_only_ms_p50"] / compute.step_ms
                own = replace(compute, forward_ms=compute.forward_ms * f, backward_ms=compute.backward_ms * f,
                              optimizer_ms=compute.optimizer_ms * f)
                diagnostic = _error_pct(step_of(config, own, net, n, "auto", physics).step_ms, measured_ms)
            rows.append(row | {
                "predicted_step_ms": step.step_ms, "error_pct": _error_pct(step.step_ms, measured_ms),
                "predicted_compute_ms": compute.step_ms, "predicted_exposed_comm_ms": step.exposed_comm_ms,
                "error_with_measured_compute_pct": diagnostic,
                "conditions": conditions(cell, config.buckets, measured.alpha_known(n), cpu_cores),
                "timeline_source": config.buckets.source, "network_source": source, "reason": ""})
    return _typed(pd.DataFrame(rows, columns=list(VALIDATION_COLUMNS)))


def median_abs_error(validation: pd.DataFrame) -> float | None:
    """Median |error_pct| over the validated cells; None when none has a prediction."""
    errors = validation["error_pct"].dropna().abs()
    return float(errors.median()) if len(errors) else None
