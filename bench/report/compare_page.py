"""The comparison of two or more runs: index.html, summary.md, tables/*.csv and plots/*.png.

The first run is the baseline; each other run is joined to it on the configuration keys (compare.py).
Each section is a function from the comparison's DataFrames to a Section; `write_compare_page` puts them
in reading order.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bench.analyze import diff as analyze_diff
from bench.report import comparability, compare, compare_shift, compare_traces, plots, slices, tables
from bench.report.environment import gpu_summary
from bench.report.render import Section, page_folder, write_csv, write_page
from bench.run_folder import Run, RunError, load_run
from bench.schema import CONFIG_KEYS


def default_out_dir(runs: list[Run]) -> Path:
    """reports/compare-<A>-vs-<B>[-vs-...] from the run folders' names."""
    return Path("reports") / ("compare-" + "-vs-".join(r.name for r in runs))


def write_compare_page(
    run_dirs: list[Path], out_dir: Path | None = None, allow_mixed_devices: bool = False
) -> Path:
    """Write the comparison page, tables and plots; returns index.html. RunError when refused."""
    if len(run_dirs) < 2:
        raise RunError("compare needs at least two run folders")
    runs = [load_run(d) for d in run_dirs]
    refusal = comparability.mixed_devices(runs)
    if refusal and not allow_mixed_devices:
        raise RunError(refusal)
    unmatched = comparability.nothing_in_common(runs)
    if unmatched:
        raise RunError(unmatched)
    labels = compare.run_labels(runs)
    out = Path(out_dir or default_out_dir(runs))
    with page_folder(out, "compare") as stage:  # written whole, then put in place
        write_sections(runs, labels, refusal, stage)
    return out / "index.html"


def write_sections(runs: list[Run], labels: list[str], refusal: str | None, out_dir: Path) -> Path:
    """The comparison's files into `out_dir`."""
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)

    diff = comparability.env_differences(runs)
    joined = compare.join_cells(runs)
    only = compare.one_side_only(joined)
    for table, name in ((diff, "environment_diff"), (joined, "cells"), (only, "one_side_only")):
        write_csv(table, out_dir / f"tables/{name}.csv")

    traced = compare_traces.trace_diffs(runs, out_dir)
    for label, parts, classes in traced:
        write_csv(parts, out_dir / f"tables/trace_breakdown_{label}.csv")
        write_csv(classes, out_dir / f"tables/kernel_classes_{label}.csv")
    sections = [
        summary_section(labels, diff, joined, len(only), mixed_devices=bool(refusal),
                        search=comparability.search_warning(runs)),
        Section("Environment differences", "environment").table(diff, "tables/environment_diff.csv"),
        traces_section(labels[0], traced),
        cells_section(joined),
        one_side_section(only),
        plots_section(runs, labels, out_dir),
    ]
    title = "ddpbench compare: " + " vs ".join(labels)
    subtitle = " · ".join(f"{label}: {gpu_summary(r.env)} ({r.device})" for label, r in zip(labels, runs))
    return write_page(out_dir, title, subtitle, sections)


def summary_section(
    labels: list[str], diff: pd.DataFrame, joined: pd.DataFrame, n_one_side: int, mixed_devices: bool,
    search: str = "",
) -> Section:
    """Warnings (mixed devices, differing software, differing run.search), then each run's median
    throughput ratio."""
    sec = Section("Summary", "summary")
    if mixed_devices:
        sec.para(
            "CPU and GPU runs compared on request (--allow-mixed-devices): they measure different "
            "things (gloo processes against NCCL on GPUs), so read every ratio with that in mind.",
            "warn",
        )
    for warning in (comparability.software_warning(diff), search):
        if warning:
            sec.para(warning, "warn")
    differences = comparability.difference_list(diff)
    if differences:
        sec.para("Environment differences (machine facts and variables; all fields under Environment "
                 "differences below):").bullets(differences, "findings")
    ratios = compare.throughput_ratios(joined).set_index("run_b")
    launches = compare.launch_noise(joined) if len(ratios) else pd.DataFrame()
    for text in (*ratio_paragraphs(labels, joined, ratios, launches),
                 *verdict_paragraphs(labels, joined, launches)):
        sec.para(text)
    if not len(ratios):
        sec.para("No configuration was measured successfully on both sides, so there is no ratio.", "note")
    return sec.para(f"{n_one_side} configurations were measured on one side only (listed below).")


def count_words(counts: pd.Series) -> str:
    """'3 faster, 1 slower, 28 within noise' from a verdict_counts row."""
    words = ("faster", "slower", "within noise", "no interval")
    return ", ".join(f"{int(counts[w])} {w}" for w in words if w in counts)


def comparisons(counts: pd.DataFrame, label: str) -> int:
    """The cells of a run that were compared (those with an interval on both sides)."""
    row = counts.loc[label]
    return int(sum(row[w] for w in ("faster", "slower", "within noise") if w in row))


def ratio_paragraphs(labels: list[str], joined: pd.DataFrame, ratios: pd.DataFrame,
                     launches: pd.DataFrame) -> list[str]:
    """Per other run with a ratio: its median throughput ratio against the baseline, its range, and whether
    the difference stands out of the comparison's noise floor and the runs' launch noise."""
    floors = compare.noise_floor_pct(joined)
    out = []
    for label in labels[1:]:
        if label in ratios.index:
            r = ratios.loc[label]
            out.append(f"{label} against {labels[0]}: median throughput ratio {r['median']:.2f}× over "
                       f"{int(r['cells'])} cells measured on both "
                       f"(range {r['min']:.2f}× to {r['max']:.2f}×): "
                       + median_words(label, r["median"], floors.get(label, float("nan")))
                       + " " + launch_words(labels[0], label, launches.loc[label]))
    return out


def verdict_paragraphs(labels: list[str], joined: pd.DataFrame, launches: pd.DataFrame) -> list[str]:
    """Per other run: the shift common to its cells (where there are enough), then how many cells are faster,
    slower or within noise, after Holm's correction, each cell alone, and against no difference."""
    shifts = compare_shift.launch_shifts(joined) if len(joined) else pd.DataFrame()
    counts, alone, raw = ((compare.verdict_counts(joined, col).set_index("run_b") if len(joined)
                           else pd.DataFrame())
                          for col in ("verdict_holm", "verdict_vs_shift", "verdict_b_vs_a"))
    out = []
    for label in labels[1:]:
        if label not in counts.index:
            continue
        m = comparisons(counts, label)
        holm = (f" once corrected for the {m} comparisons (Holm's correction, as the run report's: a pair of "
                "runs of the same code then shows no faster or slower cell in at least 95 % of comparisons)")
        shift = shifts.loc[label]
        if pd.notna(shift["launch_shift_x"]):
            out.append(shift_words(labels[0], label, shift, launches.loc[label]))
            out.append(f"{label} against {labels[0]}, cell by cell against that common shift (each cell's "
                       "ratio over the shift, its own 95 % interval and the shift's together, so a verdict "
                       "says the cell differs from the rest of the run): " + count_words(counts.loc[label])
                       + holm
                       + "; each cell alone against the shift: " + count_words(alone.loc[label])
                       + "; against no difference (the shift left in), each cell alone: "
                       + count_words(raw.loc[label]) + ".")
        else:
            out.append(f"{label} against {labels[0]}, cell by cell with both sides' 95 % intervals: "
                       + count_words(counts.loc[label]) + holm + "; each cell alone: "
                       + count_words(raw.loc[label]) + " (faster or slower only when the whole interval of "
                       f"the ratio is on one side of 1). With {int(shift['launch_shift_cells'])} cells with "
                       f"an interval on both sides (fewer than {compare_shift.MIN_SHIFT_CELLS}) there is no "
                       "shift common to all cells to estimate, so each cell is tested against no difference "
                       "and a launch effect would show as cells that differ.")
    return out


def shift_words(label_a: str, label_b: str, shift: pd.Series, medians: pd.Series) -> str:
    """The shift common to every cell (compare_shift.launch_shift) in words, with what the runs' launches say
    of it: whether it exceeds what their between-launch spread would give, where both ran several launches."""
    x, low, high = (shift[f"launch_shift{c}_x"] for c in ("", "_ci95_low", "_ci95_high"))
    way = "faster" if x >= 1 else "slower"
    text = (f"{label_b} is {abs(x - 1) * 100:.0f} % {way} than {label_a} across every cell: the shift common "
            f"to all cells is {x:.3f}× [{low:.3f}, {high:.3f}] (95 %; the median over "
            f"{int(shift['launch_shift_cells'])} cells of the log throughput ratio, its interval that of a "
            "median from the cells' spread); a shift common to all cells cannot be told from a launch effect "
            "unless the runs have several launches each.")
    spread = compare_shift.launch_spread_pct(*(medians.get(f"{c}_{side}") for side in ("a", "b")
                                         for c in ("launches", "between_launch_cv_pct")))
    if spread is None:
        return text + " At least one of them timed each cell in one launch, so that cannot be said here."
    beyond = abs(math.log(x)) * 100 > spread
    return text + (" Both did: their between-launch spread (median between_launch_cv_pct over their "
                   f"launches) would give a common shift within ±{spread:.1f} % (95 %), which this one "
                   + ("exceeds: more than a launch effect of theirs would explain." if beyond
                      else "does not exceed: it may be a launch effect."))


def launch_words(label_a: str, label_b: str, medians: pd.Series) -> str:
    """What each run measured of the noise between launches, where the floor comes from: per run its
    launches per cell and the median between_launch_cv_pct, or that it is unknown (one launch)."""
    parts, unknown = [], []
    for label, side in ((label_a, "a"), (label_b, "b")):
        n, cv = medians.get(f"launches_{side}"), medians.get(f"between_launch_cv_pct_{side}")
        if pd.isna(n) or n < 2 or pd.isna(cv):
            unknown.append(label)
        else:
            parts.append(f"{label} timed each cell in {n:.0f} launches, whose medians spread by "
                         f"{cv:.1f} % (median between_launch_cv_pct)")
    text = ("The floor holds the runs' own between-launch variance: " + "; ".join(parts) + "."
            if parts else "")
    if unknown:
        whose = "its" if len(unknown) == 1 else "their"
        text += (f" {' and '.join(unknown)} timed each cell in one launch, so {whose} "
                 "between-launch variance is unknown and the floor counts only the noise within a launch; "
                 "runs of the same code differ by more than that (run.launches measures it).")
    return text.strip()


def median_words(label: str, median: float, floor_pct: float) -> str:
    """The median difference in words, as noise when it is inside the run-to-run noise floor."""
    diff_pct = abs(median - 1) * 100
    way = "faster" if median >= 1 else "slower"
    if pd.isna(floor_pct):
        return (f"at the median {label} is {diff_pct:.0f} % {way}; the cells recorded no intervals, so the "
                f"run-to-run noise floor is unknown and this may be noise.")
    floor = (f"the run-to-run noise floor here is ±{floor_pct:.0f} % (the median half-width of the cells' "
             f"95 % ratio intervals)")
    if diff_pct <= floor_pct:
        return (f"a {diff_pct:.0f} % difference inside the noise: {floor}, so the two runs cannot be told "
                f"apart at the median.")
    return f"at the median {label} is {diff_pct:.0f} % {way}, beyond the noise: {floor}."


def traces_section(label_a: str, traced: list[tuple[str, pd.DataFrame, pd.DataFrame]]) -> Section:
    """Why B differs from A, per configuration both runs traced: one sentence each, then the tables."""
    sec = Section("Why they differ: the traces", "traces")
    if not traced:
        return sec.para("No configuration was profiled in both runs (no traces to compare).", "note")
    sec.para(
        "From each run's traces (trace_summary.csv and kernel_classes.csv of bench analyze): ms per profiled "
        "step and rank, mean over steps and ranks; step = the ProfilerStep's length on the host, host = its "
        "CPU exec time; kernel classes by name (docs/analysis.md, kernel_classes.csv), Σ kernel time per "
        "step. change = b − a; ratio = b / a; 'fell/rose N×' gives the larger over the smaller.",
        "formula",
    )
    for label, parts, classes in traced:
        sec.bullets([analyze_diff.sentence(c, parts, classes, label_a, label)
                     for c in parts["config"].drop_duplicates()], "findings")
        sec.table(parts, f"tables/trace_breakdown_{label}.csv")
        sec.table(classes, f"tables/kernel_classes_{label}.csv")
    return sec


def cells_section(joined: pd.DataFrame) -> Section:
    """Every configuration side by side, with the formulas of its columns."""
    sec = Section("Cells side by side", "cells")
    sec.para(
        "Joined on " + ", ".join(CONFIG_KEYS) + ". ratio = throughput b / throughput a (> 1: b "
        "is faster); delta % = (b − a) / a × 100; efficiency per side as in each run's report "
        "(against its own world-size-1 cell). launch_shift_x = the shift common to all cells (median of the "
        "cells' log ratios, with its 95 % interval); ratio_vs_shift_x = ratio / launch_shift_x, its p "
        "(p_vs_shift) and verdict (verdict_vs_shift); verdict_holm = that verdict after Holm's correction "
        "over the pair's cells (against 1, p_b_vs_a, where fewer than 4 cells leave no shift).",
        "formula",
    )
    return sec.table(joined, "tables/cells.csv")


def one_side_section(only: pd.DataFrame) -> Section:
    """The configurations only one run measured."""
    sec = Section("Measured on one side only", "one-side")
    if not len(only):
        return sec.para("Every configuration is on both sides.")
    return sec.table(only, "tables/one_side_only.csv")


def plots_section(runs: list[Run], labels: list[str], out_dir: Path) -> Section:
    """Per batch rule, every run's scaling at its main setting on the same axes."""
    sec = Section("Plots", "plots")
    sec.para(
        "Each run's main setting (most common bucket, precision, accumulation); every column on the same "
        "axes."
    )
    for scaling in ("strong", "weak"):
        per_run = {
            label: tables.scaling_table(slices.main_slice(rows), scaling)
            for label, rows in zip(labels, (r.results[r.results["scaling"] == scaling] for r in runs))
            if len(rows)
        }
        path = out_dir / "plots" / f"{scaling}_side_by_side.png"
        drawn = plots.side_by_side(per_run, scaling, path) if per_run else None
        if drawn:
            sec.image(drawn.relative_to(out_dir).as_posix(), f"{scaling} scaling side by side")
    return sec
