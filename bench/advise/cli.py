"""`python -m bench advise RUN [--target-gpus N] [--network PRESET] [--memory-gb M] [--out DIR]`.

Prints the short answer first, then writes DIR (default RUN/advice/): advice.md (the answer, the ranking,
the caveats) and advice.csv (one row per configuration at the largest measured world size, ranked, with its
projection to --target-gpus on --network). The projection is `bench project`'s own (its add_arguments and
main, into DIR/projection/). Exit 2 on bad input, before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.advise.answer import CPU_CAVEAT, Target, sentence
from bench.advise.rank import largest_world_size, rank_configurations, swept_keys
from bench.project import cli as project_cli
from bench.project.network import FABRICS
from bench.project.project import config_key
from bench.run_folder import RunError, load_run

DEFAULT_TARGET_GPUS = 64
DEFAULT_NETWORK = "ib-ndr400"
NETWORKS = (*FABRICS, project_cli.MEASURED)


class UsageError(ValueError):
    """A bad argument: the message names the key and the value."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a results/<run-id>/ folder")
    parser.add_argument("--target-gpus", type=int, default=DEFAULT_TARGET_GPUS,
                        help=f"world size to project the top configurations to "
                             f"(default: {DEFAULT_TARGET_GPUS})")
    parser.add_argument("--network", default=DEFAULT_NETWORK,
                        help=f"network preset for the projection: {', '.join(NETWORKS)} "
                             f"(default: {DEFAULT_NETWORK})")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="exclude configurations whose peak memory (peak_mem_mb) is over this many GiB")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: RUN/{run_folder.ADVICE_DIR})")


def _check(args: argparse.Namespace) -> None:
    if args.target_gpus < 1:
        raise UsageError(f"--target-gpus={args.target_gpus}: must be >= 1")
    if args.network not in NETWORKS:
        raise UsageError(f"--network={args.network!r} is not a preset; choose from {list(NETWORKS)}")
    if args.memory_gb is not None and not args.memory_gb > 0:
        raise UsageError(f"--memory-gb={args.memory_gb:g}: must be > 0")


def project_at(run_dir: Path, target: Target, out: Path) -> tuple[pd.DataFrame | None, list[str], str]:
    """`bench project RUN --network P --world-sizes N` into `out`: (projection rows, its notes, why none).
    Its printout is kept for advice.md; the answer is printed first."""
    parser = argparse.ArgumentParser()
    project_cli.add_arguments(parser)
    gpus_per_node = 8 if target.gpus % 8 == 0 else target.gpus  # an NVLink node of 8 GPUs, or one node
    args = parser.parse_args([str(run_dir), "--network", target.network, "--world-sizes", str(target.gpus),
                              "--gpus-per-node", str(gpus_per_node), "--out", str(out)])
    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        rc = project_cli.main(args)
    if rc != 0:
        return None, [], errors.getvalue().strip() or f"bench project exited {rc}"
    notes_file = out / run_folder.PROJECTION_NOTES
    notes = notes_file.read_text().splitlines() if notes_file.is_file() else []
    return pd.read_csv(out / run_folder.PROJECTION), notes, ""


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


def main(args: argparse.Namespace) -> int:
    try:
        _check(args)
        run = load_run(args.run_dir)
    except UsageError as exc:
        print(f"bench advise: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"bench advise: run={str(args.run_dir)!r}: {exc}", file=sys.stderr)
        return 2
    results = run.results
    if largest_world_size(results) is None:
        print(f"bench advise: run={str(args.run_dir)!r}: no cell finished with status ok and a throughput "
              f"({len(results)} cells); nothing to rank", file=sys.stderr)
        return 2
    advice = rank_configurations(results, args.memory_gb)
    if not advice["rank"].notna().any():
        low = advice["peak_mem_mb"].min() / 1024
        print(f"bench advise: --memory-gb={args.memory_gb:g} is below every configuration's peak memory "
              f"(the smallest is {low:.2f} GiB); nothing to recommend", file=sys.stderr)
        return 2

    out = args.out or args.run_dir / run_folder.ADVICE_DIR
    out.mkdir(parents=True, exist_ok=True)
    target = Target(args.target_gpus, args.network)
    projection, notes, why_not = project_at(args.run_dir, target, out / run_folder.PROJECTION_DIR)
    if projection is None:
        target = Target(why_not=f"bench project failed: {why_not}")
    else:
        advice = with_projection(advice, results, projection)
    keys = swept_keys(results)
    answer = sentence(advice, keys, target)
    general = [n for n in notes if not n.startswith(run_folder.PHYSICS_NOTE)]  # per configuration: notes.txt
    caveats = ([CPU_CAVEAT] if run.device == "cpu" else []) + general
    print(answer)
    for caveat in caveats:
        print(f"note: {caveat}")
    advice.to_csv(out / run_folder.ADVICE_CSV, index=False)
    (out / run_folder.ADVICE_MD).write_text(advice_markdown(answer, caveats, advice, keys))
    print(f"advice: {out / run_folder.ADVICE_MD}, {out / run_folder.ADVICE_CSV} ({len(advice)} "
          f"configurations at {int(advice['world_size'].iloc[0])} ranks)")
    return 0


def advice_markdown(answer: str, caveats: list[str], advice: pd.DataFrame, keys: list[str]) -> str:
    """advice.md: the answer first, then the caveats and the ranking (every column is in advice.csv)."""
    shown = ["rank", "tied_with_best", *keys, "samples_per_s", "samples_per_s_ci95_low",
             "samples_per_s_ci95_high", "projected_efficiency", "dominant_loss", "why"]
    lines = ["# Advice", "", answer, ""]
    lines += [f"> {c}" for c in caveats] + ([""] if caveats else [])
    lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for _, r in advice.iterrows():
        lines.append("| " + " | ".join(_cell(r[c]) for c in shown) + " |")
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value).replace("|", "\\|")
