"""A run's profiler traces on its report page: each cell's files, links to them, and how to open them.

The files are `traces/<cell_id>/rank<r>.*.pt.trace.json.gz` (bench.schema.TRACE_GLOB), one per rank; the page
links them relative to the report folder so it still opens from disk.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from bench import run_folder
from bench.report.render import Section
from bench.run_folder import Run
from bench.schema import TRACE_GLOB, MiB


def trace_files(run: Run) -> dict[str, list[Path]]:
    """cell_id → its trace files, for every cell with a trace_dir (empty when that folder is missing)."""
    traced = run.results[run.results["trace_dir"] != ""]
    folders = {cell_id: run.path / d for cell_id, d in zip(traced["cell_id"], traced["trace_dir"])}
    return {c: sorted(f.glob(TRACE_GLOB)) if f.is_dir() else [] for c, f in folders.items()}


def _rank_name(path: Path) -> str:
    """'rank0' for rank0.1700000000000.pt.trace.json.gz."""
    return path.name.split(".")[0]


def trace_links(files: dict[str, list[Path]], out_dir: Path) -> dict[str, str]:
    """cell_id → HTML links to its trace files (relative to `out_dir`), or why there are none."""
    here = out_dir.resolve()
    return {
        cell_id: " ".join(
            f'<a href="{html.escape(os.path.relpath(p, here))}">{html.escape(_rank_name(p))}</a>'
            for p in paths
        )
        or "trace folder empty or missing"
        for cell_id, paths in files.items()
    }


def viewers_section(run: Run, out_dir: Path, files: dict[str, list[Path]]) -> Section:
    """How many traces the run has, and the commands that open them in TensorBoard, Perfetto and HTA."""
    sec = Section("Viewing the traces", "traces")
    traced = {cell_id: paths for cell_id, paths in files.items() if paths}
    if not traced:
        return sec.para(
            "This run recorded no profiler traces (profiling off, or every profiled cell failed).", "note"
        )
    n_files = sum(len(paths) for paths in traced.values())
    size = sum(p.stat().st_size for paths in traced.values() for p in paths)
    size_text = f"{size / MiB:.1f} MiB" if size >= MiB else f"{size / 1024:.0f} KiB"
    sec.para(
        f"{n_files} trace files in {len(traced)} cells ({size_text} gzipped), "
        f"one per rank, under {run.path / run_folder.TRACES}. Each cell's links are in the table above."
    )
    here = out_dir.resolve()
    listing = [
        f"- {cell_id}: " + " ".join(f"[{_rank_name(p)}]({os.path.relpath(p, here)})" for p in paths)
        for cell_id, paths in traced.items()
    ]
    sec.raw("", "\n".join(listing) + "\n")  # the HTML has these links in the cells table
    _viewer_commands(sec, run, next(iter(traced)))
    return sec


def _viewer_commands(sec: Section, run: Run, example_cell: str) -> None:
    try:  # the command as the user would type it from the repository root
        run_arg = str(run.path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        run_arg = str(run.path)
    start = len(sec.html)
    sec.raw(
        "<h3>TensorBoard (torch-tb-profiler: each cell a run, each rank a worker)</h3>",
        "### TensorBoard (torch-tb-profiler: each cell a run, each rank a worker)\n",
    )
    sec.code(f"make tensorboard RUN={run_arg}\n# or: python -m bench tensorboard {run_arg} --port 6006")
    sec.raw("<h3>Perfetto</h3>", "### Perfetto\n")
    sec.para(
        "Open https://ui.perfetto.dev, choose “Open trace file” and pick a rank's .pt.trace.json.gz: "
        "the file is read in the browser, nothing is uploaded. One file is one rank: open them one at a "
        "time to compare ranks."
    )
    sec.raw("<h3>HolisticTraceAnalysis</h3>", "### HolisticTraceAnalysis\n")
    sec.code(
        "from hta.trace_analysis import TraceAnalysis  # pip install HolisticTraceAnalysis\n"
        f'analyzer = TraceAnalysis(trace_dir="{run.path / run_folder.TRACES / example_cell}")\n'
        "analyzer.get_temporal_breakdown()  # idle / compute / non-compute time per rank\n"
        "analyzer.get_comm_comp_overlap()   # how much communication hides behind compute"
    )
    sec.para(
        "HTA reads the rank from each file's distributedInfo, which torch.profiler writes inside an "
        "initialised process group (as the suite's workers are), and keeps one file per rank: point it at "
        "one cell's folder."
    )
    # folded: the commands are reference, a click away (the page stays short enough to read)
    sec.html[start:] = ["<details><summary>How to open them: TensorBoard, Perfetto, HolisticTraceAnalysis"
                        "</summary>" + "".join(sec.html[start:]) + "</details>"]
