"""The report's tables: each a function from the result rows (a DataFrame) to a DataFrame.

Every derived number comes from `bench.metrics`. Cells whose status is not "ok" stay in every table that
covers their configuration, with status and reason and empty numbers: never zeros, never dropped.
"""

from __future__ import annotations

import math

import pandas as pd

from bench import engines, metrics, stats
from bench.schema import CONFIG_KEYS, DEFAULT_BUCKET_MB, without_comm_hook


def config_keys_except(*names: str) -> tuple[str, ...]:
    """The configuration keys (bench.schema.CONFIG_KEYS) less `names`: what rows must share to compare."""
    return tuple(k for k in CONFIG_KEYS if k not in names)


# What identifies a configuration apart from world size within one batch rule (docs/design.md "Metrics");
# the rule adds the batch it keeps: global_batch (strong) or per_rank_batch (weak).
SCALING_GROUP = config_keys_except("world_size", "per_rank_batch", "global_batch", "scaling")
BATCH_KEY = {"strong": "global_batch", "weak": "per_rank_batch"}
# The configuration columns of the per-cell tables: per_rank_batch is left out, global_batch, world_size
# and grad_accum fix it.
CELL_CONFIG = config_keys_except("per_rank_batch")
EFFICIENCY_THRESHOLD_PCT = 80.0
# What names a cell in per-cell listings (cells without numbers, all cells): its id, outcome and settings.
CELL_COLUMNS = ("cell_id", "status", "error", "engine", "world_size", "bucket_cap_mb", "precision",
                "comm_dtype", "grad_accum", "scaling", "global_batch")

STRONG_FORMULA = (
    "strong scaling: speedup = T₁ / T_N (same global batch), efficiency = T₁ / (N · T_N); "
    "T = p50 step time, T₁ = the world-size-1 cell of the same engine, model, size, precision, "
    "comm dtype, accumulation, bucket size and global batch"
)
WEAK_FORMULA = (
    "weak scaling: speedup = throughput_N / throughput₁ = N · T₁ / T_N (same per-rank batch), "
    "efficiency = T₁ / T_N; T = p50 step time, T₁ = the world-size-1 cell of the same engine, "
    "model, size, precision, comm dtype, accumulation, bucket size and per-rank batch"
)
BORROWED_T1 = "T₁ from the comm_dtype=none cell: nothing is communicated at world size 1"
NO_T1_CELL = "no world-size-1 cell of this configuration in the run"
PHASE_COLUMNS = ("forward_ms_p50", "backward_ms_p50", "sync_wait_ms_p50", "optimizer_ms_p50")


def key_text(value) -> str:
    """A configuration value as text for joining: empty for NaN/None, 25.0 and 25 alike ("25")."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int, float)):
        return f"{float(value):g}"
    return str(value)


def engine_options(df: pd.DataFrame) -> pd.Series:
    """The rows' engine_options as text ("" where every option is at its default, or the run predates it)."""
    if "engine_options" not in df:
        return pd.Series("", index=df.index, dtype=str)
    return df["engine_options"].map(key_text)


def config_key(df: pd.DataFrame, keys) -> pd.Series:
    """One join key per row over `keys` (empty matches empty, so naive's collapsed bucket matches itself)."""
    return (
        # a key column the rows lack (a run from before the key existed) reads as empty, its default
        df.reindex(columns=list(keys)).apply(lambda r: "|".join(key_text(v) for v in r), axis=1)
        if len(df)
        else pd.Series([], dtype=str)
    )


def _column(values, df: pd.DataFrame) -> pd.Series:
    """A list computed per row of `df` as a float column on its index (None → NaN)."""
    return pd.Series(values, index=df.index, dtype=float)


def throughputs(df: pd.DataFrame) -> pd.Series:
    """samples/s per row: the runner's value, else global batch / p50 step time; NaN when neither."""
    derived = [metrics.throughput(b, t) for b, t in zip(df["global_batch"], df["step_time_ms_p50"])]
    return df["samples_per_s"].fillna(_column(derived, df))


def exposed_comms(df: pd.DataFrame) -> pd.Series:
    """Exposed communication per row (ms): the runner's value, else p50 step − p50 compute-only step."""
    steps = zip(df["step_time_ms_p50"], df["compute_only_ms_p50"])
    return df["exposed_comm_ms"].fillna(_column([metrics.exposed_comm_ms(s, c) for s, c in steps], df))


def ratio(a: pd.Series, b: pd.Series) -> pd.Series:
    """a / b per row, empty (NaN) where either is missing or b is 0."""
    return a / b.where(b != 0)


def delta_pct(value: pd.Series, reference: pd.Series) -> pd.Series:
    """(value − reference) / reference in % per row: how much larger `value` is."""
    return (ratio(value, reference) - 1.0) * 100.0


def _outcome(df: pd.DataFrame) -> pd.Series:
    """'status: error' per row ('no reason recorded' when the runner left the error empty)."""
    return df["status"] + ": " + df["error"].where(df["error"] != "", "no reason recorded")


def reasons(df: pd.DataFrame) -> pd.Series:
    """'status: error' for each cell without numbers, '' for an ok cell."""
    return _outcome(df).where(df["status"] != "ok", "")


def half_width_pct(df: pd.DataFrame) -> pd.Series:
    """Half the width of each row's 95 % step-time interval, in % of its median (NaN without one)."""
    if "step_time_ms_ci95_low" not in df or "step_time_ms_ci95_high" not in df:
        return pd.Series(float("nan"), index=df.index)
    return (df["step_time_ms_ci95_high"] - df["step_time_ms_ci95_low"]) / 2 / df["step_time_ms_p50"] * 100


def world_sizes(df: pd.DataFrame) -> list[int]:
    return sorted({int(w) for w in df["world_size"].dropna()})


def efficiency_unavailable(df: pd.DataFrame) -> str:
    """Why speedup/efficiency cannot be computed for this run at all ('' when they can)."""
    sizes = world_sizes(df)
    if len(sizes) < 2:
        size = sizes[0] if sizes else "none"
        return (
            f"This run has a single world size ({size}): scaling speedup and efficiency need the "
            f"world-size-1 cell and at least one larger world size, so they are not reported."
        )
    if 1 not in sizes:
        return (
            f"This run has no world-size-1 cells (world sizes {sizes}): efficiency is measured against "
            f"T₁, so it is not reported."
        )
    return ""


def scaling_keys(scaling: str) -> tuple[str, ...]:
    """What a configuration keeps across world sizes in the `scaling` table ("strong" | "weak")."""
    return SCALING_GROUP + (BATCH_KEY[scaling],)


def _sorted(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.sort_values(keys, kind="stable", na_position="first").reset_index(drop=True) if len(df) else df


def _t1_cells(rows: pd.DataFrame, keys: tuple[str, ...]) -> tuple[pd.DataFrame, pd.Series]:
    """Per row (one batch rule, index 0..n-1), the world-size-1 cell of its configuration (a row of NaN when
    the run has none), and whether that cell is the comm_dtype=none one standing in for it.

    The runner skips compressed comm_dtype cells at world size 1 (nothing is communicated there, so they are
    the comm_dtype=none cell: bench/matrix.py); such configurations take T₁ from that cell.
    """
    options = engine_options(rows)
    hook_free = options.map(without_comm_hook)
    group = config_key(rows, keys)
    plain = config_key(rows.assign(comm_dtype="none", engine_options=hook_free), keys)
    ws1, ok = rows["world_size"] == 1, rows["status"] == "ok"
    same = dict(zip(group[ws1], rows.index[ws1]))
    uncompressed = ws1 & (rows["comm_dtype"] == "none") & (options == hook_free)
    stand_in = dict(zip(plain[uncompressed], rows.index[uncompressed]))
    picks, borrowed = [], []
    for g, p, comm, opts, free in zip(group, plain, rows["comm_dtype"], options, hook_free):
        base = same.get(g)
        other = stand_in.get(p) if comm != "none" or opts != free else None
        borrow = (base is None or not ok[base]) and other is not None and ok[other]
        picks.append(other if borrow else -1 if base is None else base)
        borrowed.append(borrow)
    return rows.reindex(picks).reset_index(drop=True), pd.Series(borrowed, dtype=bool)


def _efficiency_columns(rows: pd.DataFrame, scaling: str, t_n: pd.Series, note: pd.Series) -> dict:
    """T₁, speedup and efficiency per row against its world-size-1 cell, and the note saying why one is
    empty."""
    t1_cells, borrowed = _t1_cells(rows, scaling_keys(scaling))
    t_1 = t1_cells["step_time_ms_p50"].where(t1_cells["status"] == "ok")
    if scaling == "strong":
        eff = map(metrics.strong_scaling_efficiency, t_1, t_n, rows["world_size"].astype(int))
    else:
        eff = map(metrics.weak_scaling_efficiency, t_1, t_n)
    thr_1 = _column(list(map(metrics.throughput, t1_cells["global_batch"], t_1)), rows)
    thr_n = _column(list(map(metrics.throughput, rows["global_batch"], t_n)), rows)
    # the first that applies: the cell's own outcome, a borrowed T₁, no T₁ cell, a T₁ cell without numbers
    note = note.mask((note == "") & borrowed, BORROWED_T1)
    note = note.mask((note == "") & t1_cells["status"].isna(), NO_T1_CELL)
    note = note.mask((note == "") & t_1.isna(), "world-size-1 cell " + _outcome(t1_cells))
    return {
        "t1_step_time_ms": t_1,
        "speedup_x": ratio(thr_n, thr_1),
        "efficiency_pct": _column(list(eff), rows) * 100.0,
        "note": note,
    }


def scaling_table(df: pd.DataFrame, scaling: str) -> pd.DataFrame:
    """Throughput, speedup and efficiency per configuration and world size, for one batch rule.

    Columns with units; `note` says why a number is empty. Without a usable world-size-1 run-wide
    (see `efficiency_unavailable`) the speedup and efficiency columns are left out.
    """
    rows = df[df["scaling"] == scaling].reset_index(drop=True)
    config = [*config_keys_except("scaling", "world_size"), "world_size"]  # the scaled axis last
    t_n = rows["step_time_ms_p50"].where(rows["status"] == "ok")
    table = rows[config].assign(
        world_size=rows["world_size"].astype(int),
        status=rows["status"],
        step_time_ms_p50=t_n,
        throughput_samples_per_s=throughputs(rows).where(t_n.notna()),
        # the step-time interval carried over to throughput (= global batch / step): its bounds swap
        throughput_ci95_low=_interval_throughput(rows, "step_time_ms_ci95_high").where(t_n.notna()),
        throughput_ci95_high=_interval_throughput(rows, "step_time_ms_ci95_low").where(t_n.notna()),
        note=reasons(rows),
    )
    if not efficiency_unavailable(df):
        table = table.assign(**_efficiency_columns(rows, scaling, t_n, table["note"]))
    table = table[[c for c in table.columns if c != "note"] + ["note"]].assign(cell_id=rows["cell_id"])
    other_batch = "per_rank_batch" if scaling == "strong" else "global_batch"
    return _sorted(table, [k for k in config if k != other_batch])


def _interval_throughput(rows: pd.DataFrame, step_column: str) -> pd.Series:
    """samples/s at one bound of the step-time interval (NaN for rows without one)."""
    if step_column not in rows:
        return pd.Series(float("nan"), index=rows.index)
    return rows["global_batch"] / rows[step_column] * 1e3


def is_reference(df: pd.DataFrame) -> pd.Series:
    """Rows of plain torch DDP: the reference engine (bench.engines.reference) with every option at its
    default, what every other configuration is compared with."""
    return (df["engine"] == engines.reference().name) & (engine_options(df) == "")


def _torch_match(df: pd.DataFrame) -> list[int]:
    """For every row of `df` (index 0..n-1), the row of the torch DDP cell it is compared with, -1 for none:
    the same configuration and bucket size; naive (no buckets) → torch at its default bucket size, else at its
    fastest bucket size in that configuration."""
    # plain torch DDP (every option at its default) is the reference, also for torch with a hook or compiled
    torch_rows = df[is_reference(df)]
    keys = config_keys_except("engine", "bucket_cap_mb", "engine_options")
    candidates: dict[str, list[int]] = {}
    for k, i in zip(config_key(torch_rows, keys), torch_rows.index):
        candidates.setdefault(k, []).append(i)
    buckets, steps = df["bucket_cap_mb"], df["step_time_ms_p50"].where(df["status"] == "ok")
    match = []
    for k, bucket in zip(config_key(df, keys), buckets):
        here = candidates.get(k, [])
        same = [i for i in here if key_text(buckets[i]) == key_text(bucket)]
        if not same and pd.isna(bucket):
            same = [i for i in here if buckets[i] == DEFAULT_BUCKET_MB]
            timed = [i for i in here if pd.notna(steps[i])]
            if not same and timed:  # no torch cell at the default size: torch at its fastest here
                same = [min(timed, key=lambda i: steps[i])]
        match.append(same[0] if same else -1)
    return match


# engines_vs_torch: each measured column → its difference column (a difference in ms or a delta in %).
DELTAS = {
    "step_time_ms_p50": "delta_p50_pct",
    "step_time_ms_p90": "delta_p90_pct",
    "exposed_comm_ms": "delta_exposed_comm_ms",
    "peak_mem_mb": "delta_peak_mem_pct",
}


def _measured(rows: pd.DataFrame) -> dict[str, pd.Series]:
    """The numbers engines_vs_torch compares, empty unless the cell is ok."""
    ok = rows["status"] == "ok"
    return {
        "step_time_ms_p50": rows["step_time_ms_p50"].where(ok),
        "step_time_ms_p90": rows["step_time_ms_p90"].where(ok),
        "exposed_comm_ms": exposed_comms(rows).where(ok),
        "peak_mem_mb": rows["peak_mem_mb"].where(ok),
    }


def family_verdicts(df: pd.DataFrame) -> pd.Series:
    """Each row's verdict against torch DDP once the run's comparisons are taken as one family: Holm's
    correction (bench.stats.holm, family-wise error ≤ 5 %) over every row with a sign-test p-value
    (speed_vs_torch_p); a "faster"/"slower" whose test does not survive becomes "within noise". Rows
    without a p-value (result files from before it) keep verdict_vs_torch, uncorrected; None: no verdict."""
    raw = [stats.verdict(lo, hi) if pd.notna(lo) and pd.notna(hi) else None for lo, hi in zip(
        df.get("speed_vs_torch_ci95_low", pd.Series(float("nan"), index=df.index)),
        df.get("speed_vs_torch_ci95_high", pd.Series(float("nan"), index=df.index)))]
    p_values = pd.to_numeric(df.get("speed_vs_torch_p", pd.Series(float("nan"), index=df.index)),
                             errors="coerce")
    ok = (df["status"] == "ok") if "status" in df else pd.Series(True, index=df.index)
    tested = [float(p) if pd.notna(p) and k and v else None for p, k, v in zip(p_values, ok, raw)]
    survives = stats.holm(tested)
    out = [v if s is None or v in (None, "within noise") or s else "within noise"
           for v, s in zip(raw, survives)]
    return pd.Series(out, index=df.index, dtype=object)


def engines_vs_torch(df: pd.DataFrame) -> pd.DataFrame:
    """Each cell other than plain torch DDP (other engines, and torch with engine options: a comm hook,
    compile, static graph) against plain torch DDP on the same configuration: delta % (positive =
    slower/larger).

    naive has no bucket size; it is compared with the torch cell at torch's default bucket size
    (bench.schema.DEFAULT_BUCKET_MB), or, when the run has none, with torch at its fastest bucket size in the
    same configuration.
    """
    df = df.reset_index(drop=True)
    mine = ~is_reference(df)  # torch with a hook or compiled too
    if not mine.any():
        return pd.DataFrame()
    cells = df[mine].reset_index(drop=True)
    torch_cells = df.reindex([m for m, x in zip(_torch_match(df), mine) if x]).reset_index(drop=True)
    table = cells[list(CELL_CONFIG)].assign(world_size=cells["world_size"].astype(int))
    at = table.columns.get_loc("bucket_cap_mb") + 1  # the torch cell's bucket size beside this cell's
    table.insert(at, "torch_bucket_cap_mb", torch_cells["bucket_cap_mb"])
    table["status"] = cells["status"]
    ours, theirs = _measured(cells), _measured(torch_cells)
    for name, delta in DELTAS.items():
        table[name], table[f"torch_{name}"] = ours[name], theirs[name]
        diff = ours[name] - theirs[name] if delta.endswith("_ms") else delta_pct(ours[name], theirs[name])
        table[delta] = diff
    # Measured side by side in one group (paired over rounds, with an interval): preferred over the deltas of
    # separately read medians above; empty for cells that did not run beside their torch cell.
    for col in ("speed_vs_torch", "speed_vs_torch_ci95_low", "speed_vs_torch_ci95_high", "verdict_vs_torch"):
        table[col] = cells[col] if col in cells else (None if col == "verdict_vs_torch" else float("nan"))
    # the verdict that holds across the run's comparisons (Holm): what the findings say
    table["verdict_holm"] = family_verdicts(df)[mine].reset_index(drop=True)
    note = reasons(cells)
    note = note.mask((note == "") & torch_cells["status"].isna(), "no torch DDP cell with this configuration")
    note = note.mask((note == "") & (torch_cells["status"] != "ok"), "torch cell " + _outcome(torch_cells))
    table = table.assign(note=note, cell_id=cells["cell_id"])
    order = ["engine", "scaling", "precision", "comm_dtype", "grad_accum", "world_size", "bucket_cap_mb"]
    return _sorted(table, order)


def _sweep(df: pd.DataFrame, fixed: tuple[str, ...], varied: tuple[str, ...], extra) -> pd.DataFrame:
    """The rows of groups equal on `fixed` that hold several values of `varied`: status, p50 step, throughput
    and exposed communication (empty unless ok), then the columns extra(rows, group, throughput) returns."""
    if not len(df):
        return pd.DataFrame()
    group = config_key(df, fixed)
    swept = config_key(df, varied).groupby(group).transform("nunique") > 1
    rows, group = df[swept], group[swept]
    ok = rows["status"] == "ok"
    throughput = throughputs(rows).where(ok)
    table = rows[list(fixed + varied)].assign(
        status=rows["status"],
        step_time_ms_p50=rows["step_time_ms_p50"].where(ok),
        throughput_samples_per_s=throughput,
        exposed_comm_ms=exposed_comms(rows).where(ok),
        **extra(rows, group, throughput),
        note=reasons(rows),
        cell_id=rows["cell_id"],
    )
    return _sorted(table, list(fixed + varied))


def _group_reference(values: pd.Series, group: pd.Series, mask: pd.Series) -> pd.Series:
    """Per row, `values` at the first row of its group where `mask` holds (NaN when there is none)."""
    first = group[mask].drop_duplicates()
    return group.map(pd.Series(values[first.index].to_numpy(), index=first.to_numpy()))


def bucket_sweep(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that differ only in bucket_cap_mb, with throughput relative to the group's best bucket."""

    def extra(rows, group, throughput):
        best = throughput.fillna(0.0).where(rows["status"] == "ok").groupby(group).transform("max")
        return {
            "n_buckets": rows["n_buckets"],
            "throughput_vs_best_pct": (throughput / best * 100.0).where(best != 0),
        }

    fixed = config_keys_except("bucket_cap_mb")
    return _sweep(df[df["bucket_cap_mb"].notna()], fixed, ("bucket_cap_mb",), extra)


def precision_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that differ only in compute dtype (precision) and gradient comm dtype, against fp32."""

    def extra(rows, group, throughput):
        fp32 = (rows["status"] == "ok") & (rows["precision"] == "fp32") & (rows["comm_dtype"] == "none")
        return {"speedup_vs_fp32_x": ratio(throughput, _group_reference(throughput, group, fp32))}

    return _sweep(df, config_keys_except("precision", "comm_dtype"), ("precision", "comm_dtype"), extra)


def accumulation_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that differ only in grad_accum (the global batch grows with it), against grad_accum = 1."""

    def extra(rows, group, throughput):
        accum1 = (rows["status"] == "ok") & (rows["grad_accum"] == 1)
        exposed, step = exposed_comms(rows).where(rows["status"] == "ok"), rows["step_time_ms_p50"]
        return {
            "global_batch": rows["global_batch"],
            "throughput_vs_accum1_x": ratio(throughput, _group_reference(throughput, group, accum1)),
            "exposed_comm_share_pct": (exposed / step * 100.0).where(step != 0),
        }

    return _sweep(df, config_keys_except("grad_accum", "global_batch"), ("grad_accum",), extra)


def phase_breakdown(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell: p50 step = compute-only step + exposed communication, and the measured phases if any."""
    if not len(df):
        return pd.DataFrame()
    ok = df["status"] == "ok"
    step, exposed = df["step_time_ms_p50"].where(ok), exposed_comms(df).where(ok)
    table = df[list(CELL_CONFIG)].assign(
        status=df["status"],
        step_time_ms_p50=step,
        compute_only_ms_p50=df["compute_only_ms_p50"].where(ok),
        exposed_comm_ms=exposed,
        exposed_comm_share_pct=(exposed / step * 100.0).where(step != 0),
        **{p: df[p].where(ok) for p in PHASE_COLUMNS if df[p].notna().any()},
        note=reasons(df),
        cell_id=df["cell_id"],
    )
    order = ["scaling", "precision", "comm_dtype", "grad_accum", "bucket_cap_mb", "world_size", "engine"]
    return _sorted(table, order)
