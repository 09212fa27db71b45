"""What every figure of the report is drawn on: the slice it holds the other settings at (named in its
subtitle), the engines' and series' colours and line styles, panels sharing the y axis, the status word where
a cell has no number, the legend below the panels and the PNG cropped to what is drawn."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from bench.engines import get as engine_facts
from bench.engines import loaded as engine_names
from bench.report import slices
from bench.schema import PRECISIONS
from bench.style import DPI, ENGINE_COLORS, PANEL, PRECISION_COLORS, SPARE_COLORS

ENGINES = engine_names()

MAX_COLS = 4  # world-size facets wrap after this many panels
THROUGHPUT = "throughput (samples/s)"
COMM_STYLES = (("-", "o", ""), ("--", "s", "///"), ("-.", "^", "..."))  # line, marker, hatch; none first
SOLID = COMM_STYLES[0]


def _subtitle(t: pd.DataFrame, held: dict[str, str], scaling: str | None, examined) -> str:
    """The slice in words: 'held at: strong scaling · fp32 · comm none · grad_accum 1 · …'."""
    rule = held.get("scaling", scaling or "strong")
    bucketless = [e for e in set(slices.rows_at(t, held)["engine"]) if not engine_facts(e).has_buckets]
    words = {
        "scaling": f"{rule} scaling",
        "model": f"{held.get('model', '')} {held.get('model_size', '')}".strip(),
        "model_size": "",  # said with the model
        "precision": held.get("precision", ""),
        "comm_dtype": f"comm {held.get('comm_dtype')}",
        "grad_accum": f"grad_accum {held.get('grad_accum')}",
        "bucket_cap_mb": f"bucket {held.get('bucket_cap_mb')} MiB" + (
            f" ({', '.join(sorted(bucketless))}: none)" if "bucket_cap_mb" in held and bucketless else ""),
        "engine_options": f"options {held['engine_options']}" if held.get("engine_options") else "",
        "_batch": f"per-rank batch {held.get('_batch')}"
        if rule == "weak"
        else f"global batch {held.get('_batch')}" + (" × grad_accum" if "grad_accum" in examined else ""),
    }
    parts = [words[k] for k in slices.SLICE_KEYS if k in held and words[k]]
    if len(slices.rows_at(t, held)) < len(t):
        parts.append("other cells: in the table")
    return "held at: " + " · ".join(parts)


def drawn_slice(t: pd.DataFrame, examined: tuple[str, ...], scaling: str | None = None):
    """The rows a figure draws (every setting outside `examined` held at one value), the subtitle naming
    that slice, and the held values themselves (setting → key text)."""
    t = slices.with_batch(t, scaling)
    held = slices.held_values(t, examined)
    return slices.rows_at(t, held), _subtitle(t, held, scaling, examined), held


def engine_order(rows: pd.DataFrame) -> list[str]:
    """Engines present, in the suite's order (torch DDP first)."""
    present = set(rows["engine"])
    return [e for e in ENGINES if e in present] + sorted(present - set(ENGINES))


def engine_color(engine: str) -> str:
    return ENGINE_COLORS.get(engine) or SPARE_COLORS[sum(map(ord, engine)) % len(SPARE_COLORS)]


def series_styles(rows: pd.DataFrame) -> dict[tuple[str, str], tuple[str, str, tuple[str, str, str]]]:
    """(precision, comm_dtype) → (label, colour, (line style, marker, hatch)): colour per precision,
    style per comm dtype (uncompressed first)."""
    pairs = set(zip(rows["precision"], rows["comm_dtype"]))
    precisions = [p for p in PRECISIONS if p in {p for p, _ in pairs}] + sorted(
        {p for p, _ in pairs} - set(PRECISIONS)
    )
    comms = sorted({c for _, c in pairs}, key=lambda c: (c != "none", c))
    out = {}
    for i, p in enumerate(precisions):
        for c in comms:
            if (p, c) in pairs:
                label = p if c == "none" else f"{p} · comm {c}"
                color = PRECISION_COLORS.get(p) or SPARE_COLORS[i % len(SPARE_COLORS)]
                out[(p, c)] = (label, color, COMM_STYLES[comms.index(c) % len(COMM_STYLES)])
    return out


# ---- figure furniture ------------------------------------------------------------------------------------


def panel_figure(title: str, subtitle: str, n: int, metrics: int = 1, panel=PANEL):
    """A figure of `n` panels sharing y: `metrics` rows × n columns, or with one metric n panels wrapped at
    MAX_COLS. Bold title, grey subtitle; returns (fig, subfigure, 2-D axes)."""
    ncols = n if metrics > 1 else min(n, MAX_COLS)
    nrows = metrics if metrics > 1 else math.ceil(n / ncols)
    width = max(6.0, panel[0] * ncols + 0.9)
    fig = plt.figure(figsize=(width, panel[1] * nrows + 1.3), layout="constrained")
    fig.suptitle(title, fontweight="bold")
    sub = fig.subfigures()
    sub.suptitle(_wrap(subtitle, int(width * 14)), fontsize=9, color="0.3")
    axes = sub.subplots(nrows, ncols, sharex=True, sharey="row" if metrics > 1 else True, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_visible(i < n * metrics)
        if i + ncols >= n and metrics == 1:  # nothing drawn below it: it carries the x tick labels
            ax.xaxis.set_tick_params(labelbottom=True)
        ax.grid(alpha=0.3)
    return fig, sub, axes


def _wrap(text: str, width: int) -> str:
    """`text` in lines of at most `width` characters, broken only between its ' · ' parts."""
    lines: list[str] = []
    for part in text.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return "\n".join(lines)


def save(fig, path: Path, handles: list) -> Path:
    """Legend (shared by every panel) below the panels; the image cropped to what is drawn, title included."""
    if handles:  # one row when it fits the figure's width (about 0.08 in per character), else two
        wide = sum(0.6 + 0.08 * len(h.get_label()) for h in handles) > fig.get_figwidth()
        ncols = math.ceil(len(handles) / 2) if wide else len(handles)
        fig.legend(handles=handles, loc="outside lower center", ncols=ncols, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def log_x(ax, values, base: int) -> None:
    """A log x axis ticked at exactly `values`, labelled with the values themselves."""
    ax.set_xscale("log", base=base)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()
    pad = (max(values) / min(values)) ** 0.12 if max(values) > min(values) else 1.5
    ax.set_xlim(min(values) / pad, max(values) * pad)  # room for a status word at either end


def max_or_zero(values: pd.Series) -> float:
    """The largest number in `values`, 0 when there is none."""
    top = values.max()
    return 0.0 if pd.isna(top) else float(top)


def rank_words(n) -> str:
    return "1 rank" if int(n) == 1 else f"{int(n)} ranks"


def _missing(ax, x, status: str, color: str, slots: Counter) -> None:
    """A cell without a number: its status word at the foot of the panel at `x`, in its series' colour."""
    slot = slots[(id(ax), x)]
    slots[(id(ax), x)] += 1
    ax.annotate(
        status,
        (x, 0),
        xycoords=("data", "axes fraction"),
        xytext=(0, 3 + 10 * slot),
        textcoords="offset points",
        ha="center",
        fontsize=7.5,
        fontweight="bold",
        color=color,
    )


def bar_status(ax, x, top: float, word: str, color: str = "tab:red") -> None:
    """A bar without a number: its status word, upright, where the bar would stand."""
    ax.text(
        x, top * 0.02, word, ha="center", va="bottom", rotation=90, fontsize=8, fontweight="bold", color=color
    )


def series_line(ax, g: pd.DataFrame, x: str, y: str, color: str, style, slots: Counter) -> None:
    """One series: its measured points joined (broken where a cell has no number), its cells without
    numbers as status words."""
    g = g.sort_values(x)
    ax.plot(g[x], g[y].where(g["status"] == "ok"), color=color, ls=style[0], marker=style[1], lw=1.8, ms=5)
    stem = y.removesuffix("_samples_per_s")
    low, high = f"{stem}_ci95_low", f"{stem}_ci95_high"
    if low in g and high in g and g[low].notna().any():  # the 95 % interval as error bars
        ok = g[g["status"] == "ok"]
        ax.errorbar(ok[x], ok[y], yerr=[(ok[y] - ok[low]).clip(lower=0), (ok[high] - ok[y]).clip(lower=0)],
                    fmt="none", ecolor=color, elinewidth=1, capsize=2)
    for _, r in g[g["status"] != "ok"].iterrows():
        _missing(ax, r[x], r["status"], color, slots)


def legend_line(label: str, color: str, style=SOLID, **kw) -> Line2D:
    """A legend entry for a line series (drawn nowhere on the axes)."""
    return Line2D([], [], color=color, ls=style[0], marker=style[1], lw=kw.pop("lw", 1.8), label=label, **kw)
