"""`bench advise` as a function: `run(run_dir, ...)` ranks the run's configurations (rank.py), projects them
to a target cluster with `bench.project.run` (into RUN/advice/projection/), words the answer (answer.py) and
writes advice.md and advice.csv; it returns an `Advice`. The command (cli.py) prints it; the report reads the
files, or calls `run(..., target=None, write=False)` when the run has none.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.advise.answer import CPU_CAVEAT, Target, sentence
from bench.advise.rank import largest_world_size, rank_configurations, swept_keys
from bench.config import MAX_WORLD_SIZE
from bench.project import api as project
from bench.project.inputs import InputError
from bench.project.network import FABRICS
from bench.project.project import config_key
from bench.run_folder import RunError, load_run

DEFAULT_TARGET_GPUS = 64
DEFAULT_NETWORK = "ib-ndr400"
NETWORKS = (*FABRICS, project.MEASURED)
DEFAULT_TARGET = Target(DEFAULT_TARGET_GPUS, DEFAULT_NETWORK)


class UsageError(ValueError):
    """A bad argument, or a run with nothing to advise: the message names the key and the value."""


@dataclass
class Advice:
    """The answer (one sentence), its caveats, advice.csv's rows and the keys they were ranked on, the
    target they were projected to, and where the files went (None: not written)."""

    answer: str
    caveats: list[str]
    table: pd.DataFrame
    keys: list[str]
    target: Target
    out: Path | None = None
    notes: list[str] = field(default_factory=list)  # the projection's, for advice.md's caveats

    @property
    def world_size(self) -> int:
        return int(self.table["world_size"].iloc[0])

    def lines(self) -> list[str]:
        """What `bench advise` prints: the answer first, its caveats, where the files are."""
        lines = [self.answer, *(f"note: {c}" for c in self.caveats)]
        if self.out is not None:
            lines.append(f"advice: {self.out / run_folder.ADVICE_MD}, {self.out / run_folder.ADVICE_CSV} "
                         f"({len(self.table)} configurations at {self.world_size} ranks)")
        return lines


def run(run_dir: Path | str, target: Target | None = DEFAULT_TARGET,
        memory_gb: float | None = None, out: Path | str | None = None, write: bool = True) -> Advice:
    """Rank the configurations of the run at `run_dir` at its largest measured world size, leave out those
    over `memory_gb`, project them to `target` (None: no projection) and, with `write`, write advice.md and
    advice.csv into `out` (default RUN/advice/). UsageError or RunError (nothing written) on bad input or a
    run with nothing to rank."""
    run_dir = Path(run_dir)
    if target is not None:
        if target.gpus is None or not 1 <= target.gpus <= MAX_WORLD_SIZE:
            raise UsageError(f"--target-gpus={target.gpus}: must lie in [1, {MAX_WORLD_SIZE}]")
        if target.network not in NETWORKS:
            raise UsageError(f"--network={target.network!r} is not a preset; choose from {list(NETWORKS)}")
    if memory_gb is not None and not memory_gb > 0:
        raise UsageError(f"--memory-gb={memory_gb:g}: must be > 0")
    out = Path(out) if out is not None else run_dir / run_folder.ADVICE_DIR
    if write:  # another command's folder (RUN itself: RUN/projection is bench project's), or a file
        run_folder.check_out(out, "advise", run_dir)
    try:
        loaded = load_run(run_dir)
    except RunError as exc:
        raise RunError(f"run={str(run_dir)!r}: {exc}") from None
    results = loaded.results
    if largest_world_size(results) is None:
        raise UsageError(f"run={str(run_dir)!r}: no cell finished with status ok and a throughput "
                         f"({len(results)} cells); nothing to rank")
    table = rank_configurations(results, memory_gb)
    if not table["rank"].notna().any():
        low = table["peak_mem_mb"].min() / 1024
        raise UsageError(f"--memory-gb={memory_gb:g} is below every configuration's peak memory (the "
                         f"smallest is {low:.2f} GiB); nothing to recommend")
    notes: list[str] = []
    if target is None:
        target = Target(why_not=f"`python -m bench advise {run_dir}` projects it to a target cluster")
    else:
        projection, notes, why_not = project_at(run_dir, target, out / run_folder.PROJECTION_DIR, write)
        if projection is None:
            target = Target(why_not=f"bench project failed: {why_not}")
        else:
            table = with_projection(table, results, projection)
    keys = swept_keys(results)
    general = [n for n in notes if not n.startswith(run_folder.PHYSICS_NOTE)]  # per configuration: notes.txt
    caveats = ([CPU_CAVEAT] if loaded.device == "cpu" else []) + general
    advice = Advice(answer=sentence(table, keys, target), caveats=caveats, table=table, keys=keys,
                    target=target, notes=notes)
    if write:
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / run_folder.ADVICE_CSV, index=False)
        (out / run_folder.ADVICE_MD).write_text(advice_markdown(advice))
        advice.out = out
    return advice


def project_at(run_dir: Path, target: Target, out: Path,
               write: bool) -> tuple[pd.DataFrame | None, list[str], str]:
    """The run projected to the target (bench.project.run, written by advise itself into `out`, a folder
    of its own): (projection rows, its notes, why none)."""
    gpus_per_node = 8 if target.gpus % 8 == 0 else target.gpus  # an NVLink node of 8 GPUs, or one node
    try:
        projection = project.run(run_dir, [target.network], [target.gpus], gpus_per_node=gpus_per_node,
                                 write=False)
    except (project.UsageError, InputError, RunError) as exc:
        return None, [], str(exc)
    if write:
        projection.write(out)
    return projection.projection, projection.notes + projection.physics, ""


def dominant_loss(projected: dict) -> str:
    """What the projected step loses most to: the projection's largest term (bench.project.simulate.TERMS:
    straggler, interference, host floor), and where that is exposed communication or nothing, its
    `bottleneck` (bandwidth, latency, overlap-limited, compute) says which kind."""
    term = projected.get("dominant_term")
    if isinstance(term, str) and term not in ("exposed_comm", "none", ""):
        return term
    return projected["bottleneck"]


def with_projection(advice: pd.DataFrame, results: pd.DataFrame, projection: pd.DataFrame) -> pd.DataFrame:
    """advice rows with their configuration's projected samples/s, efficiency (a fraction) and bottleneck;
    a configuration is matched by bench.project's own key (its base cell is its smallest world size)."""
    by_cell = results.set_index("cell_id")
    keyed = {config_key(by_cell.loc[c]): r
             for c, r in zip(projection["cell_id"], projection.to_dict("records")) if c in by_cell.index}
    advice = advice.copy()
    for i, cell in zip(advice.index, advice["cell_id"]):
        p = keyed.get(config_key(by_cell.loc[cell]))
        if p is None:
            advice.loc[i, "projection_note"] = "not in the projection"
        elif pd.isna(p["efficiency_pct"]):
            advice.loc[i, "projection_note"] = str(p["reason"])
        else:
            advice.loc[i, ["projected_samples_per_s", "projected_efficiency", "dominant_loss"]] = [
                p["predicted_samples_per_s"], p["efficiency_pct"] / 100, dominant_loss(p)]
    return advice


def advice_markdown(advice: Advice) -> str:
    """advice.md: the answer first, then the caveats and the ranking (every column is in advice.csv)."""
    shown = ["rank", "tied_with_best", *advice.keys, "samples_per_s", "samples_per_s_ci95_low",
             "samples_per_s_ci95_high", "projected_efficiency", "dominant_loss", "why"]
    # text from the run (a user model's size, its errors) is shown, never rendered: <, >, & escaped
    lines = ["# Advice", "", html.escape(advice.answer, quote=False), ""]
    lines += [f"> {html.escape(c, quote=False)}" for c in advice.caveats] + ([""] if advice.caveats else [])
    lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for _, r in advice.table.iterrows():
        lines.append("| " + " | ".join(_cell(r[c]) for c in shown) + " |")
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.0f}"
    return html.escape(str(value), quote=False).replace("|", "\\|").replace("\n", " ")
