"""The run page's "Projection" section, from what `bench project` left in RUN/projection/ (data only).

The report never runs the projection itself (it is its own command, with its own network choices): it
draws the projected efficiency curves with the measured points on them (projection_figure.py), shows the
validation against the run's own larger world sizes, the fitted network and the projection's caveats, or
says how to get them. This is the one rendering of the projection.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.project.interval import LIMIT_PCT
from bench.project.run_configurations import configurations
from bench.project.terms import LOSS_TERMS
from bench.report.projection_figure import efficiency_figure
from bench.report.render import Section, write_csv

FOLDER = run_folder.PROJECTION_DIR  # RUN/projection/, bench project's default --out


def _read(path: Path) -> pd.DataFrame | None:
    try:
        return pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None


def efficiency_by_world_size(projection: pd.DataFrame) -> pd.DataFrame:
    """Per network and configuration (its base cell), predicted efficiency (%) per world size and the
    bottleneck at the largest predicted world size."""
    rows = []
    for (network, cell_id), group in projection.groupby(["network", "cell_id"], sort=False):
        predicted = group.dropna(subset=["efficiency_pct"])
        row = {"network": network, "cell_id": cell_id}
        row |= {f"eff_pct_ws{int(ws)}": eff for ws, eff in zip(group["world_size"], group["efficiency_pct"])}
        row["bottleneck"] = predicted["bottleneck"].iloc[-1] if len(predicted) else None
        rows.append(row)
    return pd.DataFrame(rows)


def interval_by_world_size(projection: pd.DataFrame) -> pd.DataFrame | None:
    """Per network and configuration, the predicted efficiency with its 90 % interval at each world size
    ("83 % (76–88)") and the regime whose model-error band it carries. None for a projection.csv written
    before the interval columns existed."""
    if "efficiency_pct_low" not in projection.columns:
        return None
    rows = []
    for (network, cell_id), group in projection.groupby(["network", "cell_id"], sort=False):
        row = {"network": network, "cell_id": cell_id}
        predicted = group.dropna(subset=["efficiency_pct"])
        for _, r in predicted.iterrows():
            # at most 100 % (a projection.csv written before the limit was applied may reach past it)
            eff, low, high = (min(LIMIT_PCT, r[c]) for c in ("efficiency_pct", "efficiency_pct_low",
                                                              "efficiency_pct_high"))
            row[f"ws{int(r['world_size'])}"] = f"{eff:.0f} % ({low:.0f}–{high:.0f})"
        regimes = [str(x) for x in predicted["interval_regime"].dropna().unique()
                   if not str(x).startswith("none")]
        row["error band"] = ", ".join(regimes)
        rows.append(row)
    return pd.DataFrame(rows)


def dominant_by_world_size(projection: pd.DataFrame) -> pd.DataFrame | None:
    """Per network and configuration, which term adds most to the compute at each world size (`none` at
    N = 1) with its ms: exposed communication, interference, straggler or host floor (projection.csv's
    dominant_term and term columns). None for a projection.csv written before those columns existed."""
    if "dominant_term" not in projection.columns:
        return None
    rows = []
    for (network, cell_id), group in projection.groupby(["network", "cell_id"], sort=False):
        row = {"network": network, "cell_id": cell_id}
        for _, r in group.dropna(subset=["efficiency_pct"]).iterrows():
            term = r["dominant_term"]
            ms = r[f"{term}_ms"] if term in LOSS_TERMS else 0.0
            row[f"ws{int(r['world_size'])}"] = f"{term} {ms:.2f} ms" if term in LOSS_TERMS else term
        rows.append(row)
    return pd.DataFrame(rows)


def projection_section(run_dir: Path, out_dir: Path, results: pd.DataFrame | None = None) -> Section:
    """The section; a note on how to make it when `bench project` has not been run on this run."""
    sec = Section("Projection", "projection")
    folder = Path(run_dir) / FOLDER
    projection = _read(folder / run_folder.PROJECTION)
    if projection is None:
        return sec.para(f"No projection yet: `python -m bench project {run_dir}` predicts this run's "
                        "configurations on 8 to 1,024 GPUs from its own cells (docs/design.md, Projection).",
                        "note")
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    if results is not None and len(results) and set(results["device"]) == {"cpu"}:
        sec.para("A CPU run: these curves project CPU compute onto GPU networks up to "
                 f"{int(projection['world_size'].max()):,} ranks. They exercise the model; they do not "
                 "predict a GPU cluster.", "warn")
    configs = configurations(results, None, None) if results is not None else []
    if efficiency_figure(projection, configs, out_dir / "plots" / "projection.png"):
        sec.image("plots/projection.png", "projected scaling efficiency, measured points on the curves")
    _projected_tables(sec, projection, out_dir)
    validation = _read(folder / run_folder.VALIDATION)
    if validation is not None and validation["error_pct"].notna().any():
        errors = validation["error_pct"].dropna()
        _table(sec, validation, out_dir, "projection_validation",
               f"Validation against this run's own larger world sizes: median |error| "
               f"{errors.abs().median():.1f} % over {len(errors)} cells "
               f"(signed median {errors.median():+.1f} %).",
               shown=["cell_id", "world_size", "measured_step_ms", "predicted_step_ms", "error_pct"])
    fits = _read(folder / run_folder.NETWORK_FIT)
    if fits is not None and len(fits):
        _table(sec, fits, out_dir, "projection_network_fit",
               "The network fitted to this run's all-reduce probe (alpha-beta per world size).")
    _notes(sec, folder / run_folder.PROJECTION_NOTES, out_dir)
    return sec


def _table(sec: Section, table: pd.DataFrame, out_dir: Path, name: str, words: str, cls: str = "",
           shown: list[str] | None = None) -> None:
    """`table` written to tables/<name>.csv and put in the section under the words that say what it is
    (its `shown` columns only, when given)."""
    write_csv(table, out_dir / "tables" / f"{name}.csv")
    sec.para(words, cls)
    sec.table(table if shown is None else table[shown], f"tables/{name}.csv")


# what each table of the projected rows is, as the section says it
EFFICIENCY_WORDS = (
    "Predicted efficiency per world size, from each configuration's smallest measured world size and the "
    "chosen network (alpha-beta all-reduce model, buckets queued on one communication stream as they "
    "become ready). Not a measurement. Strong scaling keeps the global batch, so each rank's share (its "
    "compute) shrinks with more ranks while its all-reduces do not: those curves fall toward 0 % and end "
    "(×) at the largest world size the global batch divides among; beyond it projection.csv's rows are "
    "empty, with the reason. Weak scaling holds the per-rank batch.")
INTERVAL_WORDS = (
    "Each projected efficiency with its 90 % interval: the model's own error on published multi-GPU and "
    "multi-node tables in the same regime (NVLink or PCIe inside a node, across nodes, sharded), held out "
    "by source, widened by the measured inputs' intervals (docs/projection.md, The interval). "
    "projection.csv has the samples/s interval too.")
DOMINANT_WORDS = (
    "What dominates at each world size: the largest of what N ranks add to the compute: exposed "
    "communication (all-reduce time backward could not hide), interference (backward slowed by the "
    "all-reduces it overlaps), straggler (the slowest rank's expected lag) or the host floor "
    "(docs/design.md, Projection).")


def _projected_tables(sec: Section, projection: pd.DataFrame, out_dir: Path) -> None:
    """The projected rows as tables: efficiency, and where projection.csv has their columns, its interval
    and the dominant term per world size."""
    _table(sec, efficiency_by_world_size(projection), out_dir, "projection_efficiency", EFFICIENCY_WORDS,
           "formula")
    for table, name, words in ((interval_by_world_size(projection), "projection_interval", INTERVAL_WORDS),
                               (dominant_by_world_size(projection), "projection_dominant_term",
                                DOMINANT_WORDS)):
        if table is not None and len(table):
            _table(sec, table, out_dir, name, words, "formula")


def _notes(sec: Section, notes_file: Path, out_dir: Path) -> None:
    """bench project's notes: the general ones as bullets, the one "physics of <cell>: <sources>" line per
    configuration as a table (folded when long)."""
    notes = notes_file.read_text().splitlines() if notes_file.is_file() else []
    mark = run_folder.PHYSICS_NOTE
    physics = [n.removeprefix(mark).split(": ", 1) for n in notes if n.startswith(mark)]
    general = [n for n in notes if not n.startswith(run_folder.PHYSICS_NOTE)]
    if general:
        sec.bullets(general, "notes")
    if physics:
        terms = pd.DataFrame([p if len(p) == 2 else [p[0], ""] for p in physics],
                             columns=["configuration", "straggler σ, interference γ, host floor: from"])
        _table(sec, terms, out_dir, "projection_physics",
               "Where each configuration's straggler, interference and host-floor terms came from.")
