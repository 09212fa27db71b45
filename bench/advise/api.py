"""`bench advise` as a function: `run(run_dir, ...)` takes one recipe of the run (rank.py), ranks its
configurations, sets each against torch DDP's defaults (baseline.py), projects them to a target cluster with
`bench.project.run` (into RUN/advice/projection/), picks what the answer names (choice.py), words it
(answer.py) and writes advice.md, advice.csv, best.toml and ddp.md (to_run.py); it returns an `Advice`. The
command (cli.py) prints it; the report reads the files, or calls `run(..., target=None, write=False)` when
the run has none.
"""

from __future__ import annotations

import html
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.advise import to_run
from bench.advise.answer import CPU_CAVEAT, Answer, Question, Target, answer
from bench.advise.baseline import SPEEDUP, parse_baseline, speedups
from bench.advise.choice import NAMED, answer_roles
from bench.advise.rank import (
    MEASURED,
    UsageError,
    choice_keys,
    choose_recipe,
    largest_world_size,
    rank_recipe,
)
from bench.config import MAX_WORLD_SIZE
from bench.project import api as project
from bench.project.inputs import InputError
from bench.project.network import FABRICS, INTER_NODE, preset_network
from bench.run_folder import Run, RunError, load_run
from bench.schema import PRECISIONS

__all__ = ["Advice", "UsageError", "run"]

DEFAULT_TARGET_GPUS = 64
DEFAULT_NETWORK = "h100-nvlink"          # 8 nodes of 8 H100 (--gpus-per-node), NDR InfiniBand between
NETWORKS = (*FABRICS, project.MEASURED)
DEFAULT_TARGET = Target(DEFAULT_TARGET_GPUS, DEFAULT_NETWORK, project.DEFAULT_GPUS_PER_NODE,
                        project.DEFAULT_INTER_NETWORK)
PROJECTED = ("projected_nodes", "projected_per_rank_batch", "projected_global_batch",
             "projected_samples_per_s", "projected_samples_per_s_low", "projected_samples_per_s_high",
             "projected_efficiency", "projected_efficiency_low", "projected_efficiency_high", "dominant_loss",
             "projection_note")
# the rounds a median needs to halve its interval's width: the width shrinks as 1/√rounds
REMEASURE_FACTOR = 4
# the precision a GPU user trains in, the likeliest first: the answer's precision when the recipe was
# measured at several and --precision does not say (bf16 on every GPU since the A100, fp16 before it)
TRAINING_PRECISIONS = ("bf16", "fp16", "tf32", "fp32")


@dataclass
class Advice:
    """The answer, its caveats, advice.csv's rows and the keys they differ in, the recipe and the run's
    other recipes, the target, and where the files went (None: not written)."""

    answer: Answer
    caveats: list[str]
    table: pd.DataFrame
    keys: list[str]
    target: Target
    recipe: int
    other_recipes: list[int] = field(default_factory=list)
    out: Path | None = None
    notes: list[str] = field(default_factory=list)  # the projection's, for advice.md's caveats
    precision: str = ""  # the answer's (answer_precision)
    run_dir: Path | None = None

    @property
    def world_size(self) -> int:
        return int(self.table["world_size"].iloc[0])

    @property
    def left_out(self) -> pd.DataFrame:
        """The candidates that did not make it: failed, diverged, timed out, out of memory, skipped, or over
        --memory-gb (rank empty, `why` says which)."""
        return self.table[self.table["rank"].isna()]

    def lines(self) -> list[str]:
        """What `bench advise` prints: the answer first, its caveats, what did not make it (one line each:
        the cell, the cause, where the whole error is), the files."""
        lines = [*self.answer.printed(), *(f"note: {c}" for c in self.caveats)]
        for _, r in self.left_out.iterrows():
            lines.append(f"not ranked: {r['cell_id']}: {r['why']}{self.error_where(r)}")
        if self.out is not None:
            ranked = int(self.table["rank"].notna().sum())
            lines.append(f"advice: {self.out / run_folder.ADVICE_MD}, {self.out / run_folder.ADVICE_CSV} "
                         f"({ranked} configurations at global batch {self.recipe}, {self.world_size} ranks)")
            lines.append(f"to run: {self.out / run_folder.BEST_TOML} (bench run --config), "
                         f"{self.out / run_folder.DDP_MD} (your own script)")
        return lines


    def error_where(self, row: pd.Series) -> str:
        """Where a failed cell's whole error is (its `why` has the first line only)."""
        if self.run_dir is None or row["status"] in ("ok", "skipped"):  # over --memory-gb, or never started
            return ""
        return (f" (the whole error: {self.run_dir / run_folder.RESULTS} `error`; the ranks' output: "
                f"{self.run_dir / run_folder.LOGS}/)")


def answer_precision(table: pd.DataFrame, asked: str | None, spec: dict) -> tuple[str, list[str]]:
    """(the answer's precision, the precisions the recipe's ranked rows were measured at, likeliest first):
    --precision, else the --baseline's precision, else the first of TRAINING_PRECISIONS measured.
    UsageError naming the flag when it was not measured at this recipe or the two flags disagree."""
    ranked = table[table["rank"].notna()]
    held = set(ranked["precision"].astype(str))
    measured = [p for p in TRAINING_PRECISIONS if p in held] + sorted(held - set(TRAINING_PRECISIONS))
    pinned = spec.get("precision")
    if asked is not None and pinned is not None and asked != pinned:
        raise UsageError(f"--precision={asked} and --baseline precision={pinned}: the answer compares at one "
                         f"precision; give one of them, or the same in both")
    wanted = asked or pinned
    if wanted is None:
        return measured[0], measured
    if wanted not in measured:
        flag = "--precision" if asked else "--baseline precision"
        n, recipe = int(ranked["world_size"].iloc[0]), int(ranked["global_batch"].iloc[0])
        raise UsageError(f"{flag}={wanted}: not measured at global batch {recipe} ({n} ranks); this run has "
                         f"{measured} there")
    return wanted, measured


def check_target(target: Target) -> None:
    """UsageError naming the flag and its value for a target bench project cannot take."""
    if target.gpus is None or not 1 <= target.gpus <= MAX_WORLD_SIZE:
        raise UsageError(f"--target-gpus={target.gpus}: must lie in [1, {MAX_WORLD_SIZE}]")
    if target.network not in NETWORKS:
        raise UsageError(f"--network={target.network!r} is not a preset; choose from {list(NETWORKS)}")
    if target.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node={target.gpus_per_node}: must be >= 1")
    if target.inter_network not in INTER_NODE:
        raise UsageError(f"--inter-network={target.inter_network!r} is not one of {list(INTER_NODE)}")
    if target.network in FABRICS:
        try:
            preset_network(target.network, target.gpus_per_node, target.inter_network).nodes(target.gpus)
        except ValueError:
            raise UsageError(f"--target-gpus={target.gpus}: {target.network} puts --gpus-per-node="
                             f"{target.gpus_per_node} GPUs in a node; give a multiple of it") from None


def run(run_dir: Path | str, target: Target | None = DEFAULT_TARGET, memory_gb: float | None = None,
        out: Path | str | None = None, write: bool = True, global_batch: int | None = None,
        baseline: str | None = None, precision: str | None = None) -> Advice:
    """Advise on one recipe of the run at `run_dir` (`global_batch`, default the most measured at the
    largest world size): its configurations within `memory_gb` ranked, each against torch DDP's defaults
    (or `baseline`, "KEY=VALUE,…"), projected to `target` (None: no projection), the answer at `precision`
    (answer_precision), and with `write` the files written into `out` (default RUN/advice/). UsageError or
    RunError (nothing written) on bad input or a run with nothing to rank."""
    run_dir = Path(run_dir)
    spec = _checked_flags(target, memory_gb, baseline, precision)
    if write:  # another command's folder (RUN itself: RUN/projection is bench project's), a file, a user's
        run_folder.check_out(Path(out) if out is not None else run_dir / run_folder.ADVICE_DIR, "advise",
                             run_dir, FILES)
    try:
        loaded = load_run(run_dir)
    except RunError as exc:
        raise RunError(f"run={str(run_dir)!r}: {exc}") from None
    results = loaded.results
    if largest_world_size(results) is None:
        raise UsageError(f"run={str(run_dir)!r}: no cell finished with status ok and a throughput "
                         f"({len(results)} cells); nothing to rank")
    recipe, other_recipes = choose_recipe(results, global_batch)
    table = rank_recipe(results, recipe, memory_gb)
    if not table["rank"].notna().any():
        low = table["memory_mb"].min() / 1024
        raise UsageError(f"--memory-gb={memory_gb:g} is below every configuration's memory at global batch "
                         f"{recipe} (the smallest is {low:.2f} GiB); nothing to recommend")
    table = speedups(table, results, spec, bucket_order(loaded.config))
    chosen, measured = answer_precision(table, precision, spec)
    out = Path(out) if out is not None else run_dir / run_folder.ADVICE_DIR
    table, target, made, notes = _projected(table, run_dir, target)
    table["answer_role"] = answer_roles(table, chosen)
    keys = choice_keys(results)
    table = table[[*FIRST, *keys, *MEASURED, *[c for c in SPEEDUP if c not in FIRST],
                   *[c for c in PROJECTED if c not in LAST], *LAST]]
    general = [n for n in notes if not n.startswith(run_folder.PHYSICS_NOTE)]  # per configuration: notes.txt
    caveats = ([CPU_CAVEAT] if loaded.device == "cpu" else []) + general
    said = answer(table, Question(str(run_dir), chosen, measured, keys, target, other_recipes,
                                  remeasure_command(run_dir, table, results, loaded), spec))
    advice = Advice(answer=said, caveats=caveats, table=table, keys=keys, target=target, recipe=recipe,
                    other_recipes=other_recipes, notes=notes, precision=chosen, run_dir=run_dir)
    if write:  # by the rule of every command that writes: only advise's own files replaced
        with run_folder.writing(out, "advise", run_dir, FILES) as stage:
            write_files(advice, results, loaded.config, run_dir, stage, shown=out)
            if made is not None:
                made.write(stage / run_folder.PROJECTION_DIR)
    return advice


def _checked_flags(target: Target | None, memory_gb: float | None, baseline: str | None,
                   precision: str | None) -> dict:
    """The --baseline as a spec (parse_baseline), once every flag is checked: UsageError naming the first
    that is wrong (the target's, --memory-gb, --baseline, --precision)."""
    if target is not None:
        check_target(target)
    if memory_gb is not None and not (memory_gb > 0 and math.isfinite(memory_gb)):
        raise UsageError(f"--memory-gb={memory_gb:g}: must be a finite number of GiB > 0")
    spec = parse_baseline(baseline)
    if precision is not None and precision not in PRECISIONS:
        raise UsageError(f"--precision={precision!r}: not one of {list(PRECISIONS)}")
    return spec


def _projected(table: pd.DataFrame, run_dir: Path,
               target: Target | None) -> tuple[pd.DataFrame, Target, project.Projection | None, list[str]]:
    """advice.csv's rows with their projection to `target` (the columns empty without one), the target as
    the answer names it (with why it is not projected, where it is not), the projection to write into
    out/projection (None: none made) and bench project's notes."""
    if target is None:
        target = Target(why_not=f"`python -m bench advise {run_dir}` projects it to a target cluster")
        empty = table.assign(**{c: float("nan") for c in PROJECTED if c != "projection_note"},
                             projection_note="")
        return empty, target, None, []
    ranked = list(table.loc[table["rank"].notna(), "cell_id"])
    made, notes, why_not = project_at(run_dir, target, ranked)
    if made is None:
        target = Target(why_not=f"bench project failed: {why_not}")
    return with_projection(table, None if made is None else made.projection), target, made, notes


# what `bench advise` writes into its folder (its projection to the target in PROJECTION_DIR)
FILES = (run_folder.ADVICE_MD, run_folder.ADVICE_CSV, run_folder.BEST_TOML, run_folder.DDP_MD,
         run_folder.PROJECTION_DIR)


# advice.csv's columns: FIRST, the choice keys, MEASURED, SPEEDUP, PROJECTED, LAST
FIRST = ("rank", "answer_role", "baseline", "tied_with_best", "status")
LAST = ("memory_mb", "cell_id", "why", "projection_note")


def bucket_order(config: dict) -> list[float]:
    """The preset's bucket sizes in its order (the worker's groups follow it)."""
    return [float(b) for b in config.get("matrix", {}).get("bucket_cap_mb", [])]


def project_at(run_dir: Path, target: Target, cells: list[str]) -> tuple[project.Projection | None, list[str],
                                                                         str]:
    """The ranked cells projected to the target, each from its own batch (bench.project.run with `cells`):
    (the projection, its notes, why none)."""
    try:
        options = project.NetworkOptions(gpus_per_node=target.gpus_per_node,
                                         inter_network=target.inter_network)
        projection = project.run(run_dir, [target.network], [target.gpus], options=options, cells=cells,
                                 write=False)
    except (project.UsageError, InputError, RunError) as exc:
        return None, [], str(exc)
    return projection, projection.notes + projection.physics, ""


def dominant_loss(projected: dict) -> str:
    """What the projected step loses most to: the projection's largest term (bench.project.terms.LOSS_TERMS:
    straggler, interference, host floor), and where that is exposed communication or nothing, its
    `bottleneck` (bandwidth, latency, overlap-limited, compute) says which kind."""
    term = projected.get("dominant_term")
    if isinstance(term, str) and term not in ("exposed_comm", "none", ""):
        return term
    return projected["bottleneck"]


def with_projection(advice: pd.DataFrame, projection: pd.DataFrame | None) -> pd.DataFrame:
    """advice rows with their projection at the target (PROJECTED; efficiency as a fraction, with the
    projection's interval where projection.csv has one), matched by cell id (bench.project.run `cells`)."""
    advice = advice.copy()
    for column in PROJECTED:
        advice[column] = "" if column in ("dominant_loss", "projection_note") else float("nan")
    if projection is None:
        return advice
    by_cell = {r["cell_id"]: r for r in projection.to_dict("records")}
    for i, row in advice[advice["rank"].notna()].iterrows():
        p = by_cell.get(row["cell_id"])
        if p is None:
            advice.loc[i, "projection_note"] = "not in the projection"
            continue
        if pd.isna(p["efficiency_pct"]):
            advice.loc[i, "projection_note"] = str(p["reason"])
            continue
        values = {"projected_nodes": p["nodes"], "projected_per_rank_batch": p["per_rank_batch"],
                  "projected_global_batch": p["global_batch"], "projected_samples_per_s":
                  p["predicted_samples_per_s"], "projected_efficiency": p["efficiency_pct"] / 100,
                  "dominant_loss": dominant_loss(p)}
        for side in ("low", "high"):  # the projection's interval, where bench project gives one
            values[f"projected_samples_per_s_{side}"] = p.get(f"predicted_samples_per_s_{side}", float("nan"))
            values[f"projected_efficiency_{side}"] = p.get(f"efficiency_pct_{side}", float("nan")) / 100
        for column, value in values.items():
            advice.loc[i, column] = value
    return advice


def remeasure_command(run_dir: Path, table: pd.DataFrame, results: pd.DataFrame, run: Run) -> str:
    """The run's own `bench run` command again (env.json `command`, less its folder flags) with tighter
    intervals, for an answer that cannot separate its configurations: the adaptive rounds on
    (run.target_ci_pct 2, its default) where they were off, and REMEASURE_FACTOR × the time budget or round
    cap that stopped the recipe's cells."""
    from bench.config import RunConfig

    settings = run.config.get("run", {})
    here = results[results["cell_id"].isin(table["cell_id"])]
    stopped = set(here.get("stopped_by", pd.Series(dtype=str)).dropna().astype(str))
    sets = []
    if not settings.get("target_ci_pct"):
        sets.append(f"run.target_ci_pct={RunConfig.target_ci_pct:g}")
    if "budget" in stopped:
        budget = float(settings.get("max_group_s", RunConfig.max_group_s))
        sets.append(f"run.max_group_s={REMEASURE_FACTOR * budget:g}")
    if "max_steps" in stopped:
        cap = int(settings.get("max_timed_steps", RunConfig.max_timed_steps))
        sets.append(f"run.max_timed_steps={REMEASURE_FACTOR * cap}")
    words = shlex.split(str(run.env.get("command") or ""))
    kept = words[words.index("run") + 1:] if "run" in words else ["--config", "PRESET"]  # env.json without it
    args, skip = [], False
    for word in kept:  # a new folder: not --out, --resume, --retry; no --report or --dry-run either
        if skip:
            skip = False
        elif word in ("--out", "--retry", "--collect"):
            skip = True
        elif word not in ("--resume", "--report", "--dry-run", "--plan-only"):
            args.append(word)
    return shlex.join(["python", "-m", "bench", "run", *args, *(x for s in sets for x in ("--set", s))])


def write_files(advice: Advice, results: pd.DataFrame, config: dict, run_dir: Path, out: Path,
                shown: Path | None = None) -> None:
    """advice.csv, advice.md, best.toml and ddp.md into `out` (their folder named `shown`, where they will
    be, when `out` is a stage folder)."""
    out.mkdir(parents=True, exist_ok=True)
    advice.table.to_csv(out / run_folder.ADVICE_CSV, index=False)
    (out / run_folder.ADVICE_MD).write_text(advice_markdown(advice))
    table, cells = advice.table, results.set_index("cell_id")
    named = table[table["answer_role"].isin(NAMED)].iloc[0]
    beside = table[table["answer_role"].isin(["contender"])] if named["answer_role"] in ("keep", "unclear") \
        else table[table["baseline"].astype(bool) & (table["precision"] == named["precision"])]
    measured = [named] + ([beside.iloc[0]] if len(beside) else [])
    rows = [cells.loc[r["cell_id"]].copy() for r in measured]
    for row, r in zip(rows, measured):
        row["cell_id"] = r["cell_id"]
    gpus = advice.target.gpus or int(named["world_size"])
    target = advice.target if advice.target.gpus else Target(gpus, "measured")
    best = out / run_folder.BEST_TOML
    best.write_text(to_run.best_toml(rows, config, target, str(run_dir)))
    there = (f"at {target.words(named['projected_nodes'])}: per-GPU micro-batch "
             f"{int(named['projected_per_rank_batch'])}, global batch {int(named['projected_global_batch'])}"
             if pd.notna(named["projected_global_batch"]) else "not projected to a target")
    best_path = str((shown or out) / run_folder.BEST_TOML)
    ddp = to_run.ddp_markdown(rows[0], advice.answer.markdown(), target, best_path, there)
    (out / run_folder.DDP_MD).write_text(ddp)
    advice.out = shown or out


def advice_markdown(advice: Advice) -> str:
    """advice.md: the answer first, the caveats, the ranking (every column is advice.csv's), what did not
    make it, and the files to run."""
    shown = ["rank", "answer_role", "baseline", "tied_with_best", *advice.keys, "samples_per_s",
             "speedup_vs_baseline", "speedup_vs_baseline_ci95_low", "speedup_vs_baseline_ci95_high",
             "verdict_vs_baseline", "speedup_paired", "projected_efficiency", "dominant_loss"]
    ranked, left = advice.table[advice.table["rank"].notna()], advice.left_out
    # text from the run (a user model's size, its errors) is shown, never rendered: <, >, & escaped
    lines = ["# Advice", "", html.escape(advice.answer.markdown(), quote=False), ""]
    lines += [f"> {html.escape(c, quote=False)}" for c in advice.caveats] + ([""] if advice.caveats else [])
    lines += [f"## Global batch {advice.recipe} at {advice.world_size} ranks: {len(ranked)} configurations",
              "", _table(ranked, shown), ""]
    if len(left):
        left = left.assign(why=[f"{r['why']}{advice.error_where(r)}" for _, r in left.iterrows()])
        lines += ["## Did not make it", "", _table(left, ["status", *advice.keys, "why"]), ""]
    lines += ["## To run", "",
              f"- `{run_folder.BEST_TOML}`: the advised configuration and its baseline at the target, as a "
              "ddpbench config (`python -m bench run --config` it, or `bench slurm`).",
              f"- `{run_folder.DDP_MD}`: the same settings in your own training script, and the launch "
              "lines.", ""]
    return "\n".join(lines)


def _table(rows: pd.DataFrame, columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, r in rows.iterrows():
        lines.append("| " + " | ".join(_cell(r[c]) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.0f}"
    return html.escape(str(value), quote=False).replace("|", "\\|").replace("\n", " ")
