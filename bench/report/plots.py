"""The report's plots: a thin last layer, one function per figure, each taking a table and writing a PNG.

Every figure is small multiples sharing the y axis (one panel per engine, or per world size) with a handful
of series per panel. The settings a figure does not examine are held at one reference slice, named in its
subtitle; the CSV tables keep every cell. Legends sit below the panels. Headless (Agg). A cell without a
number is written as its status word where its point or bar would be, never drawn as 0.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: E402

from bench import style as look  # noqa: E402
from bench.advise.choice import NAMED  # noqa: E402
from bench.engines import get as engine_facts  # noqa: E402
from bench.engines import loaded as engine_names  # noqa: E402
from bench.report import slices, tables  # noqa: E402
from bench.schema import PRECISIONS  # noqa: E402
from bench.style import DPI, ENGINE_COLORS, PANEL, PRECISION_COLORS, SPARE_COLORS  # noqa: E402

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


def _drawn_slice(t: pd.DataFrame, examined: tuple[str, ...], scaling: str | None = None):
    """The rows a figure draws (every setting outside `examined` held at one value), the subtitle naming
    that slice, and the held values themselves (setting → key text)."""
    t = slices.with_batch(t, scaling)
    held = slices.held_values(t, examined)
    return slices.rows_at(t, held), _subtitle(t, held, scaling, examined), held


def _engines(rows: pd.DataFrame) -> list[str]:
    """Engines present, in the suite's order (torch DDP first)."""
    present = set(rows["engine"])
    return [e for e in ENGINES if e in present] + sorted(present - set(ENGINES))


def _engine_color(engine: str) -> str:
    return ENGINE_COLORS.get(engine) or SPARE_COLORS[sum(map(ord, engine)) % len(SPARE_COLORS)]


def _series(rows: pd.DataFrame) -> dict[tuple[str, str], tuple[str, str, tuple[str, str, str]]]:
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


def _figure(title: str, subtitle: str, n: int, metrics: int = 1, panel=PANEL):
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


def _save(fig, path: Path, handles: list) -> Path:
    """Legend (shared by every panel) below the panels; the image cropped to what is drawn, title included."""
    if handles:  # one row when it fits the figure's width (about 0.08 in per character), else two
        wide = sum(0.6 + 0.08 * len(h.get_label()) for h in handles) > fig.get_figwidth()
        ncols = math.ceil(len(handles) / 2) if wide else len(handles)
        fig.legend(handles=handles, loc="outside lower center", ncols=ncols, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def _log_x(ax, values, base: int) -> None:
    """A log x axis ticked at exactly `values`, labelled with the values themselves."""
    ax.set_xscale("log", base=base)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()
    pad = (max(values) / min(values)) ** 0.12 if max(values) > min(values) else 1.5
    ax.set_xlim(min(values) / pad, max(values) * pad)  # room for a status word at either end


def _max_or_zero(values: pd.Series) -> float:
    """The largest number in `values`, 0 when there is none."""
    top = values.max()
    return 0.0 if pd.isna(top) else float(top)


def _ranks(n) -> str:
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


def _bar_status(ax, x, top: float, word: str, color: str = "tab:red") -> None:
    """A bar without a number: its status word, upright, where the bar would stand."""
    ax.text(
        x, top * 0.02, word, ha="center", va="bottom", rotation=90, fontsize=8, fontweight="bold", color=color
    )


def _line(ax, g: pd.DataFrame, x: str, y: str, color: str, style, slots: Counter) -> None:
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


def _legend_line(label: str, color: str, style=SOLID, **kw) -> Line2D:
    """A legend entry for a line series (drawn nowhere on the axes)."""
    return Line2D([], [], color=color, ls=style[0], marker=style[1], lw=kw.pop("lw", 1.8), label=label, **kw)


def _efficiency_axes(axes, top: float) -> list:
    """The ideal (100 %) and threshold lines on efficiency panels; their legend keys."""
    for ax in axes:
        ax.axhline(100, ls="--", color=look.IDEAL, lw=1)
        ax.axhline(tables.EFFICIENCY_THRESHOLD_PCT, ls=":", color=look.THRESHOLD, lw=1.2)
    axes[0].set_ylim(0, max(110.0, top + 10))
    axes[0].set_ylabel("efficiency (%)")
    threshold = f"{tables.EFFICIENCY_THRESHOLD_PCT:.0f} % efficiency threshold"
    return [
        _legend_line("100 % efficiency (ideal)", look.IDEAL, ("--", None), lw=1),
        _legend_line(threshold, look.THRESHOLD, (":", None), lw=1.2),
    ]


# ---- the figures -----------------------------------------------------------------------------------------


def _scaling_panels(axes, rows, groups, slots: Counter) -> tuple[bool, float]:
    """Throughput (row 0, dotted: ideal N × single-rank throughput) and efficiency (row 1, if any) per world
    size; `groups` is (column, mask, colour, style, ideal line's colour or None). Returns whether an ideal
    line was drawn and the highest throughput drawn."""
    drew_ideal, top = False, _max_or_zero(rows["throughput_samples_per_s"])
    for col, mask, color, style, ideal in groups:
        g = rows[mask].sort_values("world_size")
        _line(axes[0][col], g, "world_size", "throughput_samples_per_s", color, style, slots)
        one = g[(g["world_size"] == 1) & g["throughput_samples_per_s"].notna()]
        if ideal and len(one) and g["world_size"].nunique() > 1:
            ideal_thr = one["throughput_samples_per_s"].iloc[0] * g["world_size"]
            axes[0][col].plot(g["world_size"], ideal_thr, ls=":", lw=1.2, color=ideal, alpha=0.7)
            drew_ideal, top = True, max(top, float(ideal_thr.max()))
        if len(axes) > 1:
            _line(axes[1][col], g, "world_size", "efficiency_pct", color, style, slots)
    return drew_ideal, top


def _scaling_figure(title, subtitle, columns, rows, groups, keys, panel=PANEL):
    """Shared body of `scaling` and `side_by_side`: panels, axes and reference lines; returns
    (figure, axes, legend handles)."""
    has_eff = "efficiency_pct" in rows
    fig, sub, axes = _figure(title, subtitle, len(columns), 2 if has_eff else 1, panel)
    drew_ideal, top = _scaling_panels(axes, rows, groups, Counter())
    for col, name in enumerate(columns):
        axes[0][col].set_title(name)
    axes[0][0].set_ylim(0, (top or 1.0) * 1.08)
    axes[0][0].set_ylabel(THROUGHPUT)
    _log_x(axes[0][0], tables.world_sizes(rows) or [1], 2)
    sub.supxlabel("world size (ranks)", fontsize=10)
    handles = list(keys)
    if drew_ideal:
        handles.append(_legend_line("ideal throughput: N × 1-rank", "0.3", (":", None), lw=1.2))
    if has_eff:
        handles += _efficiency_axes(axes[1], _max_or_zero(rows["efficiency_pct"]))
    return fig, axes, handles


def scaling(table: pd.DataFrame, scaling_name: str, path: Path) -> Path | None:
    """Throughput and (when available) efficiency vs world size, one column of panels per engine; lines are
    precisions (colour) and comm dtypes (line style), with the other settings held at one slice."""
    if not (table["status"] == "ok").any():
        return None
    rows, subtitle, _ = _drawn_slice(table, ("engine", "world_size", "precision", "comm_dtype"), scaling_name)
    names, series = _engines(rows), _series(rows)
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
    keys = [_legend_line(label, color, style) for label, color, style in series.values()]
    title = f"{scaling_name} scaling: {what} per engine"
    fig, _, handles = _scaling_figure(title, subtitle, names, rows, groups, keys)
    return _save(fig, path, handles)


def side_by_side(scaling_tables: dict[str, pd.DataFrame], scaling_name: str, path: Path) -> Path | None:
    """One column per run (throughput above, efficiency below), one line per engine, on identical axes and
    at the same slice, for a fair eye."""
    if not any(len(t[t["status"] == "ok"]) for t in scaling_tables.values()):
        return None
    both = pd.concat([t.assign(_run=label) for label, t in scaling_tables.items()], ignore_index=True)
    rows, subtitle, _ = _drawn_slice(both, ("engine", "world_size"), scaling_name)
    names = _engines(rows)
    groups = [
        (j, (rows["_run"] == label) & (rows["engine"] == e), _engine_color(e), SOLID, "0.45")
        for j, label in enumerate(scaling_tables)
        for e in names
    ]
    keys = [_legend_line(e, _engine_color(e)) for e in names]
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
    return _save(fig, path, handles)


def bucket_sweep(table: pd.DataFrame, path: Path, cells: pd.DataFrame | None = None) -> Path | None:
    """Throughput vs bucket size (log axis), one panel per world size, one line per engine; an engine without
    buckets (naive, fsdp2: Engine.has_buckets) from `cells` as a flat dashed reference where it ran in the
    same slice."""
    if not (table["status"] == "ok").any():
        return None
    rows, subtitle, held = _drawn_slice(table, ("engine", "world_size", "bucket_cap_mb"))
    sizes = tables.world_sizes(rows)
    flat = pd.DataFrame()
    if cells is not None:
        bucketless = cells[[not engine_facts(e).has_buckets for e in cells["engine"]]]
        if len(bucketless):
            flat = slices.rows_at(slices.with_batch(bucketless), held)
            flat = flat[flat["world_size"].isin(sizes)]
            flat = flat.assign(throughput=tables.throughputs(flat))
    fig, sub, axes = _figure("bucket-size sweep: throughput per engine", subtitle, len(sizes))
    slots: Counter = Counter()
    names = _engines(rows)
    for ax, n in zip(axes.flat, sizes):
        ax.set_title(_ranks(n))
        here = rows[rows["world_size"] == n]
        for engine in names:
            g = here[here["engine"] == engine]
            _line(ax, g, "bucket_cap_mb", "throughput_samples_per_s", _engine_color(engine), SOLID, slots)
        failed = 0
        for _, r in flat[flat["world_size"] == n].iterrows() if len(flat) else []:
            if r["status"] == "ok":
                ax.axhline(r["throughput"], ls="--", lw=1.4, color=_engine_color(r["engine"]))
            else:
                ax.text(0.03, 0.95 - 0.07 * failed, f"{r['engine']}: {r['status']}", transform=ax.transAxes,
                        va="top", fontsize=8, fontweight="bold", color=_engine_color(r["engine"]))
                failed += 1
    _log_x(axes.flat[0], sorted(set(rows["bucket_cap_mb"].dropna())), 10)
    sub.supxlabel("bucket_cap_mb (MiB, log scale)", fontsize=10)
    sub.supylabel(THROUGHPUT, fontsize=10)
    handles = [_legend_line(e, _engine_color(e)) for e in names]
    drawn = flat[flat["status"] == "ok"] if len(flat) else flat
    handles += [_legend_line(f"{e} (no buckets)", _engine_color(e), ("--", None), lw=1.4)
                for e in _engines(drawn)] if len(drawn) else []
    return _save(fig, path, handles)


def precision(table: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars, one panel per world size: x engine, one bar per compute dtype (colour) and comm dtype
    (hatch), labelled with the speedup over fp32; a cell without a number shows its status instead."""
    if not len(table):
        return None
    rows, subtitle, _ = _drawn_slice(table, ("engine", "world_size", "precision", "comm_dtype"))
    sizes, names, series = tables.world_sizes(rows), _engines(rows), _series(rows)
    fig, sub, axes = _figure(
        "precision: throughput per compute and comm dtype (labels: × fp32)", subtitle, len(sizes)
    )
    width = 0.8 / len(series)
    values = rows["throughput_samples_per_s"]
    top = _max_or_zero(values) or 1.0
    for ax, n in zip(axes.flat, sizes):
        ax.set_title(_ranks(n))
        here = rows[rows["world_size"] == n]
        for i, engine in enumerate(names):
            for k, ((p, c), (_, color, style)) in enumerate(series.items()):
                cell = here[(here["engine"] == engine) & (here["precision"] == p) & (here["comm_dtype"] == c)]
                if not len(cell):
                    continue
                r, x = cell.iloc[0], i + (k - (len(series) - 1) / 2) * width
                if pd.isna(r["throughput_samples_per_s"]):
                    _bar_status(ax, x, top, r["status"])
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
    sub.supylabel(THROUGHPUT, fontsize=10)
    handles = [
        Patch(facecolor=color, hatch=style[2], edgecolor="white", label=label)
        for label, color, style in series.values()
    ]
    return _save(fig, path, handles)


def accumulation(table: pd.DataFrame, path: Path) -> Path | None:
    """Throughput vs accumulation steps (log₂ axis), one panel per world size, one line per engine."""
    if not len(table):
        return None
    rows, subtitle, _ = _drawn_slice(table, ("engine", "world_size", "grad_accum"))
    sizes, names = tables.world_sizes(rows), _engines(rows)
    fig, sub, axes = _figure("gradient accumulation: throughput per engine", subtitle, len(sizes))
    slots: Counter = Counter()
    for ax, n in zip(axes.flat, sizes):
        ax.set_title(_ranks(n))
        here = rows[rows["world_size"] == n]
        for engine in names:
            g = here[here["engine"] == engine]
            _line(ax, g, "grad_accum", "throughput_samples_per_s", _engine_color(engine), SOLID, slots)
    _log_x(axes.flat[0], sorted({int(a) for a in rows["grad_accum"].dropna()}), 2)
    sub.supxlabel("gradient accumulation steps per optimizer step (grad_accum, log scale)", fontsize=10)
    sub.supylabel(THROUGHPUT, fontsize=10)
    return _save(fig, path, [_legend_line(e, _engine_color(e)) for e in names])


def phases(table: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars per engine and world size: compute-only step + exposed communication = p50 step."""
    if not len(table):
        return None
    rows, subtitle, _ = _drawn_slice(table, ("engine", "world_size"))
    order = {e: i for i, e in enumerate(_engines(rows))}
    t = rows.sort_values(["world_size", "engine"], key=lambda s: s.map(order) if s.name == "engine" else s)
    t = t.reset_index(drop=True)
    title = "where the step goes: compute vs exposed communication"
    fig, _, axes = _figure(title, subtitle, 1, panel=(max(5.5, 0.75 * len(t) + 1.5), 3.6))
    ax = axes[0][0]
    x = list(range(len(t)))
    compute = t["compute_only_ms_p50"].astype(float).fillna(0)
    exposed = t["exposed_comm_ms"].astype(float).fillna(0).clip(lower=0)
    ax.bar(x, compute, color=look.COMPUTE)
    ax.bar(x, exposed, bottom=compute, color=look.EXPOSED_COMM)
    top = float((compute + exposed).max() or 1.0)
    for i, r in t.iterrows():
        if r["status"] != "ok":
            _bar_status(ax, i, top, r["status"])
        elif pd.isna(r["compute_only_ms_p50"]):
            _bar_status(ax, i, top, "not measured", "0.4")
    ax.set_xticks(x, [f"{r['engine']}\n{_ranks(r['world_size'])}" for _, r in t.iterrows()], fontsize=8)
    ax.set(ylabel="time per step (ms)", ylim=(0, top * 1.12))
    ax.grid(False, axis="x")
    handles = [
        Patch(color=look.COMPUTE, label="compute-only step (p50)"),
        Patch(color=look.EXPOSED_COMM, label="exposed communication (p50 step − compute-only)"),
    ]
    return _save(fig, path, handles)


def engines(df: pd.DataFrame, path: Path) -> Path | None:
    """p50 step time (bar) and p90 (tick) per engine, grouped by world size, at one slice of the run."""
    if not len(df):
        return None
    rows, subtitle, _ = _drawn_slice(df, ("engine", "world_size"))
    sizes, names = tables.world_sizes(rows), _engines(rows)
    width = 0.8 / len(names)
    title = "engines compared: p50 step time (bars) and p90 (ticks), lower is better"
    fig, _, axes = _figure(title, subtitle, 1, panel=(max(5.5, 1.5 * len(sizes) + 2), 3.6))
    ax = axes[0][0]
    top = _max_or_zero(rows["step_time_ms_p90"]) or 1.0
    for j, engine in enumerate(names):
        for i, n in enumerate(sizes):
            cell = rows[(rows["engine"] == engine) & (rows["world_size"] == n)]
            xpos = i + (j - (len(names) - 1) / 2) * width
            if not len(cell):
                continue
            r = cell.iloc[0]
            if r["status"] == "ok" and pd.notna(r["step_time_ms_p50"]):
                ax.bar(xpos, r["step_time_ms_p50"], width, color=_engine_color(engine))
                ax.plot(
                    [xpos - width / 3, xpos + width / 3], [r["step_time_ms_p90"]] * 2, color="black", lw=1.2
                )
            else:
                _bar_status(ax, xpos, top, r["status"])
    ax.set_xticks(range(len(sizes)), [_ranks(n) for n in sizes])
    ax.set(ylabel="step time (ms)", ylim=(0, top * 1.1))
    ax.grid(False, axis="x")
    handles = [Patch(color=_engine_color(e), label=e) for e in names]
    handles.append(Line2D([], [], color="black", lw=1.2, label="p90 step time"))
    return _save(fig, path, handles)


# the speedup figure's rows at most: the ranked configurations of the answer's precision, best first (the
# advised one and the baseline always among them); advice.csv has every row
MAX_SPEEDUP_ROWS = 14
TIED_SHADE = "#fde9b8"          # rows tied with the best (advice.csv tied_with_best), behind the bars
WIDE_SPEEDUP_RANGE = 2.5        # largest / smallest value beyond which the speedup axis is logarithmic
SPEEDUP_TICKS = (0.1, 0.25, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0)  # its labelled ticks


def speedup_plot(advice: pd.DataFrame, labels: dict[str, str], path: Path,
                 against: str = "torch DDP's defaults") -> Path | None:
    """Each ranked configuration's speedup over `against` (the baseline) with its 95 % interval (advice.csv),
    at the answer's precision, on a log axis with the baseline's 1× line; the rows tied with the best are
    shaded and the row the answer names is drawn bold. `labels`: cell id → the row's words. None when no
    row has a speedup."""
    ranked = advice[advice["rank"].notna() & advice["speedup_vs_baseline"].notna()].sort_values("rank")
    named = advice[advice["answer_role"].isin(NAMED)]
    if ranked.empty or named.empty:
        return None
    precision = named.iloc[0]["precision"]
    ranked = ranked[ranked["precision"] == precision]
    keep = set(ranked.index[:MAX_SPEEDUP_ROWS - 2]) | set(ranked.index[ranked["answer_role"] != ""]) | set(
        ranked.index[ranked["baseline"].astype(bool)])
    rows = ranked.loc[sorted(keep, key=lambda i: ranked.loc[i, "rank"])]
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.32 * len(rows)))
    for y, (_, r) in enumerate(rows.iloc[::-1].iterrows()):
        if r["tied_with_best"] or r["rank"] == 1:
            ax.axhspan(y - 0.45, y + 0.45, color=TIED_SHADE, lw=0, zorder=0)
        low, high = r["speedup_vs_baseline_ci95_low"], r["speedup_vs_baseline_ci95_high"]
        bold = r["answer_role"] in NAMED
        color = ENGINE_COLORS.get(r["engine"], SPARE_COLORS[0])
        if pd.notna(low) and pd.notna(high):
            ax.plot([low, high], [y, y], "-", color=color, lw=3 if bold else 1.6, zorder=2)
        ax.plot([r["speedup_vs_baseline"]], [y], "D" if r["baseline"] else "o", color=color,
                ms=7 if bold else 5, zorder=3)
        ax.text(1.005, y, f"{r['speedup_vs_baseline']:.2f}×", transform=ax.get_yaxis_transform(), va="center",
                fontsize=7.5, fontweight="bold" if bold else "normal")
    ax.axvline(1.0, color=look.IDEAL, lw=1, ls="--", zorder=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([labels.get(c, c) for c in rows["cell_id"].iloc[::-1]], fontsize=7.5)
    for tick, role in zip(ax.get_yticklabels(), rows["answer_role"].iloc[::-1]):
        tick.set_fontweight("bold" if role in NAMED else "normal")
    ends = pd.concat([rows["speedup_vs_baseline"], rows["speedup_vs_baseline_ci95_low"],
                      rows["speedup_vs_baseline_ci95_high"]]).dropna()
    wide = ends.max() / ends.min() > WIDE_SPEEDUP_RANGE
    if wide:  # a log axis: 0.5× and 2× sit as far from the baseline
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([t for t in SPEEDUP_TICKS if ends.min() <= t <= ends.max()]
                                                or [1.0]))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(f"speedup over {against} (95 % interval" + ("; log scale)" if wide else ")"),
                  fontsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", alpha=0.3, which="both")
    n = int(named.iloc[0]["world_size"])
    ax.set_title(f"global batch {int(named.iloc[0]['global_batch'])} at {n} ranks, {precision} "
                 f"(shaded: tied with the best; bold: the answer's)", fontsize=8.5)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path
