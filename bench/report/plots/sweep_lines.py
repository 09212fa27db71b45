"""The sweep figures: throughput against the one setting a sweep varies (bucket size, accumulation steps), one
panel per world size and one line per engine."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from bench.engines import get as engine_facts
from bench.report import slices, tables
from bench.report.plots import canvas


def _engine_lines(axes, rows: pd.DataFrame, sizes: list[int], x: str) -> list[str]:
    """Each world size's panel titled with its ranks and holding one throughput line per engine against
    `x`; returns the engines drawn, in the suite's order (the legend's)."""
    slots: Counter = Counter()
    names = canvas.engine_order(rows)
    for ax, n in zip(axes.flat, sizes):
        ax.set_title(canvas.rank_words(n))
        here = rows[rows["world_size"] == n]
        for engine in names:
            g = here[here["engine"] == engine]
            color = canvas.engine_color(engine)
            canvas.series_line(ax, g, x, "throughput_samples_per_s", color, canvas.SOLID, slots)
    return names


def bucket_sweep(table: pd.DataFrame, path: Path, cells: pd.DataFrame | None = None) -> Path | None:
    """Throughput vs bucket size (log axis), one panel per world size, one line per engine; an engine without
    buckets (naive, fsdp2: Engine.has_buckets) from `cells` as a flat dashed reference where it ran in the
    same slice."""
    if not (table["status"] == "ok").any():
        return None
    rows, subtitle, held = canvas.drawn_slice(table, ("engine", "world_size", "bucket_cap_mb"))
    sizes = tables.world_sizes(rows)
    flat = pd.DataFrame()
    if cells is not None:
        bucketless = cells[[not engine_facts(e).has_buckets for e in cells["engine"]]]
        if len(bucketless):
            flat = slices.rows_at(slices.with_batch(bucketless), held)
            flat = flat[flat["world_size"].isin(sizes)]
            flat = flat.assign(throughput=tables.throughputs(flat))
    fig, sub, axes = canvas.panel_figure("bucket-size sweep: throughput per engine", subtitle, len(sizes))
    names = _engine_lines(axes, rows, sizes, "bucket_cap_mb")
    for ax, n in zip(axes.flat, sizes):
        failed = 0
        for _, r in flat[flat["world_size"] == n].iterrows() if len(flat) else []:
            if r["status"] == "ok":
                ax.axhline(r["throughput"], ls="--", lw=1.4, color=canvas.engine_color(r["engine"]))
            else:
                ax.text(0.03, 0.95 - 0.07 * failed, f"{r['engine']}: {r['status']}", transform=ax.transAxes,
                        va="top", fontsize=8, fontweight="bold", color=canvas.engine_color(r["engine"]))
                failed += 1
    canvas.log_x(axes.flat[0], sorted(set(rows["bucket_cap_mb"].dropna())), 10)
    sub.supxlabel("bucket_cap_mb (MiB, log scale)", fontsize=10)
    sub.supylabel(canvas.THROUGHPUT, fontsize=10)
    handles = [canvas.legend_line(e, canvas.engine_color(e)) for e in names]
    drawn = flat[flat["status"] == "ok"] if len(flat) else flat
    handles += [canvas.legend_line(f"{e} (no buckets)", canvas.engine_color(e), ("--", None), lw=1.4)
                for e in canvas.engine_order(drawn)] if len(drawn) else []
    return canvas.save(fig, path, handles)


def accumulation(table: pd.DataFrame, path: Path) -> Path | None:
    """Throughput vs accumulation steps (log₂ axis), one panel per world size, one line per engine."""
    if not len(table):
        return None
    rows, subtitle, _ = canvas.drawn_slice(table, ("engine", "world_size", "grad_accum"))
    sizes = tables.world_sizes(rows)
    fig, sub, axes = canvas.panel_figure("gradient accumulation: throughput per engine", subtitle, len(sizes))
    names = _engine_lines(axes, rows, sizes, "grad_accum")
    canvas.log_x(axes.flat[0], sorted({int(a) for a in rows["grad_accum"].dropna()}), 2)
    sub.supxlabel("gradient accumulation steps per optimizer step (grad_accum, log scale)", fontsize=10)
    sub.supylabel(canvas.THROUGHPUT, fontsize=10)
    return canvas.save(fig, path, [canvas.legend_line(e, canvas.engine_color(e)) for e in names])
