"""The answer's figure: each ranked configuration's speedup over the baseline with its 95 % interval
(advice.csv), at the answer's precision."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from bench import style as look
from bench.advise.choice import NAMED
from bench.style import DPI, ENGINE_COLORS, SPARE_COLORS

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
