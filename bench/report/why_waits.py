"""The Why section's cross-rank view, from what `bench analyze` wrote into the run folder: per cell of two or
more ranks, how much of the exposed communication was waiting for the last rank and for which rank
(tables.wait_table over trace_summary.csv and stragglers.csv), and a small figure of each rank's profiled
step (rank_timeline.csv: compute, wait, transfer on the aligned clock) so a late rank shows at a glance.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from bench import style  # noqa: E402
from bench.analyze import tables as trace_tables  # noqa: E402
from bench.analyze.summary import RANK_TIMELINE_FILE, STRAGGLERS_FILE  # noqa: E402
from bench.report.render import Section, write_csv  # noqa: E402

# what each kind of rank_timeline.csv segment is drawn as: (label, colour, lower edge, height) within a
# rank's row of height 1: compute below, communication above, so that overlap shows
KINDS = {"window": ("profiled step", style.IDLE, 0.05, 0.9),
         "compute": ("compute", style.COMPUTE, 0.1, 0.35),
         "transfer": ("transfer (moving bytes)", style.EXPOSED_COMM, 0.55, 0.35),
         "wait": ("wait for the last rank", style.WAIT, 0.55, 0.35)}
MAX_PANELS = 12  # cells drawn: those whose exposed communication waits most first
MAX_RANKS = 16   # ranks drawn per cell: the one the others waited for and those that waited most
# figure size in inches: per panel its title (two lines), axis labels and ticks, then one row per rank; the
# legend's line above them all
PANEL_BASE_IN, RANK_ROW_IN, LEGEND_IN = 1.3, 0.22, 0.3


def _read(path: Path) -> pd.DataFrame | None:
    try:
        frame = pd.read_csv(path, dtype={"cell_id": str, "step": str, "job": str})
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    return frame if len(frame) else None


def sentence(r) -> str:
    """One cell's answer: how much of its exposed communication waited, and for which rank."""
    if pd.isna(r.exposed_wait_ms):
        return (f"{r.cell_id}: {r.exposed_comm_ms:.2f} ms of exposed communication per step; its collectives "
                "were not all matched across ranks, so its waiting is not measured")
    if not r.exposed_comm_ms > 0:
        return f"{r.cell_id}: no exposed communication in the profiled steps"
    text = (f"{r.cell_id}: {r.exposed_wait_ms:.2f} of {r.exposed_comm_ms:.2f} ms of exposed communication "
            f"per step and rank is waiting ({r.wait_share_pct:.0f} %), {r.exposed_transfer_ms:.2f} ms moving "
            "bytes")
    if pd.notna(r.waited_for_rank):
        text += (f"; the others waited for rank {int(r.waited_for_rank)} (last in {int(r.steps_last)} of "
                 f"{int(r.steps)} steps, by a median {r.late_by_ms_p50:.2f} ms"
                 f"{', a persistent straggler' if r.persistent else ''})")
    slowest = getattr(r, "slowest_rank", None)
    if slowest is not None and pd.notna(slowest):
        text += f"; the timers' slowest rank (compute-only rounds): {int(slowest)}"
    return text


def timeline_figure(timeline: pd.DataFrame, order: list[str], path: Path) -> Path | None:
    """One small panel per cell (at most MAX_PANELS, in `order`): each rank's profiled step as a row."""
    cells = [c for c in order if c in set(timeline["cell_id"])][:MAX_PANELS]
    if not cells:
        return None
    cols = min(3, len(cells))
    rows_n = -(-len(cells) // cols)
    heights = [min(MAX_RANKS, timeline.loc[timeline["cell_id"] == c, "rank"].nunique()) for c in cells]
    panel_h = PANEL_BASE_IN + RANK_ROW_IN * max(heights)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, panel_h * rows_n + LEGEND_IN), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(cells):]:
        ax.axis("off")
    for ax, cell in zip(axes.flat, cells):
        t = timeline[timeline["cell_id"] == cell]
        wait = t[t["kind"] == "wait"]
        waited = (wait["end_ms"] - wait["start_ms"]).groupby(wait["rank"]).sum()
        keep = list(dict.fromkeys([*waited.sort_values(ascending=False).index, *sorted(t["rank"].unique())]))
        ranks = sorted(keep[:MAX_RANKS])
        for y, rank in enumerate(ranks):
            mine = t[t["rank"] == rank]
            for kind, (_, color, low, height) in KINDS.items():
                part = mine[mine["kind"] == kind]
                if len(part):
                    ax.broken_barh(list(zip(part["start_ms"], part["end_ms"] - part["start_ms"])),
                                   (y + low, height), facecolors=color, linewidth=0)
        ax.set_yticks([y + 0.5 for y in range(len(ranks))], [str(r) for r in ranks], fontsize=6)
        ax.set_ylim(0, len(ranks))
        ax.invert_yaxis()
        ax.set_ylabel("rank", fontsize=7)
        ax.set_xlabel(f"ms in step {t['step'].iloc[0]} (aligned clock)", fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
        ax.set_title("\n".join(textwrap.wrap(cell, 40)), fontsize=6)
    handles = [Patch(color=color, label=label) for label, color, _, _ in KINDS.values()]
    fig.legend(handles=handles, fontsize=7, loc="outside upper center", ncol=4, frameon=False)
    fig.savefig(path, dpi=style.DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def add_wait_views(sec: Section, run_dir: Path, summary: pd.DataFrame, results: pd.DataFrame,
                   out_dir: Path) -> Section:
    """Append the per-cell sentences, their table and the per-rank timeline figure (where the files have
    rows: a run without multi-rank profiled cells, or analysed by an older bench analyze, shows nothing).
    The timers' slowest_rank (results.csv) stands beside the traces' answer."""
    stragglers = _read(Path(run_dir) / STRAGGLERS_FILE)
    table = trace_tables.wait_table(summary, stragglers if stragglers is not None else pd.DataFrame())
    if not len(table):
        return sec
    if "slowest_rank" in results.columns:
        table = table.merge(results[["cell_id", "slowest_rank"]].drop_duplicates("cell_id"), on="cell_id",
                            how="left")
    table = table.sort_values("wait_share_pct", ascending=False, na_position="last", ignore_index=True)
    sec.para("Why communication is exposed, across ranks: each collective aligned on every rank of the "
             "cell (one clock), split into waiting (until the last rank started it) and transfer (the rest). "
             "Per cell, mean per profiled step and rank, barriers left out. Definitions: docs/analysis.md, "
             "collective_wait.csv.", "formula")
    sec.bullets([sentence(r) for r in table.itertuples()])
    write_csv(table, out_dir / "tables" / "why_waits.csv")
    sec.table(table, "tables/why_waits.csv")
    timeline = _read(Path(run_dir) / RANK_TIMELINE_FILE)
    if timeline is not None:
        figure = timeline_figure(timeline, table["cell_id"].tolist(), out_dir / "plots" / "why_ranks.png")
        if figure is not None:
            sec.para("Each rank's profiled step (the step whose straggler margin is the median of the "
                     "cell's steps), on the aligned clock: a late rank's row starts its communication "
                     f"last, the others wait for it. At most {MAX_PANELS} cells (most waiting first) and "
                     f"{MAX_RANKS} ranks each (the one waited for and those that waited most).")
            sec.image(figure.relative_to(out_dir).as_posix(), "each rank's step: compute, wait, transfer")
    return sec
