"""The report's tables: each a function from the result rows (a DataFrame) to a DataFrame.

Every derived number comes from `bench.metrics`. Cells whose status is not "ok" stay in every table that
covers their configuration, with status and reason and empty numbers: never zeros, never dropped.
"""

from __future__ import annotations

import math

import pandas as pd

from bench import metrics
from bench.schema import CONFIG_KEYS, DEFAULT_BUCKET_MB


def config_keys_except(*names: str) -> tuple[str, ...]:
    """The configuration keys (bench.schema.CONFIG_KEYS) less `names`: what rows must share to compare."""
    return tuple(k for k in CONFIG_KEYS if k not in names)


# What identifies a configuration apart from world size within one batch rule (DESIGN.md "T1"); the rule
# adds the batch it keeps: global_batch (strong) or per_rank_batch (weak).
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


def key_text(value) -> str:
    """A configuration value as text for joining: empty for NaN/None, 25.0 and 25 alike ("25")."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int, float)):
        return f"{float(value):g}"
    return str(value)


def config_key(df: pd.DataFrame, keys) -> pd.Series:
    """One join key per row over `keys` (empty matches empty, so naive's collapsed bucket matches itself)."""
    return (
        df[list(keys)].apply(lambda r: "|".join(key_text(v) for v in r), axis=1)
        if len(df)
        else pd.Series([], dtype=str)
    )


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def row_throughput(r) -> float | None:
    """samples/s of a row: the runner's value, else global batch / p50 step time."""
    if _num(r["samples_per_s"]) is not None:
        return float(r["samples_per_s"])
    return metrics.throughput(_num(r["global_batch"]), _num(r["step_time_ms_p50"]))


def row_exposed_comm(r) -> float | None:
    """Exposed communication of a row: the runner's value, else p50 step − p50 compute-only step."""
    if _num(r["exposed_comm_ms"]) is not None:
        return float(r["exposed_comm_ms"])
    return metrics.exposed_comm_ms(_num(r["step_time_ms_p50"]), _num(r["compute_only_ms_p50"]))


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, empty when either is missing or b is 0."""
    return None if a is None or b is None or b == 0 else a / b


def delta_pct(value: float | None, reference: float | None) -> float | None:
    """(value − reference) / reference in %: how much larger `value` is."""
    r = ratio(value, reference)
    return None if r is None else (r - 1.0) * 100.0


def reason(r) -> str:
    """'status: error' for a cell without numbers, '' for an ok cell."""
    return "" if r["status"] == "ok" else f"{r['status']}: {r['error'] or 'no reason recorded'}"


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


def _with_keys(df: pd.DataFrame, scaling: str) -> pd.DataFrame:
    out = df.copy()
    out["_group"] = config_key(out, scaling_keys(scaling))
    return out


def scaling_table(df: pd.DataFrame, scaling: str) -> pd.DataFrame:
    """Throughput, speedup and efficiency per configuration and world size, for one batch rule.

    Columns with units; `note` says why a number is empty. Without a usable world-size-1 run-wide
    (see `efficiency_unavailable`) the speedup and efficiency columns are left out.
    """
    rows = _with_keys(df[df["scaling"] == scaling], scaling)
    with_efficiency = not efficiency_unavailable(df)
    baselines = {g: r for g, r in rows[rows["world_size"] == 1].set_index("_group", drop=False).iterrows()}
    # The runner skips compressed comm_dtype cells at world size 1 (nothing is communicated there, so they
    # are the comm_dtype=none cell: bench/matrix.py); such configurations take T1 from that cell.
    rows["_plain"] = config_key(rows.assign(comm_dtype="none"), scaling_keys(scaling))
    plain_baselines = {
        k: r
        for k, (_, r) in zip(rows["_plain"], rows.iterrows())
        if r["world_size"] == 1 and r["comm_dtype"] == "none"
    }
    out = []
    for _, r in rows.iterrows():
        n = int(r["world_size"])
        t_n = _num(r["step_time_ms_p50"]) if r["status"] == "ok" else None
        rec = {k: r[k] for k in SCALING_GROUP}
        rec.update(
            per_rank_batch=r["per_rank_batch"],
            global_batch=r["global_batch"],
            world_size=n,
            status=r["status"],
            step_time_ms_p50=t_n,
            throughput_samples_per_s=row_throughput(r) if t_n is not None else None,
        )
        note = reason(r)
        if with_efficiency:
            base = baselines.get(r["_group"])
            plain = plain_baselines.get(r["_plain"]) if r["comm_dtype"] != "none" else None
            if (base is None or base["status"] != "ok") and plain is not None and plain["status"] == "ok":
                base = plain
                note = note or "T₁ from the comm_dtype=none cell: nothing is communicated at world size 1"
            t_1 = _num(base["step_time_ms_p50"]) if base is not None and base["status"] == "ok" else None
            if not note and base is None:
                note = "no world-size-1 cell of this configuration in the run"
            elif not note and t_1 is None:
                note = f"world-size-1 cell {base['status']}: {base['error'] or 'no reason recorded'}"
            eff = (
                metrics.strong_scaling_efficiency(t_1, t_n, n)
                if scaling == "strong"
                else metrics.weak_scaling_efficiency(t_1, t_n)
            )
            thr_1 = metrics.throughput(_num(base["global_batch"]), t_1) if t_1 is not None else None
            thr_n = metrics.throughput(_num(r["global_batch"]), t_n)
            rec.update(
                t1_step_time_ms=t_1,
                speedup_x=ratio(thr_n, thr_1),
                efficiency_pct=None if eff is None else eff * 100.0,
            )
        rec.update(note=note, cell_id=r["cell_id"])
        out.append(rec)
    config = [*config_keys_except("scaling", "world_size"), "world_size"]  # the scaled axis last
    cols = [*config, "status", "step_time_ms_p50", "throughput_samples_per_s"]
    cols += ["t1_step_time_ms", "speedup_x", "efficiency_pct"] if with_efficiency else []
    table = pd.DataFrame(out, columns=cols + ["note", "cell_id"])
    other_batch = "per_rank_batch" if scaling == "strong" else "global_batch"
    return _sorted(table, [k for k in config if k != other_batch])


def _sorted(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.sort_values(keys, kind="stable", na_position="first").reset_index(drop=True) if len(df) else df


def _torch_match(df: pd.DataFrame) -> dict[str, pd.Series]:
    """For every row, the torch DDP row it is compared with (same configuration; naive → torch default)."""
    torch_rows = df[df["engine"] == "torch"]
    keys = config_keys_except("engine", "bucket_cap_mb")
    by_key: dict[str, list[pd.Series]] = {}
    for k, (_, t) in zip(config_key(torch_rows, keys), torch_rows.iterrows()):
        by_key.setdefault(k, []).append(t)
    match = {}
    for k, (_, r) in zip(config_key(df, keys), df.iterrows()):
        candidates = by_key.get(k, [])
        same_bucket = [t for t in candidates if key_text(t["bucket_cap_mb"]) == key_text(r["bucket_cap_mb"])]
        if not same_bucket and pd.isna(r["bucket_cap_mb"]):
            same_bucket = [t for t in candidates if _num(t["bucket_cap_mb"]) == DEFAULT_BUCKET_MB]
            ok = [t for t in candidates if t["status"] == "ok" and _num(t["step_time_ms_p50"]) is not None]
            if not same_bucket and ok:  # no torch cell at the default size: torch at its fastest here
                same_bucket = [min(ok, key=lambda t: float(t["step_time_ms_p50"]))]
        if same_bucket:
            match[r["cell_id"]] = same_bucket[0]
    return match


def engines_vs_torch(df: pd.DataFrame) -> pd.DataFrame:
    """Each non-torch cell against torch DDP on the same configuration: delta % (positive = slower/larger).

    naive has no bucket size; it is compared with the torch cell at torch's default bucket size
    (bench.schema.DEFAULT_BUCKET_MB), or, when the run has none, with torch at its fastest bucket size in the
    same configuration.
    """
    match = _torch_match(df)
    out = []
    for _, r in df[df["engine"] != "torch"].iterrows():
        t = match.get(r["cell_id"])
        ok = r["status"] == "ok"
        t_ok = t is not None and t["status"] == "ok"
        mine = {
            "p50": _num(r["step_time_ms_p50"]) if ok else None,
            "p90": _num(r["step_time_ms_p90"]) if ok else None,
            "exp": row_exposed_comm(r) if ok else None,
            "mem": _num(r["peak_mem_mb"]) if ok else None,
        }
        ref = {
            "p50": _num(t["step_time_ms_p50"]) if t_ok else None,
            "p90": _num(t["step_time_ms_p90"]) if t_ok else None,
            "exp": row_exposed_comm(t) if t_ok else None,
            "mem": _num(t["peak_mem_mb"]) if t_ok else None,
        }
        note = reason(r)
        if not note:
            note = (
                "no torch DDP cell with this configuration"
                if t is None
                else ""
                if t_ok
                else f"torch cell {t['status']}: {t['error'] or 'no reason recorded'}"
            )
        rec = {}
        for k in CELL_CONFIG:  # the torch cell's bucket size right after this cell's
            rec[k] = int(r[k]) if k == "world_size" else r[k]
            if k == "bucket_cap_mb":
                rec["torch_bucket_cap_mb"] = None if t is None else t["bucket_cap_mb"]
        out.append(
            {
                **rec,
                "status": r["status"],
                "step_time_ms_p50": mine["p50"],
                "torch_step_time_ms_p50": ref["p50"],
                "delta_p50_pct": delta_pct(mine["p50"], ref["p50"]),
                "step_time_ms_p90": mine["p90"],
                "torch_step_time_ms_p90": ref["p90"],
                "delta_p90_pct": delta_pct(mine["p90"], ref["p90"]),
                "exposed_comm_ms": mine["exp"],
                "torch_exposed_comm_ms": ref["exp"],
                "delta_exposed_comm_ms": None
                if mine["exp"] is None or ref["exp"] is None
                else mine["exp"] - ref["exp"],
                "peak_mem_mb": mine["mem"],
                "torch_peak_mem_mb": ref["mem"],
                "delta_peak_mem_pct": delta_pct(mine["mem"], ref["mem"]),
                "note": note,
                "cell_id": r["cell_id"],
            }
        )
    return (
        _sorted(
            pd.DataFrame(out),
            ["engine", "scaling", "precision", "comm_dtype", "grad_accum", "world_size", "bucket_cap_mb"],
        )
        if out
        else pd.DataFrame(out)
    )


def _sweep(df: pd.DataFrame, fixed: tuple[str, ...], varied: tuple[str, ...], extra) -> pd.DataFrame:
    """Rows of groups equal on `fixed` that hold several values of `varied`, plus extra(row, group)."""
    if not len(df):
        return pd.DataFrame()
    d = df.copy()
    d["_group"] = config_key(d, fixed)
    d["_varied"] = config_key(d, varied)
    groups = d.groupby("_group")["_varied"].nunique()
    d = d[d["_group"].isin(groups[groups > 1].index)]
    out = []
    for _, group in d.groupby("_group", sort=False):
        for _, r in group.iterrows():
            ok = r["status"] == "ok"
            rec = {k: r[k] for k in fixed + varied}
            rec.update(
                status=r["status"],
                step_time_ms_p50=_num(r["step_time_ms_p50"]) if ok else None,
                throughput_samples_per_s=row_throughput(r) if ok else None,
                exposed_comm_ms=row_exposed_comm(r) if ok else None,
            )
            rec.update(extra(r, group))
            rec.update(note=reason(r), cell_id=r["cell_id"])
            out.append(rec)
    return _sorted(pd.DataFrame(out), list(fixed + varied))


def _ok_throughput(group: pd.DataFrame, mask) -> float | None:
    ref = group[mask & (group["status"] == "ok")]
    return row_throughput(ref.iloc[0]) if len(ref) else None


def bucket_sweep(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that differ only in bucket_cap_mb, with throughput relative to the group's best bucket."""
    fixed = config_keys_except("bucket_cap_mb")

    def extra(r, group):
        ok = group[group["status"] == "ok"]
        best = max((row_throughput(x) or 0.0 for _, x in ok.iterrows()), default=None)
        mine = row_throughput(r) if r["status"] == "ok" else None
        return {
            "n_buckets": r["n_buckets"],
            "throughput_vs_best_pct": None if mine is None or not best else mine / best * 100.0,
        }

    return _sweep(df[df["bucket_cap_mb"].notna()], fixed, ("bucket_cap_mb",), extra)


def precision_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that differ only in compute dtype (precision) and gradient comm dtype, against fp32."""
    fixed = config_keys_except("precision", "comm_dtype")

    def extra(r, group):
        base = _ok_throughput(
            group, (group["precision"] == "fp32") & (group["comm_dtype"] == "none")
        )
        mine = row_throughput(r) if r["status"] == "ok" else None
        return {"speedup_vs_fp32_x": ratio(mine, base)}

    return _sweep(df, fixed, ("precision", "comm_dtype"), extra)


def accumulation_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that differ only in grad_accum (the global batch grows with it), against grad_accum = 1."""
    fixed = config_keys_except("grad_accum", "global_batch")

    def extra(r, group):
        base = _ok_throughput(group, group["grad_accum"] == 1)
        ok = r["status"] == "ok"
        mine = row_throughput(r) if ok else None
        exposed = row_exposed_comm(r) if ok else None
        return {
            "global_batch": r["global_batch"],
            "throughput_vs_accum1_x": ratio(mine, base),
            "exposed_comm_share_pct": None
            if exposed is None
            else exposed / float(r["step_time_ms_p50"]) * 100.0,
        }

    return _sweep(df, fixed, ("grad_accum",), extra)


def phase_breakdown(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell: p50 step = compute-only step + exposed communication, and the measured phases if any."""
    phases = [
        c
        for c in ("forward_ms_p50", "backward_ms_p50", "sync_wait_ms_p50", "optimizer_ms_p50")
        if df[c].notna().any()
    ]
    out = []
    for _, r in df.iterrows():
        ok = r["status"] == "ok"
        step = _num(r["step_time_ms_p50"]) if ok else None
        exposed = row_exposed_comm(r) if ok else None
        rec = {k: r[k] for k in CELL_CONFIG}
        rec.update(
            status=r["status"],
            step_time_ms_p50=step,
            compute_only_ms_p50=_num(r["compute_only_ms_p50"]) if ok else None,
            exposed_comm_ms=exposed,
            exposed_comm_share_pct=None if exposed is None or not step else exposed / step * 100.0,
        )
        rec.update({p: _num(r[p]) if ok else None for p in phases})
        rec.update(note=reason(r), cell_id=r["cell_id"])
        out.append(rec)
    return (
        _sorted(
            pd.DataFrame(out),
            ["scaling", "precision", "comm_dtype", "grad_accum", "bucket_cap_mb", "world_size", "engine"],
        )
        if out
        else pd.DataFrame(out)
    )


def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell whose status is not ok, with its reason."""
    bad = df[df["status"] != "ok"]
    return bad[list(CELL_COLUMNS)].rename(columns={"error": "reason"}).reset_index(drop=True)
