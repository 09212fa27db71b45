"""validation.csv: every ok cell above its configuration's base world size, predicted from the base cell's
compute side and the run's probe at the cell's own world size, with where the model is known to break
down (conditions); and the median |error| `bench project` prints.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from bench.project.columns import VALIDATION_COLUMNS, typed
from bench.project.configuration import Configuration, step_of
from bench.project.evidence import physics_of
from bench.project.inputs import COMM_DTYPE_WIRE
from bench.project.measured import Measured
from bench.project.simulate import Buckets


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
    return typed(pd.DataFrame(rows, columns=list(VALIDATION_COLUMNS)))


def median_abs_error(validation: pd.DataFrame) -> float | None:
    """Median |error_pct| over the validated cells; None when none has a prediction."""
    errors = validation["error_pct"].dropna().abs()
    return float(errors.median()) if len(errors) else None
