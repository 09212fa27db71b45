"""The bar figures: throughput per compute and comm dtype (`precision`), the step split into compute and
exposed communication (`phases`), and p50/p90 step time per engine (`engines`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from bench import style as look
from bench.report import tables
from bench.report.plots import canvas


def precision(table: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars, one panel per world size: x engine, one bar per compute dtype (colour) and comm dtype
    (hatch), labelled with the speedup over fp32; a cell without a number shows its status instead."""
    if not len(table):
        return None
    rows, subtitle, _ = canvas.drawn_slice(table, ("engine", "world_size", "precision", "comm_dtype"))
    sizes, names, series = tables.world_sizes(rows), canvas.engine_order(rows), canvas.series_styles(rows)
    fig, sub, axes = canvas.panel_figure(
        "precision: throughput per compute and comm dtype (labels: × fp32)", subtitle, len(sizes)
    )
    width = 0.8 / len(series)
    values = rows["throughput_samples_per_s"]
    top = canvas.max_or_zero(values) or 1.0
    for ax, n in zip(axes.flat, sizes):
        ax.set_title(canvas.rank_words(n))
        here = rows[rows["world_size"] == n]
        for i, engine in enumerate(names):
            for k, ((p, c), (_, color, style)) in enumerate(series.items()):
                cell = here[(here["engine"] == engine) & (here["precision"] == p) & (here["comm_dtype"] == c)]
                if not len(cell):
                    continue
                r, x = cell.iloc[0], i + (k - (len(series) - 1) / 2) * width
                if pd.isna(r["throughput_samples_per_s"]):
                    canvas.bar_status(ax, x, top, r["status"])
                    continue
                ax.bar(
                    x,
                    r["throughput_samples_per_s"],
                    width,
                    color=color,
                    hatch=style[2],
                    edgecolor="white",
                    lw=0,
                )
                if pd.notna(r["speedup_vs_fp32_x"]) and not (p == "fp32" and c == "none"):
                    ax.annotate(
                        f"{r['speedup_vs_fp32_x']:.2f}×",
                        (x, r["throughput_samples_per_s"]),
                        xytext=(0, 2),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        rotation=90,
                        fontsize=7,
                    )
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.5, len(names) - 0.5)
        ax.grid(alpha=0.3, axis="y")
        ax.grid(False, axis="x")
    axes.flat[0].set_ylim(0, top * 1.2)
    sub.supylabel(canvas.THROUGHPUT, fontsize=10)
    handles = [
        Patch(facecolor=color, hatch=style[2], edgecolor="white", label=label)
        for label, color, style in series.values()
    ]
    return canvas.save(fig, path, handles)


def phases(table: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars per engine and world size: compute-only step + exposed communication = p50 step."""
    if not len(table):
        return None
    rows, subtitle, _ = canvas.drawn_slice(table, ("engine", "world_size"))
    order = {e: i for i, e in enumerate(canvas.engine_order(rows))}
    t = rows.sort_values(["world_size", "engine"], key=lambda s: s.map(order) if s.name == "engine" else s)
    t = t.reset_index(drop=True)
    title = "where the step goes: compute vs exposed communication"
    fig, _, axes = canvas.panel_figure(title, subtitle, 1, panel=(max(5.5, 0.75 * len(t) + 1.5), 3.6))
    ax = axes[0][0]
    x = list(range(len(t)))
    compute = t["compute_only_ms_p50"].astype(float).fillna(0)
    exposed = t["exposed_comm_ms"].astype(float).fillna(0).clip(lower=0)
    ax.bar(x, compute, color=look.COMPUTE)
    ax.bar(x, exposed, bottom=compute, color=look.EXPOSED_COMM)
    top = float((compute + exposed).max() or 1.0)
    for i, r in t.iterrows():
        if r["status"] != "ok":
            canvas.bar_status(ax, i, top, r["status"])
        elif pd.isna(r["compute_only_ms_p50"]):
            canvas.bar_status(ax, i, top, "not measured", "0.4")
    labels = [f"{r['engine']}\n{canvas.rank_words(r['world_size'])}" for _, r in t.iterrows()]
    ax.set_xticks(x, labels, fontsize=8)
    ax.set(ylabel="time per step (ms)", ylim=(0, top * 1.12))
    ax.grid(False, axis="x")
    handles = [
        Patch(color=look.COMPUTE, label="compute-only step (p50)"),
        Patch(color=look.EXPOSED_COMM, label="exposed communication (p50 step − compute-only)"),
    ]
    return canvas.save(fig, path, handles)


def engines(df: pd.DataFrame, path: Path) -> Path | None:
    """p50 step time (bar) and p90 (tick) per engine, grouped by world size, at one slice of the run."""
    if not len(df):
        return None
    rows, subtitle, _ = canvas.drawn_slice(df, ("engine", "world_size"))
    sizes, names = tables.world_sizes(rows), canvas.engine_order(rows)
    width = 0.8 / len(names)
    title = "engines compared: p50 step time (bars) and p90 (ticks), lower is better"
    fig, _, axes = canvas.panel_figure(title, subtitle, 1, panel=(max(5.5, 1.5 * len(sizes) + 2), 3.6))
    ax = axes[0][0]
    top = canvas.max_or_zero(rows["step_time_ms_p90"]) or 1.0
    for j, engine in enumerate(names):
        for i, n in enumerate(sizes):
            cell = rows[(rows["engine"] == engine) & (rows["world_size"] == n)]
            xpos = i + (j - (len(names) - 1) / 2) * width
            if not len(cell):
                continue
            r = cell.iloc[0]
            if r["status"] == "ok" and pd.notna(r["step_time_ms_p50"]):
                ax.bar(xpos, r["step_time_ms_p50"], width, color=canvas.engine_color(engine))
                ax.plot(
                    [xpos - width / 3, xpos + width / 3], [r["step_time_ms_p90"]] * 2, color="black", lw=1.2
                )
            else:
                canvas.bar_status(ax, xpos, top, r["status"])
    ax.set_xticks(range(len(sizes)), [canvas.rank_words(n) for n in sizes])
    ax.set(ylabel="step time (ms)", ylim=(0, top * 1.1))
    ax.grid(False, axis="x")
    handles = [Patch(color=canvas.engine_color(e), label=e) for e in names]
    handles.append(Line2D([], [], color="black", lw=1.2, label="p90 step time"))
    return canvas.save(fig, path, handles)


# the speedup figure's rows at most: the ranked configurations of the answer's precision, best first (the
