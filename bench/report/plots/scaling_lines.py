"""The scaling figures: throughput (and efficiency, where the run has a world-size-1 baseline) against world
size, per engine for one run (`scaling`) or per run on identical axes for a comparison (`side_by_side`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from bench import style as look
from bench.report import tables
from bench.report.plots import canvas
from bench.style import PANEL


def _efficiency_axes(axes, top: float) -> list:
    """The ideal (100 %) and threshold lines on efficiency panels; their legend keys."""
    for ax in axes:
        ax.axhline(100, ls="--", color=look.IDEAL, lw=1)
        ax.axhline(tables.EFFICIENCY_THRESHOLD_PCT, ls=":", color=look.THRESHOLD, lw=1.2)
    axes[0].set_ylim(0, max(110.0, top + 10))
    axes[0].set_ylabel("efficiency (%)")
    threshold = f"{tables.EFFICIENCY_THRESHOLD_PCT:.0f} % efficiency threshold"
    return [
        canvas.legend_line("100 % efficiency (ideal)", look.IDEAL, ("--", None), lw=1),
        canvas.legend_line(threshold, look.THRESHOLD, (":", None), lw=1.2),
    ]


def _scaling_panels(axes, rows, groups, slots: Counter) -> tuple[bool, float]:
    """Throughput (row 0, dotted: ideal N × single-rank throughput) and efficiency (row 1, if any) per world
    size; `groups` is (column, mask, colour, style, ideal line's colour or None). Returns whether an ideal
    line was drawn and the highest throughput drawn."""
    drew_ideal, top = False, canvas.max_or_zero(rows["throughput_samples_per_s"])
    for col, mask, color, style, ideal in groups:
        g = rows[mask].sort_values("world_size")
        canvas.series_line(axes[0][col], g, "world_size", "throughput_samples_per_s", color, style, slots)
        one = g[(g["world_size"] == 1) & g["throughput_samples_per_s"].notna()]
        if ideal and len(one) and g["world_size"].nunique() > 1:
            ideal_thr = one["throughput_samples_per_s"].iloc[0] * g["world_size"]
            axes[0][col].plot(g["world_size"], ideal_thr, ls=":", lw=1.2, color=ideal, alpha=0.7)
            drew_ideal, top = True, max(top, float(ideal_thr.max()))
        if len(axes) > 1:
            canvas.series_line(axes[1][col], g, "world_size", "efficiency_pct", color, style, slots)
    return drew_ideal, top


def _scaling_figure(title, subtitle, columns, rows, groups, keys, panel=PANEL):
    """Shared body of `scaling` and `side_by_side`: panels, axes and reference lines; returns
    (figure, axes, legend handles)."""
    has_eff = "efficiency_pct" in rows
    fig, sub, axes = canvas.panel_figure(title, subtitle, len(columns), 2 if has_eff else 1, panel)
    drew_ideal, top = _scaling_panels(axes, rows, groups, Counter())
    for col, name in enumerate(columns):
        axes[0][col].set_title(name)
    axes[0][0].set_ylim(0, (top or 1.0) * 1.08)
    axes[0][0].set_ylabel(canvas.THROUGHPUT)
    canvas.log_x(axes[0][0], tables.world_sizes(rows) or [1], 2)
    sub.supxlabel("world size (ranks)", fontsize=10)
    handles = list(keys)
    if drew_ideal:
        handles.append(canvas.legend_line("ideal throughput: N × 1-rank", "0.3", (":", None), lw=1.2))
    if has_eff:
        handles += _efficiency_axes(axes[1], canvas.max_or_zero(rows["efficiency_pct"]))
    return fig, axes, handles


def scaling(table: pd.DataFrame, scaling_name: str, path: Path) -> Path | None:
    """Throughput and (when available) efficiency vs world size, one column of panels per engine; lines are
    precisions (colour) and comm dtypes (line style), with the other settings held at one slice."""
    if not (table["status"] == "ok").any():
        return None
    examined = ("engine", "world_size", "precision", "comm_dtype")
    rows, subtitle, _ = canvas.drawn_slice(table, examined, scaling_name)
    names, series = canvas.engine_order(rows), canvas.series_styles(rows)
    groups = [
        (
            j,
            (rows["engine"] == engine) & (rows["precision"] == p) & (rows["comm_dtype"] == c),
            color,
            style,
            color if c == "none" else None,  # compressed comm: the uncompressed ideal
        )
        for j, engine in enumerate(names)
        for (p, c), (_, color, style) in series.items()
    ]
    what = "throughput and efficiency" if "efficiency_pct" in rows else "throughput"
    keys = [canvas.legend_line(label, color, style) for label, color, style in series.values()]
    title = f"{scaling_name} scaling: {what} per engine"
    fig, _, handles = _scaling_figure(title, subtitle, names, rows, groups, keys)
    return canvas.save(fig, path, handles)


def side_by_side(scaling_tables: dict[str, pd.DataFrame], scaling_name: str, path: Path) -> Path | None:
    """One column per run (throughput above, efficiency below), one line per engine, on identical axes and
    at the same slice, for a fair eye."""
    if not any(len(t[t["status"] == "ok"]) for t in scaling_tables.values()):
        return None
    both = pd.concat([t.assign(_run=label) for label, t in scaling_tables.items()], ignore_index=True)
    rows, subtitle, _ = canvas.drawn_slice(both, ("engine", "world_size"), scaling_name)
    names = canvas.engine_order(rows)
    groups = [
        (j, (rows["_run"] == label) & (rows["engine"] == e), canvas.engine_color(e), canvas.SOLID, "0.45")
        for j, label in enumerate(scaling_tables)
        for e in names
    ]
    keys = [canvas.legend_line(e, canvas.engine_color(e)) for e in names]
    title = f"{scaling_name} scaling side by side: every run on the same axes"
    fig, axes, handles = _scaling_figure(
        title, subtitle, list(scaling_tables), rows, groups, keys, (4.6, 2.8)
    )
    for j, t in enumerate(scaling_tables.values()):
        if len(axes) > 1 and ("efficiency_pct" not in t or not t["efficiency_pct"].notna().any()):
            axes[1][j].text(
                0.5,
                0.5,
                "no efficiency\n(no world-size-1 baseline)",
                ha="center",
                va="center",
                transform=axes[1][j].transAxes,
                color="0.4",
            )
    return canvas.save(fig, path, handles)
