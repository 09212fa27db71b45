"""The run page's "Why" section: the traces' breakdown (what `bench analyze` wrote into the run folder)
explaining the scaling tables — per engine and world size the stacked breakdown of a step, the all-reduce
share and overlap; how much of the exposed communication waited for the last rank, and for which rank, with
each rank's step drawn (why_waits.py); the two witnesses of exposed communication (RUN/witnesses.csv, as
bench analyze wrote it); the seeds' table; idle time per stream, kernel launches and stragglers (why_hta.py).

The report never analyses traces itself (bench.analyze does, `bench run --report` runs it first): without
RUN/trace_summary.csv the section says how to get it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench import (
    run_folder,  # noqa: E402
    style,  # noqa: E402
)
from bench.analyze import tables as trace_tables  # noqa: E402
from bench.analyze.load import find_trace_files  # noqa: E402
from bench.report.render import Section, write_csv  # noqa: E402
from bench.report.why_hta import add_hta_views  # noqa: E402
from bench.report.why_waits import add_wait_views  # noqa: E402

SUMMARY, WITNESSES = run_folder.TRACE_SUMMARY, run_folder.WITNESSES
PARTS = (("compute_alone_ms", "compute", style.COMPUTE),
         ("exposed_comm_ms", "exposed communication", style.EXPOSED_COMM),
         ("hidden_comm_ms", "hidden communication", style.HIDDEN_COMM),
         ("memory_alone_ms", "memory", style.MEMORY),
         ("idle_ms", "idle / CPU", style.IDLE))


def breakdown_figure(table: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars: one per (engine, world size), the parts of a profiled step that add up to its span."""
    parts = [(c, label, color) for c, label, color in PARTS if c in table and table[c].notna().any()]
    if table.empty or not parts:
        return None
    labels = [f"{e}\nws{int(n)}" for e, n in zip(table["engine"], table["world_size"])]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(table) + 1.5), 3.4))
    bottom = pd.Series(0.0, index=table.index)
    for column, label, color in parts:
        values = table[column].fillna(0.0)
        ax.bar(labels, values, bottom=bottom, color=color, label=label, width=0.7)
        bottom += values
    ax.set_ylabel("ms per profiled step")
    ax.set_title("where a profiled step's time goes (traces, mean over steps and ranks)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _witnesses(sec: Section, run_dir: Path, out_dir: Path) -> Section:
    """The two witnesses of exposed communication as `bench analyze` wrote them (RUN/witnesses.csv):
    read, counted and shown, never recomputed here."""
    path = run_dir / WITNESSES
    if not path.is_file():
        return sec.para(f"No {WITNESSES} (written by an older `bench analyze`): rerun `python -m bench "
                        f"analyze {run_dir}` for the two witnesses of exposed communication.", "note")
    try:
        witnesses = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        return sec.para(f"{path} cannot be read ({e}); rerun `python -m bench analyze {run_dir}`.", "warn")
    if not len(witnesses):
        return sec
    flag = witnesses["disagree"].astype(str).str.lower()
    disagree = witnesses[flag == "true"]
    judged = int(flag.isin(["true", "false"]).sum())
    ones = disagree[disagree["world_size"] == 1]
    sec.para("Exposed communication per step, two witnesses. Timers: (step − compute-only under no_sync) "
             "− sync_overhead_ms, the engine's work that no_sync skips besides communication, measured at "
             "world size 1 (sync_overhead_from names the cell). Trace: the profiled steps' exposed "
             "communication less its waiting for the last rank (the timers' compute-only window is the "
             "slowest rank's), the profiled pass's barrier left out. They disagree when the timers' 95 % "
             "interval and the trace's range over steps and ranks do not overlap (`note` says why a cell is "
             "not compared, or which side is above): "
             f"{len(disagree)} of {judged} cells ({len(ones)} at world size 1)"
             + (f": {', '.join(disagree['cell_id'].head(5))}{', …' if len(disagree) > 5 else ''}"
                if len(disagree) else "") + ". Definitions: docs/analysis.md, Two witnesses.", "formula")
    write_csv(witnesses, out_dir / "tables" / "why_two_witnesses.csv")
    return sec.table(witnesses, "tables/why_two_witnesses.csv")


def why_section(run_dir: Path, results: pd.DataFrame, out_dir: Path) -> Section:
    """The section; a note on how to make it when the run's traces have not been analysed."""
    sec = Section("Why: the traces' breakdown", "why")
    path = Path(run_dir) / SUMMARY
    traced = results["trace_dir"].fillna("").astype(str) != "" if "trace_dir" in results else None
    if not path.is_file() and traced is not None and not traced.any():
        return sec.para("This run recorded no profiler traces (profiling off, or no profiled cell got to its "
                        "profiled pass): there is nothing to break down.", "note")
    if not path.is_file():
        return sec.para(f"No trace analysis yet: `python -m bench analyze {run_dir}` computes it from the "
                        "run's traces (`bench run --report` does it first).", "note")
    try:
        summary = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        return sec.para(f"{path} cannot be read ({e}); rerun `python -m bench analyze {run_dir}`.", "warn")
    caveat = unanalysed_caveat(Path(run_dir), results, summary)
    if caveat:
        sec.para(caveat, "warn")
    table = trace_tables.breakdown(summary, results)
    sec.para("From the profiled steps (never the timed ones): compute alone, communication not hidden behind "
             "compute (exposed), communication overlapped with compute (hidden), memory copies, and idle or "
             "CPU-bound time; they add up to the step's span. overlap_pct = hidden / all communication "
             "(HolisticTraceAnalysis' definition). Definitions: docs/analysis.md.", "formula")
    figure = breakdown_figure(table, out_dir / "plots" / "why_breakdown.png")
    if figure is not None:
        sec.image(figure.relative_to(out_dir).as_posix(), "breakdown of a profiled step")
    write_csv(table, out_dir / "tables" / "why_breakdown.csv")
    sec.table(table, "tables/why_breakdown.csv")
    sec = add_wait_views(sec, Path(run_dir), summary, results, out_dir)
    sec = _witnesses(sec, Path(run_dir), out_dir)
    seeds = trace_tables.seeds_table(summary, results)
    if len(seeds):
        write_csv(seeds, out_dir / "tables" / "why_seeds_table.csv")
        sec.para("The seeds' table (the panes the original experiment read off TensorBoard), per cell.")
        sec.table(seeds.rename(columns=trace_tables.SEEDS_HEADINGS), "tables/why_seeds_table.csv")
    return add_hta_views(sec, run_dir, results, out_dir)


def unanalysed_caveat(run_dir: Path, results: pd.DataFrame, summary: pd.DataFrame) -> str | None:
    """What the analysis is missing: the run's trace files (its cells' trace_dir, as `bench analyze` finds
    them) that trace_summary.csv has no row of — a file it could not read (it exited 1 naming it) or one
    written after it ran — by cell and rank; None when it read them all."""
    if "trace_dir" not in results or "trace_file" not in summary:
        return None
    read = set(summary["trace_file"].astype(str))
    present, missing = 0, []
    for cell_id, trace_dir in zip(results["cell_id"], results["trace_dir"].fillna("")):
        folder = run_dir / str(trace_dir)
        if not trace_dir or not folder.is_dir():
            continue
        for path in find_trace_files(folder):
            present += 1
            if path.relative_to(run_dir).as_posix() not in read:
                missing.append((cell_id, path.name.split(".")[0]))
    if not missing:
        return None
    cells = sorted({c for c, _ in missing})
    named = "; ".join(f"{c}: {', '.join(r for cc, r in missing if cc == c)}" for c in cells[:5])
    return (f"Partial analysis: `bench analyze` read {present - len(missing)} of {present} trace files; "
            f"not those of {len(cells)} cell(s) ({named}{'; …' if len(cells) > 5 else ''}). Those cells' "
            "rows "
            "below rest on the ranks it read, and their collectives, whose ranks are not all there, have no "
            f"waits. `python -m bench analyze {run_dir}` names each file it cannot read and why.")
