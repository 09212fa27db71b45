"""The report's plots: a thin last layer, one function per figure, each taking a table and writing a PNG.

Headless (Agg). Cells without numbers are drawn as their status word where a bar would be, never as 0.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench.report import tables  # noqa: E402

DPI = 110
LABEL_KEYS = (
    "engine",
    "model",
    "model_size",
    "precision",
    "comm_dtype",
    "grad_accum",
    "bucket_cap_mb",
    "per_rank_batch",
    "global_batch",
    "world_size",
)
SHORT = {
    "model_size": "",
    "comm_dtype": "comm ",
    "grad_accum": "accum ",
    "bucket_cap_mb": "bucket ",
    "per_rank_batch": "per-rank batch ",
    "global_batch": "batch ",
    "world_size": "ws ",
}


def _labels(df: pd.DataFrame, keys) -> pd.Series:
    """A label per row naming only the keys that vary across `df` (engine always)."""
    varying = [k for k in keys if k in df and (k == "engine" or df[k].map(tables.key_text).nunique() > 1)]

    def label(r):
        parts = []
        for k in varying:
            text = tables.key_text(r[k]) or ("none" if k == "bucket_cap_mb" else "same")
            parts.append(text if k in ("engine", "model", "precision") else f"{SHORT.get(k, k + ' ')}{text}")
        return " · ".join(parts)

    return df.apply(label, axis=1) if len(df) else pd.Series([], dtype=str)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _legend(ax, n: int) -> None:
    if n:
        ax.legend(fontsize=8 if n <= 8 else 6, loc="best")


def _world_size_axis(ax, sizes: list[int]) -> None:
    """Powers of two spaced evenly (log2), labelled with the world sizes themselves."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()


def scaling(table: pd.DataFrame, scaling_name: str, path: Path, axes=None) -> Path | None:
    """Throughput and (when available) efficiency vs world size, with the ideal lines dashed."""
    ok = table[table["status"] == "ok"]
    if not len(ok):
        return None
    has_eff = "efficiency_pct" in ok and ok["efficiency_pct"].notna().any()
    own_fig = axes is None
    if own_fig:
        fig, axes = plt.subplots(1, 2 if has_eff else 1, figsize=(12 if has_eff else 6.5, 4.5), squeeze=False)
        axes = axes[0]
    # A line is one configuration across world sizes: the batch that changes with N is not part of it.
    changing = {"strong": "per_rank_batch", "weak": "global_batch"}[scaling_name]
    keys = [k for k in LABEL_KEYS if k not in ("world_size", changing)]
    ok = ok.assign(_label=_labels(ok, keys))
    sizes_per_line = ok.groupby("_label")["world_size"].nunique()
    if (sizes_per_line > 1).any():  # configurations run at one world size only stay in the table
        ok = ok[ok["_label"].isin(sizes_per_line[sizes_per_line > 1].index)]
        ok = ok.assign(_label=_labels(ok, keys))
    ok = ok.assign(_key=tables.config_key(ok, keys))
    colors = {}
    for label, g in ok.groupby("_label", sort=True):
        g = g.sort_values("world_size")
        line = axes[0].plot(g["world_size"], g["throughput_samples_per_s"], marker="o", label=label)[0]
        colors[g["_key"].iloc[0]] = line.get_color()
        one = g[g["world_size"] == 1]
        if len(one):
            ideal = one["throughput_samples_per_s"].iloc[0] * g["world_size"]
            axes[0].plot(g["world_size"], ideal, ls="--", lw=1, color=line.get_color(), alpha=0.6)
        if has_eff and len(axes) > 1:
            axes[1].plot(
                g["world_size"], g["efficiency_pct"], marker="o", color=line.get_color(), label=label
            )
    # A line's cells without numbers: their status at the foot of the plot, in the line's colour, not a 0.
    bad = table[table["status"] != "ok"]
    bad = bad.assign(_key=tables.config_key(bad, keys)) if len(bad) else bad
    failed = bad[bad["_key"].isin(colors)] if len(bad) else bad
    for i, (_, r) in enumerate(failed.iterrows()):
        axes[0].annotate(
            f"{r['engine']}: {r['status']}",
            (r["world_size"], 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 4 + 11 * i),
            textcoords="offset points",
            ha="center",
            fontsize=8,
            color=colors[r["_key"]],
        )
    n_lines = len(colors)
    sizes = tables.world_sizes(pd.concat([ok, failed]))
    axes[0].set(
        xlabel="world size (ranks)",
        ylabel="throughput (samples/s)",
        title=f"{scaling_name} scaling: throughput (dashed: ideal N × T₁ throughput)",
    )
    _world_size_axis(axes[0], sizes)
    axes[0].grid(alpha=0.3)
    _legend(axes[0], n_lines)
    if has_eff and len(axes) > 1:
        axes[1].axhline(100, ls="--", color="gray", lw=1, label="ideal (100 %)")
        axes[1].axhline(
            tables.EFFICIENCY_THRESHOLD_PCT,
            ls=":",
            color="red",
            lw=1,
            label=f"{tables.EFFICIENCY_THRESHOLD_PCT:.0f} %",
        )
        axes[1].set(
            xlabel="world size (ranks)",
            ylabel="efficiency (%)",
            title=f"{scaling_name} scaling efficiency",
            ylim=(0, max(110, float(ok["efficiency_pct"].max()) + 10)),
        )
        _world_size_axis(axes[1], sizes)
        axes[1].grid(alpha=0.3)
        _legend(axes[1], n_lines + 2)
    return _save(axes[0].figure, path) if own_fig else path


def bucket_sweep(table: pd.DataFrame, path: Path) -> Path | None:
    """Throughput vs bucket size (log axis), one line per configuration."""
    ok = table[table["status"] == "ok"]
    if not len(ok):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = ok.assign(_label=_labels(ok, [k for k in LABEL_KEYS if k != "bucket_cap_mb"]))
    for label, g in ok.groupby("_label", sort=True):
        g = g.sort_values("bucket_cap_mb")
        ax.plot(g["bucket_cap_mb"], g["throughput_samples_per_s"], marker="o", label=label)
    ax.set_xscale("log")
    ticks = sorted(set(ok["bucket_cap_mb"]))
    ax.set_xticks(ticks, [f"{b:g}" for b in ticks])
    ax.minorticks_off()
    ax.set(
        xlabel="bucket_cap_mb (MiB, log scale)", ylabel="throughput (samples/s)", title="bucket-size sweep"
    )
    ax.grid(alpha=0.3, which="both")
    _legend(ax, ok["_label"].nunique())
    return _save(fig, path)


def _barh(table: pd.DataFrame, value: str, label_keys, path: Path, title: str, xlabel: str) -> Path | None:
    """One horizontal bar per row; rows without a number show their status word instead of a bar."""
    if not len(table):
        return None
    t = table.assign(_label=_labels(table, label_keys)).iloc[::-1]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.38 * len(t) + 1.2)))
    y = range(len(t))
    values = t[value].astype(float)
    # A cell without a number gets no visible bar (width 0) and its status written in its place.
    ax.barh(list(y), values.fillna(0), color="tab:blue")
    top = float(values.max()) if values.notna().any() else 1.0
    for i, (_, r) in enumerate(t.iterrows()):
        if pd.isna(r[value]):
            ax.text(top * 0.01, i, f"{r['status']} (no number)", va="center", color="tab:red", fontsize=8)
        else:
            ax.text(float(r[value]), i, f" {float(r[value]):,.0f}", va="center", fontsize=8)
    ax.set_yticks(list(y), t["_label"], fontsize=8)
    ax.set(xlabel=xlabel, title=title, xlim=(0, top * 1.15))
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def precision(table: pd.DataFrame, path: Path) -> Path | None:
    """Throughput per compute dtype / comm dtype, within each configuration."""
    return _barh(
        table,
        "throughput_samples_per_s",
        LABEL_KEYS,
        path,
        "precision: compute dtype and gradient comm dtype",
        "throughput (samples/s)",
    )


def accumulation(table: pd.DataFrame, path: Path) -> Path | None:
    """Throughput per gradient-accumulation factor, within each configuration."""
    return _barh(
        table, "throughput_samples_per_s", LABEL_KEYS, path, "gradient accumulation", "throughput (samples/s)"
    )


def phases(table: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars per engine and world size: compute-only step + exposed communication = p50 step."""
    if not len(table):
        return None
    t = table.sort_values(["world_size", "engine"]).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6.5, 0.8 * len(t) + 2), 4.8))
    x = list(range(len(t)))
    compute = t["compute_only_ms_p50"].astype(float)
    exposed = t["exposed_comm_ms"].astype(float)
    ax.bar(x, compute.fillna(0), label="compute-only step (ms, p50)", color="tab:blue")
    ax.bar(
        x,
        exposed.fillna(0).clip(lower=0),
        bottom=compute.fillna(0),
        label="exposed communication (ms)",
        color="tab:orange",
    )
    top = float((compute.fillna(0) + exposed.fillna(0).clip(lower=0)).max() or 1.0)
    for i, r in t.iterrows():
        if r["status"] != "ok":
            ax.text(i, top * 0.02, r["status"], ha="center", va="bottom", rotation=90, color="tab:red")
        elif pd.isna(r["compute_only_ms_p50"]):
            ax.text(i, top * 0.02, "not measured", ha="center", va="bottom", rotation=90, color="gray")
    ax.set_xticks(x, [f"{r['engine']}\n{int(r['world_size'])} rk" for _, r in t.iterrows()], fontsize=8)
    ax.set(
        ylabel="time per step (ms)",
        title="where the step goes: compute vs exposed communication",
        ylim=(0, top * 1.12),
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path)


def engines(df: pd.DataFrame, path: Path) -> Path | None:
    """p50 step time (bar) and p90 (tick) per engine, grouped by world size."""
    if not len(df):
        return None
    sizes = tables.world_sizes(df)
    names = sorted(set(df["engine"]), key=lambda e: (e != "torch", e))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(sizes) + 3), 4.5))
    top = float(df["step_time_ms_p90"].max()) if df["step_time_ms_p90"].notna().any() else 1.0
    for j, engine in enumerate(names):
        for i, n in enumerate(sizes):
            cell = df[(df["engine"] == engine) & (df["world_size"] == n)]
            xpos = i + (j - (len(names) - 1) / 2) * width
            if not len(cell):
                continue
            r = cell.iloc[0]
            if r["status"] == "ok" and pd.notna(r["step_time_ms_p50"]):
                ax.bar(xpos, r["step_time_ms_p50"], width, color=f"C{j}", label=engine)
                ax.plot(
                    [xpos - width / 3, xpos + width / 3], [r["step_time_ms_p90"]] * 2, color="black", lw=1
                )
            else:
                ax.text(xpos, top * 0.02, r["status"], ha="center", va="bottom", rotation=90, color="tab:red")
    ax.set_xticks(range(len(sizes)), [f"{n} rank" if n == 1 else f"{n} ranks" for n in sizes])
    ax.set(ylabel="step time (ms): bar p50, tick p90", title="engines compared (lower is better)")
    ax.grid(alpha=0.3, axis="y")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))  # one entry per engine, whichever size drew it first
    ax.legend(seen.values(), seen.keys(), fontsize=8)
    return _save(fig, path)


def side_by_side(scaling_tables: dict[str, pd.DataFrame], scaling_name: str, path: Path) -> Path | None:
    """One column per run (throughput above, efficiency below) on identical axes, for a fair eye."""
    if not any(len(t[t["status"] == "ok"]) for t in scaling_tables.values()):
        return None
    n = len(scaling_tables)
    fig, axes = plt.subplots(2, n, figsize=(6 * n, 8), sharex=True, sharey="row", squeeze=False)
    for j, (label, table) in enumerate(scaling_tables.items()):
        if len(table[table["status"] == "ok"]):
            scaling(table, scaling_name, path, axes=[axes[0][j], axes[1][j]])
        axes[0][j].set_title(f"{label}\n{scaling_name} scaling throughput (dashed: ideal)", fontsize=10)
        axes[1][j].set_title(f"{label}\n{scaling_name} scaling efficiency", fontsize=10)
        if "efficiency_pct" not in table or not table["efficiency_pct"].notna().any():
            axes[1][j].text(
                0.5,
                0.5,
                "no efficiency\n(no world-size-1 baseline)",
                ha="center",
                va="center",
                transform=axes[1][j].transAxes,
                color="gray",
            )
    axes[1][0].set_ylim(0, 110)
    return _save(fig, path)
