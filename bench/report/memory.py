"""The memory trade-off: throughput against peak memory per rank, per engine (what FSDP buys), with the
per-rank state each engine should need by its layout beside the measured figure.

`memory_table` is the DataFrame (ok cells with a throughput); `frontier` keeps, per engine and world size,
the cells no other cell of that engine beats on both axes (less memory and more throughput); `plot` draws
one panel per world size: measured peak memory (filled) and expected state (hollow) at the cell's
throughput, joined by a dotted line, and each engine's frontier as a step line.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.report.plots import canvas
from bench.schema import MiB

STATE_COLUMNS = ("param_bytes_per_rank", "grad_bytes_per_rank", "optimizer_state_bytes_per_rank")
OPTION_WORDS = {"comm_hook": "hook", "reshard_after_forward": "reshard", "static_graph": "static",
                "gradient_as_bucket_view": "gbv", "compile": "compile"}


def options_text(row: pd.Series) -> str:
    """The cell's engine options that are set, in words (empty when none is)."""
    words = []
    for column, word in OPTION_WORDS.items():
        value = row.get(column)
        if value is None or (isinstance(value, float) and pd.isna(value)) or str(value) in ("", "none"):
            continue
        if str(value).lower() == "false" and column != "reshard_after_forward":
            continue
        words.append(f"{word}={value}")
    return ", ".join(words)


def memory_table(df: pd.DataFrame) -> pd.DataFrame:
    """ok cells with a throughput and a peak: engine, options, world size, samples/s, peak_mem_mb, the
    expected state per rank (MiB) and whether the cell is on its engine's frontier."""
    cols = [c for c in STATE_COLUMNS if c in df]
    ok = df[(df["status"] == "ok") & df["samples_per_s"].notna() & df["peak_mem_mb"].notna()]
    if ok.empty or len(cols) < len(STATE_COLUMNS):
        return pd.DataFrame()
    out = pd.DataFrame({
        "cell_id": ok["cell_id"], "engine": ok["engine"], "options": ok.apply(options_text, axis=1),
        "world_size": ok["world_size"].astype(int), "samples_per_s": ok["samples_per_s"],
        "peak_mem_mb": ok["peak_mem_mb"],
        "expected_state_mib_per_rank": ok[cols].sum(axis=1, min_count=len(cols)) / MiB,
    })
    out["on_frontier"] = frontier(out)
    return out.reset_index(drop=True)


def frontier(table: pd.DataFrame) -> pd.Series:
    """Per engine and world size: True for a cell that no other cell beats on both axes (less or equal
    peak memory with more throughput, or less memory at equal or more throughput)."""
    keep = pd.Series(False, index=table.index)
    for _, g in table.groupby(["engine", "world_size"]):
        for i, r in g.iterrows():
            beaten = ((g["peak_mem_mb"] <= r["peak_mem_mb"]) & (g["samples_per_s"] > r["samples_per_s"])) | (
                (g["peak_mem_mb"] < r["peak_mem_mb"]) & (g["samples_per_s"] >= r["samples_per_s"]))
            keep[i] = not beaten.any()
    return keep


def plot(table: pd.DataFrame, path: Path) -> Path | None:
    """The frontier figure (one panel per world size); None without rows."""
    if table.empty:
        return None
    sizes = sorted(table["world_size"].unique())
    title = "throughput against peak memory per rank: up and left is better"
    subtitle = ("filled: measured peak_mem_mb · hollow: parameters + gradients + optimizer state the engine "
                "should hold per rank · line: each engine's frontier")
    fig, _, axes = canvas.panel_figure(title, subtitle, len(sizes))
    names = canvas.engine_order(table)
    for ax, n in zip(axes.flat, sizes):
        at = table[table["world_size"] == n]
        for engine in names:
            g, color = at[at["engine"] == engine], canvas.engine_color(engine)
            for _, r in g.iterrows():
                ax.plot([r["expected_state_mib_per_rank"], r["peak_mem_mb"]], [r["samples_per_s"]] * 2,
                        ":", color=color, lw=0.8)
                ax.plot(r["expected_state_mib_per_rank"], r["samples_per_s"], "o", mfc="none", color=color)
                ax.plot(r["peak_mem_mb"], r["samples_per_s"], "o", color=color)
            best = g[g["on_frontier"]].sort_values("peak_mem_mb")
            if len(best):
                ax.step(best["peak_mem_mb"], best["samples_per_s"], where="post", color=color, lw=1.5)
        ax.set(title=canvas.rank_words(n), xlabel="memory per rank (MiB)", ylabel=canvas.THROUGHPUT)
    handles = [canvas.legend_line(e, canvas.engine_color(e)) for e in names]
    return canvas.save(fig, path, handles)
