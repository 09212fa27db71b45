"""A run's configurations, projected over world sizes (projection.csv) and checked against the world sizes
the run measured (validation.csv). Definitions: docs/design.md "Projection".

A configuration is every result row that shares the keys below except the world size. Its base cell is its
smallest world size with status ok: the compute side (forward, backward, optimizer) comes from there only,
so validation never sees the step times it predicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate

import pandas as pd

from bench import engines, metrics
from bench.project.evidence import TraceEvidence, host_ms_of, interference_of
from bench.project.inputs import COMM_DTYPE_WIRE, InputError, ReadyTimes, timeline_buckets
from bench.project.measured import Measured
from bench.project.network import Network
from bench.project.physics import Physics, expected_max_normal
from bench.project.simulate import Buckets, Compute, simulate_step
from bench.schema import ENGINE_OPTION_NAMES, LOSSY_COMM_HOOKS, WIRE_DTYPES

CONFIG_COLUMNS = ("engine", "model", "model_size", "bucket_cap_mb", "precision", "comm_dtype", "grad_accum",
                  "scaling")
PROJECTION_COLUMNS = ("cell_id",) + CONFIG_COLUMNS + (
    "network", "algorithm", "world_size", "nodes", "per_rank_batch", "global_batch", "predicted_step_ms",
    "predicted_samples_per_s", "efficiency_pct", "exposed_comm_ms", "comm_ms", "comm_latency_ms",
    "comm_bandwidth_ms", "bottleneck", "timeline_source", "network_source", "reason", "straggler_ms",
    "interference_ms", "host_floor_ms", "dominant_term")
VALIDATION_COLUMNS = ("cell_id", "world_size", "measured_step_ms", "predicted_step_ms", "error_pct",
                      "base_cell_id", "measured_compute_only_ms", "predicted_compute_ms",
                      "measured_exposed_comm_ms", "predicted_exposed_comm_ms",
                      "error_with_measured_compute_pct", "conditions", "timeline_source", "network_source",
                      "reason")
INT_COLUMNS = ("grad_accum", "world_size", "nodes", "per_rank_batch", "global_batch")


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
    """Why the model cannot project this configuration yet ("" when it can)."""
    collectives = engines.get(base["engine"]).collectives
    if collectives != ("all_reduce",):
        return (f"engine {base['engine']} issues {' + '.join(collectives)}: the model projects all-reduces "
                "only (an all-gather and a reduce-scatter per block, with prefetch overlap, not yet)")
    if base.get("comm_hook") in LOSSY_COMM_HOOKS:
        return f"comm_hook={base['comm_hook']}: its compressed low-rank all-reduces are not modelled yet"
    return ""


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
                   layout: Callable[[pd.Series], list[int]] | None) -> list[Configuration]:
    """Every configuration with at least one ok cell, each from its smallest ok world size."""
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
            out.append(Configuration(base, rows, compute_of(base), buckets_of(rows, base, timeline, layout)))
        except InputError:  # a broken file is the run's error, not this configuration's
            raise
        except ValueError as exc:
            out.append(Configuration(base, rows, None, None, reason=str(exc)))
    return out


Z90 = 1.2816  # the standard normal's 90th percentile


def step_cv_of(row: pd.Series) -> tuple[float, str]:
    """σ, the per-rank step-time spread (standard deviation / median) the straggler term draws from, and
    where it came from. On more than one rank the median slowest-minus-fastest gap is the expected range
    of n draws, 2·σ·T·E[Z_(n)]: on a GPU run the gap of the compute-only rounds over their median (under
    NCCL every rank of a timed step ends on the same collective, so its gap is ≈ 0), else that of the
    timed steps; on one rank, (p90 − p50)/z90 over p50; else 0 (nothing measured)."""
    t = row.get("step_time_ms_p50")
    if pd.isna(t) or not t > 0:
        return 0.0, "no step times"
    n = int(row["world_size"])
    co_skew, co_t = row.get("compute_only_rank_skew_ms_p50"), row.get("compute_only_ms_p50")
    if n > 1 and row.get("device") == "cuda" and not pd.isna(co_skew) and not pd.isna(co_t) and co_t > 0:
        return (max(0.0, co_skew / (2 * co_t * expected_max_normal(n))),
                f"compute_only_rank_skew_ms_p50 of {row['cell_id']}")
    skew = row.get("rank_skew_ms_p50")
    if n > 1 and not pd.isna(skew):
        return max(0.0, skew / (2 * t * expected_max_normal(n))), f"rank_skew_ms_p50 of {row['cell_id']}"
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


def project(config: Configuration, network_name: str, network_at: NetworkAt, world_sizes: list[int],
            algorithm: str, physics: Physics | None = None) -> list[dict]:
    """projection.csv rows of one configuration on one network; a world size that cannot be predicted is
    a row with empty numbers and its reason. `physics`: the terms (default physics_of(config))."""
    physics = physics_of(config) if physics is None and config.compute is not None else physics
    rows = []
    k = int(config.base["grad_accum"])
    for n in world_sizes:
        row = {"network": network_name, "world_size": n}
        if config.compute is None:
            rows.append(_row(config, **row, reason=config.reason))
            continue
        if config.base["scaling"] == "strong":
            if config.micro_batch % n:
                why = f"global batch {config.micro_batch} per micro-step does not divide among {n} ranks"
                rows.append(_row(config, **row, reason=why))
                continue
            per_rank, t1_batch = config.micro_batch // n, config.micro_batch
        else:
            per_rank = t1_batch = int(config.base["per_rank_batch"])
        try:
            net, source = network_at(n, COMM_DTYPE_WIRE[config.base["comm_dtype"]]) if n > 1 else (None, "")
            step = simulate_step(config.compute.at_batch(per_rank), config.buckets, net, n, algorithm,
                                 physics)
        except (LookupError, ValueError) as exc:
            rows.append(_row(config, **row, per_rank_batch=per_rank, reason=str(exc).strip("'\"")))
            continue
        t1 = config.compute.at_batch(t1_batch).step_ms
        eff = (metrics.strong_scaling_efficiency(t1, step.step_ms, n) if config.base["scaling"] == "strong"
               else metrics.weak_scaling_efficiency(t1, step.step_ms))
        global_batch = per_rank * n * k
        rows.append(_row(
            config, **row, algorithm="+".join(step.algorithms) or "none",
            nodes=_nodes(net, n), per_rank_batch=per_rank, global_batch=global_batch,
            predicted_step_ms=step.step_ms,
            predicted_samples_per_s=metrics.throughput(global_batch, step.step_ms),
            efficiency_pct=eff * 100, exposed_comm_ms=step.exposed_comm_ms, comm_ms=step.comm_ms,
            comm_latency_ms=step.latency_ms, comm_bandwidth_ms=step.bandwidth_ms, bottleneck=step.bottleneck,
            timeline_source=config.buckets.source, network_source=source, reason="",
            straggler_ms=step.straggler_ms, interference_ms=step.interference_ms,
            host_floor_ms=step.host_floor_ms, dominant_term=step.dominant_term))
    return rows


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
                     algorithm: str) -> pd.DataFrame:
    """projection.csv: every configuration × network × world size."""
    rows = [r for c in configs for name, at in networks.items() for r in project(c, name, at, world_sizes,
                                                                                   algorithm)]
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
            step = simulate_step(compute, config.buckets, net, n, physics=physics)
            diagnostic = math.nan
            if not pd.isna(cell["compute_only_ms_p50"]):
                f = cell["compute_only_ms_p50"] / compute.step_ms
                own = replace(compute, forward_ms=compute.forward_ms * f, backward_ms=compute.backward_ms * f,
                              optimizer_ms=compute.optimizer_ms * f)
                diagnostic = _error_pct(simulate_step(own, config.buckets, net, n, physics=physics).step_ms,
                                        measured_ms)
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
