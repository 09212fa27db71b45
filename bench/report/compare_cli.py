"""`python -m bench compare results/A results/B [more ...] [--out reports/compare-A-vs-B]`.

The first run is the baseline; each other run is joined to it on the configuration keys.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.report import compare, plots, slices, tables
from bench.report.load import RunError, load_run
from bench.report.render import Section, write_csv, write_page


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        type=Path,
        nargs="+",
        help="two or more results/<run-id>/ folders; the first is the baseline",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: reports/compare-<A>-vs-<B>...)"
    )
    parser.add_argument(
        "--allow-mixed-devices",
        action="store_true",
        help="compare CPU runs with GPU runs anyway (refused by default)",
    )


def build_compare(
    run_dirs: list[Path], out_dir: Path | None = None, allow_mixed_devices: bool = False
) -> Path:
    """Write the comparison page, tables and plots; returns index.html. RunError when refused."""
    if len(run_dirs) < 2:
        raise RunError("compare needs at least two run folders")
    runs = [load_run(d) for d in run_dirs]
    refusal = compare.mixed_devices(runs)
    if refusal and not allow_mixed_devices:
        raise RunError(refusal)
    labels = compare.run_labels(runs)
    out_dir = out_dir or Path("reports") / ("compare-" + "-vs-".join(r.name for r in runs))
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)

    diff = compare.env_differences(runs)
    joined = compare.join_cells(runs)
    only = compare.one_side_only(joined)
    write_csv(diff, out_dir / "tables/environment_diff.csv")
    write_csv(joined, out_dir / "tables/cells.csv")
    write_csv(only, out_dir / "tables/one_side_only.csv")

    sections = []
    sec = Section("Summary", "summary")
    warning = compare.software_warning(diff)
    if refusal:
        sec.para(
            "CPU and GPU runs compared on request (--allow-mixed-devices): they measure different "
            "things (gloo processes against NCCL on GPUs), so read every ratio with that in mind.",
            "warn",
        )
    if warning:
        sec.para(warning, "warn")
    both = joined[joined["presence"] == "both"]
    ratios = both["throughput_ratio_b_over_a_x"].dropna()
    for label in labels[1:]:
        r = both.loc[both["run_b"] == label, "throughput_ratio_b_over_a_x"].dropna()
        if len(r):
            sec.para(
                f"{label} against {labels[0]}: median throughput ratio {r.median():.2f}× over {len(r)} "
                f"cells measured on both (range {r.min():.2f}× to {r.max():.2f}×): at the median {label} is "
                f"{abs(r.median() - 1) * 100:.0f} % {'faster' if r.median() >= 1 else 'slower'}."
            )
    if not len(ratios):
        sec.para("No configuration was measured successfully on both sides, so there is no ratio.", "note")
    sec.para(f"{len(only)} configurations were measured on one side only (listed below).")
    sections.append(sec)

    sections.append(
        Section("Environment differences", "environment").table(diff, "tables/environment_diff.csv")
    )

    sec = Section("Cells side by side", "cells")
    sec.para(
        "Joined on " + ", ".join(compare.CONFIG_KEYS) + ". ratio = throughput b / throughput a (> 1: b "
        "is faster); delta % = (b − a) / a × 100; efficiency per side as in each run's report "
        "(against its own world-size-1 cell).",
        "formula",
    )
    sec.table(joined, "tables/cells.csv")
    sections.append(sec)

    sec = Section("Measured on one side only", "one-side")
    if len(only):
        sec.table(only, "tables/one_side_only.csv")
    else:
        sec.para("Every configuration is on both sides.")
    sections.append(sec)

    sec = Section("Plots", "plots")
    sec.para(
        "Each run's main setting (most common bucket, precision, accumulation); every column on the same "
        "axes."
    )
    for scaling in ("strong", "weak"):
        per_run = {
            label: tables.scaling_table(
                slices.main_slice(r.results[r.results["scaling"] == scaling]), scaling
            )
            for label, r in zip(labels, runs)
            if (r.results["scaling"] == scaling).any()
        }
        path = (
            plots.side_by_side(per_run, scaling, out_dir / "plots" / f"{scaling}_side_by_side.png")
            if per_run
            else None
        )
        if path:
            sec.image(path.relative_to(out_dir).as_posix(), f"{scaling} scaling side by side")
    sections.append(sec)

    title = "ddpbench compare: " + " vs ".join(labels)
    subtitle = " · ".join(
        f"{label}: {compare.gpu_summary(r.env)} ({r.device})" for label, r in zip(labels, runs)
    )
    return write_page(out_dir, title, subtitle, sections)


def main(args: argparse.Namespace) -> int:
    try:
        index = build_compare(args.run_dirs, args.out, args.allow_mixed_devices)
    except RunError as exc:
        print(f"bench compare: {exc}", file=sys.stderr)
        return 2
    print(f"compare: {index}")
    return 0
