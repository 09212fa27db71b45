"""The report's first screen: the advice (`bench advise`), the speedup figure, four headline numbers with
their intervals, what a CPU run can and cannot tell, the cells that failed, and the two figures that carry
the story.

The advice is advice.md's and advice.csv's when `bench advise` has run; otherwise bench.advise makes it now
without a projection (nothing is written into the run folder), and it says how to get one. Nothing here
ranks or compares configurations again. The headline numbers are one table (`headline_numbers`), so
index.html and summary.md show the same figures.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.advise import api as advise
from bench.advise.answer import CPU_CAVEAT, Answer, setting_words
from bench.advise.choice import NAMED
from bench.advise.rank import choice_keys, first_line
from bench.report import plots, tables
from bench.report.render import Section, md_cell, md_text
from bench.run_folder import Run

# The two figures of the first screen, by file name under plots/ (drawn by their own sections): how it
# scales, and why; the first of each pair that the run has.
STORY_PLOTS = (
    (("strong_scaling.png", "strong scaling"), ("weak_scaling.png", "weak scaling")),
    (("why_breakdown.png", "why: breakdown of a profiled step"), ("phases.png", "phase breakdown")),
)
SPEEDUP_PNG = "speedup.png"                 # beside the headline numbers (plots.speedup_plot)


def advice(run: Run) -> tuple[Answer, pd.DataFrame]:
    """(the answer, advice.csv's rows): `bench advise`'s files, else bench.advise's answer made now without a
    projection (nothing written; also for an advice.csv written before `answer_role` existed); (an empty
    answer, no rows) when the run has nothing to rank."""
    folder = run.path / run_folder.ADVICE_DIR
    md, csv = folder / run_folder.ADVICE_MD, folder / run_folder.ADVICE_CSV
    if md.is_file() and csv.is_file():
        table = pd.read_csv(csv)
        said = Answer.from_markdown(md.read_text())
        if "answer_role" in table.columns and said.verdict:
            table["answer_role"] = table["answer_role"].fillna("")
            return said, table
    try:
        made = advise.run(run.path, target=None, write=False)
    except advise.UsageError:
        return Answer(""), pd.DataFrame(columns=["rank", "answer_role"])
    return made.answer, made.table


def named_row(ranked: pd.DataFrame) -> pd.Series | None:
    """The row the answer is about (advice.csv answer_role); None without one."""
    if "answer_role" not in ranked.columns:
        return None
    named = ranked[ranked["answer_role"].isin(NAMED)]
    return named.iloc[0] if len(named) else None


def _interval(value: float, low: float, high: float, fmt: str, unit: str) -> tuple[str, str]:
    if pd.isna(value):
        return "—", "not measured"
    shown = f"{value:{fmt}}{unit}"
    if pd.isna(low) or pd.isna(high):
        return shown, "no interval recorded"
    return shown, f"95 % interval {low:{fmt}}–{high:{fmt}}{unit}"


def headline_numbers(results: pd.DataFrame, ranked: pd.DataFrame,
                     against: str = "torch DDP's defaults") -> pd.DataFrame:
    """Four figures of the configuration the answer names (advice.csv answer_role), each with its 95 %
    interval: its speedup over torch DDP's defaults (the best other configuration's when the answer keeps
    the defaults), its throughput, its scaling efficiency at its world size, and exposed communication's
    share of its step; `against`: what the speedups are against (the answer's baseline). Columns: name,
    value, interval, of."""
    best = named_row(ranked)
    if best is None:
        return pd.DataFrame(columns=["name", "value", "interval", "of"])
    cell = results[results["cell_id"] == best["cell_id"]].iloc[0]
    n = int(cell["world_size"])
    where = f"{best['engine']} at {n} rank{'s' if n > 1 else ''}, global batch {int(cell['global_batch'])}"
    rows = [_speedup_card(ranked, best, against),
            ("throughput (samples/s)", *_interval(best["samples_per_s"], best["samples_per_s_ci95_low"],
                                                  best["samples_per_s_ci95_high"], ",.0f", ""), where)]
    # efficiency = T1 / (N T_N) (strong) or T1 / T_N (weak): its interval from T_N's, T1 held at its median
    table = tables.scaling_table(results, cell["scaling"])
    mine = table[table["cell_id"] == cell["cell_id"]]
    eff = mine["efficiency_pct"].iloc[0] if "efficiency_pct" in mine and len(mine) else float("nan")
    # truncated at 100 %, the physical limit (a confidence interval cut to the possible values keeps its
    # coverage; the measured value itself is printed as measured)
    p50 = cell["step_time_ms_p50"]
    low, high = (min(100.0, eff * p50 / cell.get(f"step_time_ms_ci95_{end}", float("nan")))
                 for end in ("high", "low"))
    rows.append((f"{cell['scaling']} scaling efficiency", *_interval(eff, low, high, ".1f", " %"),
                 f"{where} against 1 rank (T₁ at its median)"))
    step, exposed = cell["step_time_ms_p50"], tables.exposed_comms(cell.to_frame().T).iloc[0]
    share = exposed / step * 100
    # one rank communicates nothing: step − compute-only is then the sync work no_sync skips
    name, of = (("exposed communication (% of the step)", f"{where}: step − compute-only step") if n > 1 else
                ("sync overhead (% of the step)", f"{where}: no communication; step − compute-only step"))
    low, high = (cell.get(f"exposed_comm_ms_ci95_{e}", float("nan")) / step * 100 for e in ("low", "high"))
    rows.append((name, *_interval(share, low, high, ".1f", " %"), of))
    return pd.DataFrame(rows, columns=["name", "value", "interval", "of"])


def _speedup_card(ranked: pd.DataFrame, best: pd.Series, against: str) -> tuple[str, str, str, str]:
    """The named configuration's speedup over its baseline; for the baseline itself, its contender's."""
    title = f"speedup over {against}"
    row = best
    if best["answer_role"] in ("keep", "unclear"):
        contender = ranked[ranked["answer_role"] == "contender"]
        if not len(contender):
            return title, "1.00×", "the baseline: nothing else measured", "torch DDP"
        row = contender.iloc[0]
    if pd.isna(row.get("speedup_vs_baseline")):
        return title, "—", f"{against}: not measured at this recipe", str(row["engine"])
    value, interval = _interval(row["speedup_vs_baseline"], row["speedup_vs_baseline_ci95_low"],
                                row["speedup_vs_baseline_ci95_high"], ".2f", "×")
    verdict = row.get("verdict_vs_baseline")
    verdict = verdict if isinstance(verdict, str) and verdict else "no interval"
    who = "the best other configuration, " if row is not best else ""
    paired = "measured side by side" if str(row.get("speedup_paired")) in ("True", "true", "1") else \
        "from both cells' intervals"
    return (title, f"{value} {verdict}", interval,
            f"{who}{row['engine']} ({paired}; Holm-corrected verdict)")


def answer_section(run: Run, out_dir: Path) -> Section:
    """The first section of the page (build it after the others: it shows their figures)."""
    sec = Section("The answer", "answer")
    said, ranked = advice(run)
    if said.verdict:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in said.lines)
        sec.raw(f'<p class="answer" id="advice">{html.escape(said.verdict)}</p><ul class="answer-lines">'
                f'{items}</ul>',
                f"**{md_text(said.verdict)}**\n\n" + "".join(f"- {md_text(line)}\n" for line in said.lines))
    else:
        sec.para("No configuration finished with status ok: there is nothing to recommend.", "warn")
    if run.device == "cpu":
        sec.para(CPU_CAVEAT, "warn")
    numbers = headline_numbers(run.results, ranked, said.against())
    cards = "".join(
        f'<div class="card"><div class="lbl">{html.escape(r["name"])}</div><div class="big">'
        f'{html.escape(r["value"])}</div><div>{html.escape(r["interval"])}</div><div class="lbl">'
        f'{html.escape(r["of"])}</div></div>' for _, r in numbers.iterrows())
    figure = speedup_figure(run, ranked, out_dir, said.against())
    alt = html.escape(f"speedup over {said.against()}", quote=True)
    if cards or figure:
        image = (f'<p><a href="plots/{figure}"><img src="plots/{figure}" alt="{alt}"></a></p>') if figure \
            else ""
        sec.raw(f'<div class="verdict"><div class="cards" id="headline">{cards}</div>{image}</div>',
                "\n".join(md_text(f"- {r['name']}: **{r['value']}** ({r['interval']}; {r['of']})")
                          for _, r in numbers.iterrows()) + "\n"
                + (f"\n![speedup over {md_text(said.against())}](plots/{figure})\n" if figure else ""))
    _failed(sec, run.results)
    sec.raw('<p>The ranking: <a href="tables/advice.csv">tables/advice.csv</a> (every configuration of the '
            'recipe, its speedup and interval, what did not make it and why). How to read every number: '
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


def speedup_figure(run: Run, ranked: pd.DataFrame, out_dir: Path,
                   against: str = "torch DDP's defaults") -> str | None:
    """plots/speedup.png from advice.csv's rows (its file name), None when nothing to draw."""
    if "speedup_vs_baseline" not in ranked.columns or named_row(ranked) is None:
        return None
    keys = [k for k in choice_keys(run.results) if k in ranked.columns]
    base = ranked[ranked["baseline"].astype(bool)]
    labels = {}
    for _, r in ranked.iterrows():
        mine = base[base["precision"] == r["precision"]]
        if r["baseline"] or mine.empty:
            labels[r["cell_id"]] = against if r["baseline"] else setting_words(r, keys)
        else:
            labels[r["cell_id"]] = setting_words(r, keys, mine.iloc[0])
    path = plots.speedup_plot(ranked, labels, out_dir / "plots" / SPEEDUP_PNG, against)
    return None if path is None else SPEEDUP_PNG


def _failed(sec: Section, results: pd.DataFrame) -> None:
    bad = results[~results["status"].isin(("ok", "raced_out"))]  # a race's eliminations are no failure
    if not len(bad):
        return
    counts = ", ".join(f"{n} {s}" for s, n in bad["status"].value_counts().sort_index().items())
    first = "; ".join(f"{r['cell_id']} ({r['status']}: {first_line(r['error'])})"
                      for _, r in bad.head(3).iterrows())
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    text = f"{len(bad)} of {len(results)} cells produced no numbers ({counts}): {first}{more}."
    sec.raw(f'<p class="warn">{html.escape(text)} <a href="#not-measured">All of them, with reasons</a>.</p>',
            f"> {md_cell(text)}\n")
