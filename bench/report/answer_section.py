"""The report's first screen: the advice (`bench advise`), four headline numbers with their intervals, what a
CPU run can and cannot tell, the cells that failed, and the two figures that carry the story.

The advice sentence is advice.md's when `bench advise` has run; otherwise bench.advise writes it now without
a projection (nothing is written into the run folder), and it says how to get one. The headline numbers are
one table (`headline_numbers`), so index.html and summary.md show the same figures.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from bench import run_folder, stats
from bench.advise import api as advise
from bench.advise.answer import CPU_CAVEAT
from bench.report import tables
from bench.report.render import Section, md_cell
from bench.run_folder import Run

# The two figures of the first screen, by file name under plots/ (drawn by their own sections): how it
# scales, and why; the first of each pair that the run has.
STORY_PLOTS = (
    (("strong_scaling.png", "strong scaling"), ("weak_scaling.png", "weak scaling")),
    (("why_breakdown.png", "why: breakdown of a profiled step"), ("phases.png", "phase breakdown")),
)


def advice(run: Run) -> tuple[str, pd.DataFrame]:
    """(the answer sentence, advice.csv's rows): `bench advise`'s files, else bench.advise's answer made
    now without a projection (nothing written); ("", no rows) when the run has nothing to rank."""
    folder = run.path / run_folder.ADVICE_DIR
    md, csv = folder / run_folder.ADVICE_MD, folder / run_folder.ADVICE_CSV
    if md.is_file() and csv.is_file():
        lines = [line for line in md.read_text().splitlines() if line.strip()]
        return (lines[1] if len(lines) > 1 else ""), pd.read_csv(csv)
    try:
        made = advise.run(run.path, target=None, write=False)
    except advise.UsageError:
        return "", pd.DataFrame(columns=["rank"])
    return made.answer, made.table


def _interval(value: float, low: float, high: float, fmt: str, unit: str) -> tuple[str, str]:
    if pd.isna(value):
        return "—", "not measured"
    shown = f"{value:{fmt}}{unit}"
    if pd.isna(low) or pd.isna(high):
        return shown, "no interval recorded"
    return shown, f"95 % interval {low:{fmt}}–{high:{fmt}}{unit}"


def headline_numbers(results: pd.DataFrame, ranked: pd.DataFrame) -> pd.DataFrame:
    """Four figures of the recommended (rank 1) cell, each with its 95 % interval: throughput, scaling
    efficiency at its world size, exposed communication's share of the step, and the verdict of the
    fastest ddp_core engine against torch DDP on its configuration. Columns: name, value, interval, of."""
    best = ranked[ranked["rank"] == 1]
    if not len(best):
        return pd.DataFrame(columns=["name", "value", "interval", "of"])
    best = best.iloc[0]
    cell = results[results["cell_id"] == best["cell_id"]].iloc[0]
    n = int(cell["world_size"])
    where = f"{best['engine']} at {n} rank{'s' if n > 1 else ''}"
    rows = [("best throughput (samples/s)",
             *_interval(best["samples_per_s"], best["samples_per_s_ci95_low"],
                        best["samples_per_s_ci95_high"], ",.0f", ""), where)]
    # efficiency = T1 / (N T_N) (strong) or T1 / T_N (weak): its interval from T_N's, T1 held at its median
    table = tables.scaling_table(results, cell["scaling"])
    mine = table[table["cell_id"] == cell["cell_id"]]
    eff = mine["efficiency_pct"].iloc[0] if "efficiency_pct" in mine and len(mine) else float("nan")
    low, high = (eff * cell["step_time_ms_p50"] / cell.get("step_time_ms_ci95_high", float("nan")),
                 eff * cell["step_time_ms_p50"] / cell.get("step_time_ms_ci95_low", float("nan")))
    rows.append((f"{cell['scaling']} scaling efficiency", *_interval(eff, low, high, ".1f", " %"),
                 f"{where} against 1 rank (T₁ at its median)"))
    step, exposed = cell["step_time_ms_p50"], tables.exposed_comms(cell.to_frame().T).iloc[0]
    share = exposed / step * 100
    rows.append(("exposed communication (% of the step)",
                 *_interval(share, cell.get("exposed_comm_ms_ci95_low", float("nan")) / step * 100,
                            cell.get("exposed_comm_ms_ci95_high", float("nan")) / step * 100, ".1f", " %"),
                 f"{where}: step − compute-only step"))
    rows.append(("ddp_core against torch DDP", *_against_torch(results, cell)))
    return pd.DataFrame(rows, columns=["name", "value", "interval", "of"])


def _against_torch(results: pd.DataFrame, cell: pd.Series) -> tuple[str, str, str]:
    """The fastest non-torch engine's speed_vs_torch on `cell`'s configuration (engine and bucket size
    free) at its world size, with the interval and the verdict."""
    keys = tables.config_keys_except("engine", "bucket_cap_mb")
    same = results[(tables.config_key(results, keys) == tables.config_key(cell.to_frame().T, keys).iloc[0])
                   & (results["engine"] != "torch") & (results["status"] == "ok")]
    same = same.dropna(subset=["speed_vs_torch"]) if "speed_vs_torch" in same else same.iloc[0:0]
    if not len(same):
        return "—", "no engine measured beside torch DDP here", "speed_vs_torch"
    r = same.loc[same["speed_vs_torch"].idxmax()]
    low, high = r.get("speed_vs_torch_ci95_low"), r.get("speed_vs_torch_ci95_high")
    verdict = stats.verdict(low, high) or "no interval"
    bucket = "" if pd.isna(r["bucket_cap_mb"]) else f", {r['bucket_cap_mb']:g} MiB"
    value, interval = _interval(r["speed_vs_torch"], low, high, ".2f", "×")
    return f"{value} {verdict}", interval, f"{r['engine']}{bucket} vs torch (> 1: faster), same rounds"


def answer_section(run: Run, out_dir: Path) -> Section:
    """The first section of the page (build it after the others: it shows their figures)."""
    sec = Section("The answer", "answer")
    text, ranked = advice(run)
    if text:
        sec.raw(f'<p class="answer" id="advice">{html.escape(text)}</p>', f"**{text}**\n")
    else:
        sec.para("No configuration finished with status ok: there is nothing to recommend.", "warn")
    if run.device == "cpu":
        sec.para(CPU_CAVEAT, "warn")
    numbers = headline_numbers(run.results, ranked)
    if len(numbers):
        cards = "".join(
            f'<div class="card"><div class="lbl">{html.escape(r["name"])}</div><div class="big">'
            f'{html.escape(r["value"])}</div><div>{html.escape(r["interval"])}</div><div class="lbl">'
            f'{html.escape(r["of"])}</div></div>' for _, r in numbers.iterrows())
        sec.raw(f'<div class="cards" id="headline">{cards}</div>',
                "\n".join(f"- {r['name']}: **{r['value']}** ({r['interval']}; {r['of']})"
                          for _, r in numbers.iterrows()) + "\n")
    _failed(sec, run.results)
    sec.raw('<p>The ranking: <a href="tables/advice.csv">tables/advice.csv</a>. How to read every number: '
            '<a href="#findings">findings</a>, then the sections below.</p>',
            "Ranking: tables/advice.csv\n")
    ranked.to_csv(out_dir / "tables" / "advice.csv", index=False)
    figures = [next(((n, alt) for n, alt in pair if (out_dir / "plots" / n).is_file()), None)
               for pair in STORY_PLOTS]
    figures = [f for f in figures if f is not None]
    if figures:
        sec.raw('<div class="story">' + "".join(
            f'<p><a href="plots/{n}"><img src="plots/{n}" alt="{alt}"></a></p>' for n, alt in figures)
            + "</div>", "".join(f"![{alt}](plots/{name})\n" for name, alt in figures))
    return sec


def _failed(sec: Section, results: pd.DataFrame) -> None:
    bad = results[~results["status"].isin(("ok", "raced_out"))]  # a race's eliminations are no failure
    if not len(bad):
        return
    counts = ", ".join(f"{n} {s}" for s, n in bad["status"].value_counts().sort_index().items())
    first = "; ".join(f"{r['cell_id']} ({r['status']}: {r['error'] or 'no reason recorded'})"
                      for _, r in bad.head(3).iterrows())
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    text = f"{len(bad)} of {len(results)} cells produced no numbers ({counts}): {first}{more}."
    sec.raw(f'<p class="warn">{html.escape(text)} <a href="#not-measured">All of them, with reasons</a>.</p>',
            f"> {md_cell(text)}\n")
