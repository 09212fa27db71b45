"""The Why section's HolisticTraceAnalysis views, from what `bench analyze` wrote into the run folder:
where each stream waited (idle_breakdown.csv), whether the host kept the GPU busy (launch_stats.csv) and
which rank the others waited for (stragglers.csv). Tables: bench/analyze/hta_tables.py.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.analyze import hta_tables
from bench.analyze.stragglers import PERSISTENT_P
from bench.analyze.summary import IDLE_FILE, LAUNCH_FILE, STRAGGLERS_FILE
from bench.report.render import Section, write_csv


def _read(path: Path) -> pd.DataFrame | None:
    """The CSV, None when absent, empty or unreadable (an older analysis: the section just leaves it out)."""
    try:
        frame = pd.read_csv(path, dtype={"cell_id": str, "step": str})
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    return frame if len(frame) else None


def _named(r) -> str:
    """One persistent straggler, beside the timers' view of the same cell when results.csv has it."""
    text = (f"cell {r.cell_id}: rank {r.straggler_rank} last in {r.steps_last} of {r.steps} steps "
            f"(p50 {r.late_by_ms_p50:.3f} ms after the next rank)")
    skew = getattr(r, "rank_skew_ms_p50", None)
    if skew is not None and pd.notna(skew):
        slowest = getattr(r, "slowest_rank", None)
        text += (f"; timers: slowest rank {'?' if pd.isna(slowest) else int(slowest)}, "
                 f"rank_skew_ms_p50 {skew:.2f} ms")
    return text


def add_hta_views(sec: Section, run_dir: Path, results: pd.DataFrame, out_dir: Path) -> Section:
    """Append the three views to `sec` (each only where its CSV has rows)."""
    idle = _read(Path(run_dir) / IDLE_FILE)
    if idle is not None:
        table = hta_tables.idle_table(idle)
        if len(table):
            sec.para("Idle time per stream (HolisticTraceAnalysis's categories), ms per profiled step summed "
                     "over streams: host wait = the stream had run all it was given and the next launch had "
                     "not come; kernel wait = gaps under 30 µs between queued kernels; other = waiting on "
                     "something else (another stream, a collective's peers).", "formula")
            write_csv(table, out_dir / "tables" / "why_idle.csv")
            sec.table(table, "tables/why_idle.csv")
    launch = _read(Path(run_dir) / LAUNCH_FILE)
    if launch is not None:
        table = hta_tables.launch_table(launch)
        if len(table):
            bound = table[table["launch_bound_steps"] > 0]
            sec.para(f"Kernel launches: {len(bound)} of {len(table)} profiled cells have launch-bound steps"
                     + (f": {', '.join(bound['cell_id'].head(5))}{', …' if len(bound) > 5 else ''}"
                        if len(bound) else "") + " (the compute stream waited for the host's next launch for "
                     "at least half the step). Launch delay = GPU start − end of the launch call; short "
                     "kernels run under 10 µs.")
            host = hta_tables.host_bound_cells(launch)
            bound = host[host["host_bound"]]
            if len(bound):
                sec.para(f"Host-bound: {len(bound)} of {len(host)} profiled cells kept the GPU busy under "
                         f"{hta_tables.HOST_BOUND_BUSY_PCT:.0f} % of the step ("
                         + ", ".join(f"{r.cell_id} {r.gpu_busy_pct:.0f} %" for r in bound.head(5).itertuples()
                                     )
                         + (", …" if len(bound) > 5 else "") + "): their steps are the host enqueueing "
                         "kernels, so engine comparisons there measure host overhead, not communication "
                         "(docs/gpu-node.md \"Sizing\").")
            write_csv(table, out_dir / "tables" / "why_launch.csv")
            sec.table(table, "tables/why_launch.csv")
    stragglers = _read(Path(run_dir) / STRAGGLERS_FILE)
    if stragglers is not None:
        table = hta_tables.straggler_table(stragglers, results)
        named = table[table["persistent"].astype(bool)] if len(table) else table
        if len(table):
            sec.para("Stragglers from the traces: per step, the rank the others waited for longest "
                     "(each collective aligned across the ranks on one clock, never raw clocks); a rank is "
                     "named when it is last in more than half of the steps and chance cannot explain it "
                     f"(chance_p ≤ {PERSISTENT_P:g}). "
                     + ("; ".join(_named(r) for r in named.head(8).itertuples())
                        or "No rank is last in more steps than chance would make it") + ".")
            write_csv(table, out_dir / "tables" / "why_stragglers.csv")
            sec.table(table, "tables/why_stragglers.csv")
    return sec
