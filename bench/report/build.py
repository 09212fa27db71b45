"""`build_report(run_dir, out_dir)`: tables (CSV), plots (PNG), index.html and summary.md for one run."""

from __future__ import annotations

import html
import os
from functools import partial
from pathlib import Path

import pandas as pd

from bench.report import findings, plots, tables
from bench.report.load import Run, load_run
from bench.report.render import Section, write_csv, write_page
from bench.schema import DEFAULT_BUCKET_MB, TRACE_GLOB, MiB


def default_out_dir(run_dir: Path) -> Path:
    """reports/<run-id> beside results/, as the Makefile and DESIGN.md lay it out."""
    return Path("reports") / Path(run_dir).resolve().name


def environment(run: Run) -> pd.DataFrame:
    """The environment fingerprint as (field, value) rows, from env.json."""
    env = run.env
    gpus = env.get("gpus") or []
    names = sorted({g.get("name", "?") for g in gpus})
    tf32 = env.get("tf32") or {}
    rows = [
        ("device / backend", f"{env.get('device', run.device)} / {env.get('backend', '')}"),
        ("GPUs", f"{env.get('gpu_count', len(gpus))} × {', '.join(names)}" if gpus else "none"),
        (
            "GPU memory (MB) / capability",
            ", ".join(sorted({f"{g.get('memory_mb')} / {g.get('capability')}" for g in gpus})) or "",
        ),
        ("driver", env.get("driver")),
        ("CUDA", env.get("cuda")),
        ("cuDNN", env.get("cudnn")),
        ("NCCL", env.get("nccl")),
        ("torch", env.get("torch")),
        ("python", env.get("python")),
        ("TF32 (matmul / cudnn)", f"{tf32.get('matmul')} / {tf32.get('cudnn')}" if tf32 else None),
        ("CPU", f"{env.get('cpu_model', '')} ({env.get('cpu_cores', '?')} cores)"),
        ("host", env.get("hostname")),
        ("git sha", env.get("git_sha")),
        ("started", env.get("time")),
        ("command", env.get("command")),
        (
            "environment variables",
            ", ".join(f"{k}={v}" for k, v in sorted((env.get("env_vars") or {}).items())),
        ),
    ]
    return pd.DataFrame(
        [(k, "—" if v is None or v == "" else str(v)) for k, v in rows], columns=["field", "value"]
    )


def trace_files(run: Run) -> dict[str, list[Path]]:
    """cell_id → its trace files (absolute), for cells whose trace_dir exists."""
    out = {}
    for _, r in run.results.iterrows():
        if r["trace_dir"]:
            folder = run.path / r["trace_dir"]
            out[r["cell_id"]] = sorted(folder.glob(TRACE_GLOB)) if folder.is_dir() else []
    return out


def _trace_links(run: Run, out_dir: Path, files: dict[str, list[Path]]) -> dict[str, str]:
    links = {}
    for cell_id, paths in files.items():
        if not paths:
            links[cell_id] = "trace folder empty or missing"
            continue
        items = []
        for p in paths:
            rel = os.path.relpath(p, out_dir.resolve())
            items.append(f'<a href="{html.escape(rel)}">{html.escape(p.name.split(".")[0])}</a>')
        links[cell_id] = " ".join(items)
    return links


def _write_csv(df: pd.DataFrame, out_dir: Path, name: str) -> str:
    rel = f"tables/{name}.csv"
    write_csv(df, out_dir / rel)
    return rel


def _plot_rel(path: Path | None, out_dir: Path) -> str | None:
    return None if path is None else path.relative_to(out_dir).as_posix()


def _table_section(
    sec: Section, df: pd.DataFrame, out_dir: Path, name: str, plot_path: Path | None, empty_reason: str
) -> Section:
    if not len(df):
        return sec.para(empty_reason, "note")
    rel = _plot_rel(plot_path, out_dir)
    if rel:
        sec.image(rel, name)
    return sec.table(df, _write_csv(df, out_dir, name))


def build_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Render the report of `run_dir` into `out_dir` (default reports/<run-id>); returns index.html."""
    run = load_run(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(run.path)
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    df = run.results
    plot_dir = out_dir / "plots"

    scaling_tables = {
        s: tables.scaling_table(df, s) for s in ("strong", "weak") if (df["scaling"] == s).any()
    }
    sentences = findings.headline(df, scaling_tables)
    sections = []

    sec = Section("Findings", "findings").bullets(sentences, "findings")
    for note in run.notes:
        sec.para(note, "warn")
    sections.append(sec)

    env_sec = Section("Environment", "environment")
    env = environment(run)
    env_sec.table(env, _write_csv(env, out_dir, "environment"))
    if run.env.get("topology"):
        env_sec.raw("<h3>Interconnect topology</h3>", "### Interconnect topology\n").code(
            str(run.env["topology"])
        )
    description = run.config.get("description")
    if description:
        env_sec.para(f"Preset: {description}")
    sections.append(env_sec)

    bad = tables.not_measured(df)
    sec = Section("Cells without numbers", "not-measured")
    if len(bad):
        sec.para(
            "Failed, timed-out, out-of-memory, diverged and skipped cells, with the reason the runner "
            "recorded. They also appear, marked, in every table below that covers their configuration."
        )
        sec.table(bad, _write_csv(bad, out_dir, "not_measured"))
    else:
        sec.para("Every cell finished with status ok.")
    sections.append(sec)

    why = tables.efficiency_unavailable(df)
    for scaling, table in scaling_tables.items():
        sec = Section(f"{scaling.capitalize()} scaling", f"{scaling}-scaling")
        sec.para(tables.STRONG_FORMULA if scaling == "strong" else tables.WEAK_FORMULA, "formula")
        sec.para(
            "throughput = global batch / p50 step time (samples/s); step time = per step the slowest rank."
        )
        if why:
            sec.para(why, "note")
        _table_section(
            sec,
            table,
            out_dir,
            f"{scaling}_scaling",
            plots.scaling(table, scaling, plot_dir / f"{scaling}_scaling.png"),
            "",
        )
        sections.append(sec)

    vs_torch = tables.engines_vs_torch(df)
    sec = Section("Engines against torch DDP", "engines")
    sec.para(
        "delta % = (engine − torch) / torch × 100 on the same configuration: positive means slower "
        "(step time) or more memory. naive has no bucket size; it is set against torch at torch's "
        f"default {DEFAULT_BUCKET_MB:g} MiB buckets or, when the run has none, torch's fastest bucket size "
        "(torch_bucket_cap_mb says which). Exposed communication = p50 step − p50 compute-only step (ms).",
        "formula",
    )
    _table_section(
        sec,
        vs_torch,
        out_dir,
        "engines_vs_torch",
        plots.engines(df, plot_dir / "engines.png"),
        "No engine other than torch DDP was run, so there is nothing to compare against it.",
    )
    sections.append(sec)

    for title, anchor, table, plot_fn, empty in [
        (
            "Bucket-size sweep",
            "buckets",
            tables.bucket_sweep(df),
            partial(plots.bucket_sweep, cells=df),  # naive, bucket-less, drawn as a reference line
            "No configuration was run at more than one bucket size.",
        ),
        (
            "Precision",
            "precision",
            tables.precision_table(df),
            plots.precision,
            "No configuration was run at more than one compute dtype / comm dtype.",
        ),
        (
            "Gradient accumulation",
            "accumulation",
            tables.accumulation_table(df),
            plots.accumulation,
            "No configuration was run at more than one accumulation factor.",
        ),
    ]:
        sec = Section(title, anchor)
        plot_path = plot_fn(table, plot_dir / f"{anchor}.png") if len(table) else None
        _table_section(sec, table, out_dir, anchor, plot_path, empty)
        sections.append(sec)

    phase = tables.phase_breakdown(df)
    sec = Section("Phase breakdown", "phases")
    sec.para(
        "p50 step = compute-only step (same cell, gradients not synchronised) + exposed communication. "
        "The plot shows one slice of the run (named under its title); the table every cell.",
        "formula",
    )
    _table_section(sec, phase, out_dir, "phases", plots.phases(phase, plot_dir / "phases.png"), "No cells.")
    sections.append(sec)

    files = trace_files(run)
    sec = Section("All cells and traces", "cells")
    cols = [
        *tables.CELL_COLUMNS,
        "n_timed_steps",
        "step_time_ms_p50",
        "step_time_ms_p90",
        "samples_per_s",
        "compute_only_ms_p50",
        "exposed_comm_ms",
        "peak_mem_mb",
        "allreduce_busbw_gbps",
    ]
    sec.table(
        df[cols], _write_csv(df, out_dir, "results"), links=_trace_links(run, out_dir, files), md_columns=cols
    )
    sections.append(sec)
    sections.append(_viewers_section(run, out_dir, files))

    subtitle = (
        f"Run {run.name} · {len(df)} cells · {run.env.get('device', run.device)} · "
        f"torch {run.env.get('torch', '?')} · report of {run.path}"
    )
    return write_page(out_dir, f"ddpbench report: {run.name}", subtitle, sections)


def _viewers_section(run: Run, out_dir: Path, files: dict[str, list[Path]]) -> Section:
    sec = Section("Viewing the traces", "traces")
    n_files = sum(len(v) for v in files.values())
    if not n_files:
        return sec.para(
            "This run recorded no profiler traces (profiling off, or every profiled cell failed).", "note"
        )
    size = sum(p.stat().st_size for v in files.values() for p in v)
    size_text = f"{size / MiB:.1f} MiB" if size >= MiB else f"{size / 1024:.0f} KiB"
    sec.para(
        f"{n_files} trace files in {sum(1 for v in files.values() if v)} cells ({size_text} gzipped), "
        f"one per rank, under {run.path / 'traces'}. Each cell's links are in the table above."
    )
    listing = [
        f"- {cell_id}: "
        + " ".join(f"[{p.name.split('.')[0]}]({os.path.relpath(p, out_dir.resolve())})" for p in v)
        for cell_id, v in files.items()
        if v
    ]
    sec.raw("", "\n".join(listing) + "\n")  # the HTML has these links in the cells table
    try:  # the command as the user would type it from the repository root
        run_arg = str(run.path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        run_arg = str(run.path)
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
    example = next(k for k, v in files.items() if v)
    sec.code(
        "from hta.trace_analysis import TraceAnalysis  # pip install HolisticTraceAnalysis\n"
        f'analyzer = TraceAnalysis(trace_dir="{run.path / "traces" / example}")\n'
        "analyzer.get_temporal_breakdown()  # idle / compute / non-compute time per rank\n"
        "analyzer.get_comm_comp_overlap()   # how much communication hides behind compute"
    )
    sec.para(
        "HTA reads the rank from each file's distributedInfo, which torch.profiler writes inside an "
        "initialised process group (as the suite's workers are), and keeps one file per rank: point it at "
        "one cell's folder."
    )
    return sec
