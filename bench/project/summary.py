"""projection.md: the report section in Markdown (efficiency per world size, validation, fitted network)."""

from __future__ import annotations

import pandas as pd

from bench.project.project import median_abs_error


def _fmt(v, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _table(df: pd.DataFrame, digits: int = 1) -> str:
    if df.empty:
        return "(none)\n"
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(_fmt(v, digits) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def section(projection: pd.DataFrame, validation: pd.DataFrame, fits: pd.DataFrame, notes: list[str],
            figure: str | None) -> str:
    """The Markdown section: one efficiency table per network (configurations × world sizes, with the
    bottleneck), then validation and the fitted network."""
    out = ["## Projection", "",
           "Predicted scaling efficiency (%) per configuration (its base cell) and world size; the "
           "bottleneck of the largest predicted world size after it. Model and sources: "
           "docs/design.md, section Projection.", ""]
    if figure:
        out += [f"![projected efficiency]({figure})", ""]
    for network, rows in projection.groupby("network", sort=False):
        out += [f"### {network}", ""]
        table = rows.pivot_table(index="cell_id", columns="world_size", values="efficiency_pct", sort=False)
        last = rows.dropna(subset=["efficiency_pct"]).groupby("cell_id").last()["bottleneck"]
        table = table.reset_index().merge(last.rename("bottleneck").reset_index(), on="cell_id", how="left")
        out += [_table(table)]
        unpredicted = rows[rows["efficiency_pct"].isna()]
        if not unpredicted.empty:
            sizes = ", ".join(map(str, sorted(unpredicted["world_size"].unique())))
            out += [f"- {len(unpredicted)} rows not predicted (world sizes {sizes}); reasons in "
                    f"projection.csv, e.g. {unpredicted['reason'].iloc[0]}", ""]
    out += ["### Validation", ""]
    med = median_abs_error(validation) if not validation.empty else None
    if med is None:
        out += ["No cell could be validated (the run needs more than one measured world size and a "
                "probe).", ""]
    else:
        out += [f"Median |error| {med:.1f} % over {validation['error_pct'].notna().sum()} cells.", ""]
        out += [_table(validation[["cell_id", "world_size", "measured_step_ms", "predicted_step_ms",
                                   "error_pct"]], 2)]
    out += ["### Measured network (α, β fitted per world size)", "", _table(fits, 3)]
    if notes:
        out += ["### Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)
