"""The columns of what `bench project` writes: projection.csv (one row per configuration × network × world
size) and validation.csv (one row per measured cell above its configuration's base), the integer ones
written as counts, and the columns whose values make result rows one configuration (config_key).
Definitions: docs/design.md "Projection"."""

from __future__ import annotations

import pandas as pd

from bench.schema import ENGINE_OPTION_NAMES

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
# engine options make two rows different configurations; a run folder written before they existed has
# none of these columns
OPTION_COLUMNS = ENGINE_OPTION_NAMES


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """Integer columns as nullable integers (an empty cell stays empty, a count is written as 4, not 4.0)."""
    for col in INT_COLUMNS:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col]).round().astype("Int64")
    return df


def config_key(row: pd.Series) -> tuple:
    """The keys that make two rows one configuration: CONFIG_COLUMNS plus the batch scaling keeps."""
    batch = row["global_batch"] if row["scaling"] == "strong" else row["per_rank_batch"]
    options = tuple("" if pd.isna(row[c]) else row[c] for c in OPTION_COLUMNS if c in row.index)
    return tuple("" if pd.isna(row[c]) else row[c] for c in CONFIG_COLUMNS) + (batch,) + options
