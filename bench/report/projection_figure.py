"""The report's projection figure: projected efficiency against world size (projection.csv, as `bench
project` wrote it), a panel per network and engine, one line per configuration, the run's measured
efficiencies as points on the same axes (a thin last layer)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench import metrics  # noqa: E402
from bench.project.configuration import Configuration  # noqa: E402
from bench.schema import DEFAULT_BUCKET_MB  # noqa: E402
from bench.style import DPI  # noqa: E402
from bench.style import PROJECTION_PANEL as PANEL  # noqa: E402


def measured_efficiency(config: Configuration) -> pd.DataFrame:
    """(world_size, efficiency_pct) of the configuration's measured cells against its measured world-size-1
    step (the report's definition); empty without a world-size-1 cell."""
    rows = config.rows
    one = rows[rows["world_size"] == 1]
    if one.empty:
        return pd.DataFrame(columns=["world_size", "efficiency_pct"])
    t1 = float(one.iloc[0]["step_time_ms_p50"])
    out = []
    for _, r in rows.iterrows():
        n = int(r["world_size"])
        e = (metrics.strong_scaling_efficiency(t1, r["step_time_ms_p50"], n) if r["scaling"] == "strong"
             else metrics.weak_scaling_efficiency(t1, r["step_time_ms_p50"]))
        if e is not None:
            out.append({"world_size": n, "efficiency_pct": 100 * e})
    return pd.DataFrame(out, columns=["world_size", "efficiency_pct"])


def label(config: Configuration) -> str:
    """The configuration's batch rule in a few words (the engine names the panel, the slice the title)."""
    b = config.base
    batch = f"global batch {int(b['global_batch'])}" if b["scaling"] == "strong" else (
        f"{int(b['per_rank_batch'])} per rank")
    return f"{b['scaling']} ({batch})"


def reference_slice(configs: list[Configuration]) -> tuple[list[Configuration], str]:
    """The configurations a figure can show legibly: one bucket size (torch's default 25 MiB when
    measured), one precision (fp32 when measured) and the smallest accumulation, strong and weak alike;
    with the words naming that slice. projection.csv keeps every configuration."""
    bases = pd.DataFrame([c.base for c in configs])
    buckets = bases["bucket_cap_mb"].dropna()
    bucket = DEFAULT_BUCKET_MB if (buckets == DEFAULT_BUCKET_MB).any() else (
        buckets.mode().iloc[0] if len(buckets) else None)
    precision = "fp32" if (bases["precision"] == "fp32").any() else bases["precision"].mode().iloc[0]
    accum = int(bases["grad_accum"].min())
    kept = [c for c in configs if (pd.isna(c.base["bucket_cap_mb"]) or c.base["bucket_cap_mb"] == bucket)
            and c.base["precision"] == precision and int(c.base["grad_accum"]) == accum]
    words = (f"{'' if bucket is None else f'{bucket:g} MiB buckets (naive: none), '}{precision}, "
             f"grad_accum {accum}")
    return kept, words


END_MARKER = "x"  # the last world size a strong-scaling configuration's global batch divides among


def ends_early(projection: pd.DataFrame, config: Configuration, network: str, line: pd.DataFrame) -> bool:
    """True when projection.csv has world sizes beyond the drawn line that this configuration's global
    batch does not divide among (their rows are empty with that reason)."""
    mine = projection[(projection["network"] == network) & (projection["cell_id"] == config.base["cell_id"])]
    beyond = mine[(mine["world_size"] > line["world_size"].max()) & mine["efficiency_pct"].isna()]
    return bool(beyond["reason"].fillna("").astype(str).str.contains("does not divide").any())


def efficiency_figure(projection: pd.DataFrame, configs: list[Configuration], path: Path) -> Path | None:
    """Write the figure: a row of panels per network, a column per engine, the reference slice's
    configurations only (reference_slice); None when nothing to draw."""
    drawn = projection.dropna(subset=["efficiency_pct"])
    if drawn.empty or not configs:
        return None
    configs, slice_words = reference_slice(configs)
    networks = list(dict.fromkeys(drawn["network"]))
    # engines with a projected line only (a configuration the model cannot project carries its reason)
    projected = set(drawn["cell_id"])
    engines = list(dict.fromkeys(c.base["engine"] for c in configs if c.base["cell_id"] in projected))
    if not engines:
        return None
    fig, axes = plt.subplots(len(networks), len(engines), squeeze=False, sharex=True, sharey=True,
                             figsize=(PANEL[0] * len(engines), PANEL[1] * len(networks)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, engine in enumerate(engines):
        mine = [c for c in configs if c.base["engine"] == engine]
        for row, network in enumerate(networks):
            ax = axes[row][col]
            for i, config in enumerate(mine):
                color = colors[i % len(colors)]
                line = drawn[(drawn["network"] == network) & (drawn["cell_id"] == config.base["cell_id"])]
                if not line.empty:
                    ax.plot(line["world_size"], line["efficiency_pct"], "-", color=color, lw=1.2,
                            label=label(config))
                    if ends_early(projection, config, network, line):  # the batch divides no further
                        last = line.loc[line["world_size"].idxmax()]
                        ax.plot([last["world_size"]], [last["efficiency_pct"]], END_MARKER, color=color, ms=7)
                points = measured_efficiency(config)
                if not points.empty:
                    ax.plot(points["world_size"], points["efficiency_pct"], "o", color=color, ms=4)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{engine} · {network}", fontsize=9)
            ax.set_ylim(0, 105)
            ax.grid(alpha=0.3)
            if row == len(networks) - 1:
                ax.set_xlabel("world size (ranks)")
            if col == 0:
                ax.set_ylabel("efficiency (%)")
            if row == 0 and col == len(engines) - 1:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle(f"projected scaling efficiency (lines) and measured (points) · {slice_words}\n"
                 f"{END_MARKER}: a strong-scaling line ends where its global batch no longer divides among "
                 "the ranks", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path
