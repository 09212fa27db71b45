"""The report of one run: index.html, summary.md, tables/*.csv and plots/*.png in reports/<run-id>/.

Each section below is a function that takes the run's rows, asks tables.py (or run_ledger.py) for its
DataFrame and the plots/ package for its figure, writes the table as CSV and says in a sentence what the
numbers mean; `write_run_page` puts the sections in reading order.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from bench.envinfo import timing_warnings
from bench.report import findings, memory, plots, run_ledger, tables, traces
from bench.report.answer_section import answer_section
from bench.report.environment import environment_table
from bench.report.projection_section import projection_section
from bench.report.render import Section, page_folder, write_csv, write_page
from bench.report.why_section import why_section
from bench.run_folder import Run, load_run, read_anatomy, read_records
from bench.schema import DEFAULT_BUCKET_MB, partial_race_row


def default_out_dir(run_dir: Path) -> Path:
    """reports/<run-id> beside results/, as the Makefile lays it out."""
    return Path("reports") / Path(run_dir).resolve().name


def write_run_page(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Render the report of `run_dir` into `out_dir` (default reports/<run-id>); returns index.html."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else default_out_dir(run.path)
    with page_folder(out, "report") as stage:  # written whole, then put in place
        write_sections(run, stage, out)
    return out / "index.html"


def write_sections(run: Run, out_dir: Path, final: Path) -> Path:
    """The page's files into `out_dir`, its links to the run's traces from `final`, where it will be."""
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    df = run.results
    scaling_tables = {
        s: tables.scaling_table(df, s) for s in ("strong", "weak") if (df["scaling"] == s).any()
    }
    files = traces.trace_files(run)
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    sections = [
        findings_section(run, scaling_tables),
        environment_section(run, out_dir),
        not_measured_section(df, out_dir),
        *([raced_out_section(df, out_dir)] if (df["status"] == "raced_out").any() else []),
        *(scaling_section(df, s, table, out_dir) for s, table in scaling_tables.items()),
        engines_section(df, out_dir),
        *sweep_sections(df, out_dir),
        phases_section(df, out_dir),
        memory_section(df, out_dir),
        *([anatomy_section(run, out_dir)] if read_anatomy(run.path) is not None else []),
        why_section(run.path, df, out_dir),
        projection_section(run.path, out_dir, run.results),
        cells_section(run, out_dir, files, final),
        traces.viewers_section(run, final, files),
    ]
    answer = answer_section(run, out_dir)  # last: it shows the figures the sections above drew
    subtitle = (
        f"Run {run.name} · {len(df)} cells · {run.env.get('device', run.device)} · "
        f"torch {run.env.get('torch', '?')} · report of {run.path}"
    )
    return write_page(out_dir, f"ddpbench report: {run.name}", subtitle, [answer, *sections],
                      summary=[answer, sections[0]], cell_ids=set(df["cell_id"]))


def _csv(df: pd.DataFrame, out_dir: Path, name: str) -> str:
    """Write `df` to tables/<name>.csv; returns that path relative to the report folder."""
    rel = f"tables/{name}.csv"
    write_csv(df, out_dir / rel)
    return rel


def _with_table(
    sec: Section, df: pd.DataFrame, out_dir: Path, name: str, plot_path: Path | None, empty_reason: str
) -> Section:
    """`sec` with the figure at `plot_path` (if drawn) and the table `df` with its CSV, or why it is empty."""
    if not len(df):
        return sec.para(empty_reason, "note")
    if plot_path is not None:
        sec.image(plot_path.relative_to(out_dir).as_posix(), name)
    return sec.table(df, _csv(df, out_dir, name), summary=_outcomes(df))


def _formula_section(title: str, anchor: str, *formulas: str) -> Section:
    """A section (`anchor` its id) that opens with the paragraphs saying how its numbers are derived."""
    sec = Section(title, anchor)
    for text in formulas:
        sec.para(text, "formula")
    return sec


def _outcomes(df: pd.DataFrame) -> str:
    """A collapsed table's one-line summary: how many of its rows have numbers."""
    if "status" not in df:
        return ""
    ok = int((df["status"] == "ok").sum())
    return f"{ok} with numbers, {len(df) - ok} without" if ok < len(df) else "all with numbers"


def findings_section(run: Run, scaling_tables: dict[str, pd.DataFrame]) -> Section:
    """The headline sentences, then whatever the loader noticed about the run folder."""
    sentences = findings.headline(run.results, scaling_tables, run.env,
                                  (run.config.get("run") or {}).get("search", "grid"))
    sec = Section("Findings", "findings").bullets(sentences, "findings")
    # from env_vars, not env.json's env_warnings, so older runs get the same warnings
    for warning in timing_warnings(run.env.get("env_vars") or {}):
        sec.para(warning, "warn")
    for note in run.notes:
        sec.para(note, "warn")
    return sec


def environment_section(run: Run, out_dir: Path) -> Section:
    """The environment fingerprint, the interconnect topology and the preset's description."""
    sec = Section("Environment", "environment")
    env = environment_table(run)
    sec.table(env, _csv(env, out_dir, "environment"))
    if run.env.get("topology"):
        sec.raw("<h3>Interconnect topology</h3>", "### Interconnect topology\n")
        sec.code(str(run.env["topology"]))
    description = run.config.get("description")
    if description:
        sec.para(f"Preset: {description}")
    return sec


def not_measured_section(df: pd.DataFrame, out_dir: Path) -> Section:
    """Every cell whose status is not ok, with the reason the runner recorded."""
    bad = run_ledger.not_measured(df)
    sec = Section("Cells without numbers", "not-measured")
    if not len(bad):
        return sec.para("Every cell finished with status ok.")
    sec.para(
        "Failed, timed-out, out-of-memory, diverged and skipped cells, with the reason the runner "
        "recorded. They also appear, marked, in every table below that covers their configuration."
    )
    return sec.table(bad, _csv(bad, out_dir, "not_measured"))


def raced_out_section(df: pd.DataFrame, out_dir: Path) -> Section:
    """The cells a racing search eliminated, when, and against which configuration (bench/race.py)."""
    table = run_ledger.raced_out(df)
    sec = Section("Raced out", "raced-out")
    sec.para(
        "A racing search (run.search) stepped each recipe's configurations side by side and stopped "
        "measuring these once another was faster beyond its corrected one-sided test: race_slowdown is "
        "their step over race_against's, with its interval at the level that test met; race_p, the "
        "hypothesis's p-value against race_level; race_round, the rounds run. "
        "Their step-time columns hold those rounds; no phase, compute-only, probe or memory pass ran, and "
        "bench advise ranks the survivors only. Cells not launched at a world size (their configuration "
        "raced out at a smaller one) carry that comparison.")
    launches = run_ledger.run_launches(df)
    if partial_race_row("raced_out", launches):
        sec.para(f"The run timed its cells in {launches} launches: a raced-out cell's own rounds are those "
                 "of "
                 "the launch that eliminated it, not a figure over every launch like the others', so its "
                 "step time is left out here and in results.csv (cells.jsonl keeps each launch's rows); "
                 "race_slowdown compares it within that launch.", "note")
    return sec.table(table, _csv(table, out_dir, "raced_out"))


def anatomy_section(run: Run, out_dir: Path) -> Section:
    """Where the run's wall time went, by the cost anatomy's parts (anatomy.PARTS), and each cell's."""
    sec = Section("Where the time went", "anatomy")
    sec.para("The run's wall time by part (anatomy.json): per run, per launch and per cell, a phase its "
             "group ran side by side shared among the cells that entered it (a race's timed rounds by the "
             "rounds each stepped). `bench run --dry-run` prints the estimate by the same parts.")
    parts = run_ledger.anatomy_run_table(read_anatomy(run.path))
    sec.table(parts, _csv(parts, out_dir, "anatomy"))
    cells = run_ledger.anatomy_cells_table(read_records(run.path))
    if len(cells):
        sec.table(cells, _csv(cells, out_dir, "anatomy_cells"), summary=f"{len(cells)} cells")
    return sec


def scaling_section(df: pd.DataFrame, scaling: str, table: pd.DataFrame, out_dir: Path) -> Section:
    """One batch rule's scaling table (tables.scaling_table) with its formula and figure."""
    sec = Section(f"{scaling.capitalize()} scaling", f"{scaling}-scaling")
    sec.para(tables.STRONG_FORMULA if scaling == "strong" else tables.WEAK_FORMULA, "formula")
    sec.para("throughput = global batch / p50 step time (samples/s); step time = per step the slowest rank.")
    why = tables.efficiency_unavailable(df)
    if why:
        sec.para(why, "note")
    plot = plots.scaling(table, scaling, out_dir / "plots" / f"{scaling}_scaling.png")
    return _with_table(sec, table, out_dir, f"{scaling}_scaling", plot, "")


def engines_section(df: pd.DataFrame, out_dir: Path) -> Section:
    """Each engine against torch DDP on the same configuration."""
    sec = _formula_section(
        "Engines against torch DDP", "engines",
        "delta % = (engine − torch) / torch × 100 on the same configuration: positive means slower "
        "(step time) or more memory. naive has no bucket size; it is set against torch at torch's "
        f"default {DEFAULT_BUCKET_MB:g} MiB buckets or, when the run has none, torch's fastest bucket size "
        "(torch_bucket_cap_mb says which). Exposed communication = p50 step − p50 compute-only step (ms).",
        "Read speed_vs_torch first: measured side by side with torch DDP in the same rounds, it is the "
        "median over rounds of torch step / engine step (> 1: faster) with its 95 % interval, and "
        "verdict_vs_torch says faster or slower only when the whole interval is on one side of 1 (else "
        "within noise); verdict_holm is that verdict once the run's comparisons are corrected as a family "
        "(Holm: at most a 5 % chance of any false verdict in the run), the one the findings state. The "
        "deltas of medians beside it compare numbers read separately, without interval.",
    )
    plot = plots.engines(df, out_dir / "plots" / "engines.png")
    empty = "No engine other than torch DDP was run, so there is nothing to compare against it."
    return _with_table(sec, tables.engines_vs_torch(df), out_dir, "engines_vs_torch", plot, empty)


def sweep_sections(df: pd.DataFrame, out_dir: Path) -> list[Section]:
    """The bucket-size, precision and accumulation sweeps: cells that differ in one setting only."""
    sweeps = [
        # naive has no bucket size: the bucket plot draws it, from the run's cells, as a reference line
        ("Bucket-size sweep", "buckets", tables.bucket_sweep(df), partial(plots.bucket_sweep, cells=df),
         "No configuration was run at more than one bucket size."),
        ("Precision", "precision", tables.precision_table(df), plots.precision,
         "No configuration was run at more than one compute dtype / comm dtype."),
        ("Gradient accumulation", "accumulation", tables.accumulation_table(df), plots.accumulation,
         "No configuration was run at more than one accumulation factor."),
    ]
    sections = []
    for title, name, table, draw, empty in sweeps:
        plot = draw(table, out_dir / "plots" / f"{name}.png") if len(table) else None
        sections.append(_with_table(Section(title, name), table, out_dir, name, plot, empty))
    return sections


def phases_section(df: pd.DataFrame, out_dir: Path) -> Section:
    """Each cell's p50 step split into compute-only step and exposed communication."""
    phase = tables.phase_breakdown(df)
    sec = _formula_section(
        "Phase breakdown", "phases",
        "p50 step = compute-only step (same cell, gradients not synchronised) + exposed communication. "
        "The plot shows one slice of the run (named under its title); the table every cell.",
    )
    plot = plots.phases(phase, out_dir / "plots" / "phases.png")
    return _with_table(sec, phase, out_dir, "phases", plot, "No cells.")


def memory_section(df: pd.DataFrame, out_dir: Path) -> Section:
    """Throughput against peak memory per rank, per engine, with the state each engine should need."""
    table = memory.memory_table(df)
    sec = _formula_section(
        "Memory trade-off", "memory",
        "peak_mem_mb: CUDA max_memory_allocated after a reset, the cell's trainer alone for a few steps; on "
        "CPU the process's peak RSS, which does not separate engines (docs/peers.md). Expected state: "
        "parameters + gradients + AdamW state per rank by the engine's layout (fsdp2 shards all three).",
    )
    plot = memory.plot(table, out_dir / "plots" / "memory.png")
    return _with_table(sec, table, out_dir, "memory", plot, "No ok cell with a throughput and a peak.")


# What the all-cells listing shows of each row (the CSV keeps every column).
CELL_LISTING = (
    *tables.CELL_COLUMNS, "n_timed_steps", "step_time_ms_p50", "step_time_ms_p90", "samples_per_s",
    "step_time_half_width_pct", "launches", "between_launch_cv_pct", "warmup_steps_detected", "outlier_steps",
    "compute_only_ms_p50", "exposed_comm_ms", "peak_mem_mb", "allreduce_busbw_gbps",
)


def cells_section(run: Run, out_dir: Path, files: dict[str, list[Path]], final: Path) -> Section:
    """Every row of the run, each with links to its trace files."""
    cols = list(CELL_LISTING)
    links = traces.trace_links(files, final)  # from where the page will be
    return Section("All cells and traces", "cells").table(
        run.results[cols], _csv(run.results, out_dir, "results"), links=links, md_columns=cols,
        summary="every cell with its status, times and trace files", cell_rows=True,
    )
