"""Where a race's first look should come, on real rounds (docs/measurement.md, "Racing search"): replays a
recorded run's rounds (results rows' step_times_ms: a race's candidates stepped side by side, paired by
round) through bench/race.py's elimination at every round count from stats.MIN_SAMPLES to the rounds all
candidates of a recipe shared, as if that round count were a look spending `--share` of α alone, under
Simes' combination (the rule) and under Bonferroni's (the rule until issue 56). Prints per recipe, per round
count, how many each would eliminate. What a look placed there would find, not what the race did: the race
spends α over several looks (race.looks) and stops stepping what it eliminates.

    PYTHONPATH=. python scripts/race_replay.py RUN [RUN ...] [--share 0.025]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import race, run_folder, stats  # noqa: E402


def eliminated(samples: dict[str, list[float]], rounds: int, share: float, combine) -> int:
    """How many of `samples`' candidates race.eliminate drops at `rounds`, combining each one's tests by
    `combine` (race.simes or race.bonferroni)."""
    return len(race.eliminate({c: s[:rounds] for c, s in samples.items()}, rounds, share, combine=combine))


def replay(run_dir: Path, share: float) -> None:
    rows = [r for r in run_folder.read_records(run_dir) if r["status"] in ("ok", "raced_out")]
    for key in sorted({race.recipe(r) for r in rows}):
        samples = {r["cell_id"]: list(r["step_times_ms"]) for r in rows if race.recipe(r) == key}
        shared = min(len(s) for s in samples.values())
        pairs = [(eliminated(samples, n, share, race.simes), eliminated(samples, n, share, race.bonferroni))
                 for n in range(stats.MIN_SAMPLES, shared + 1)]
        counts = [f"{n}: {a}/{b}" for n, (a, b) in enumerate(pairs, start=stats.MIN_SAMPLES)]
        print(f"{run_dir.name} ws{key[2]} gb{key[3]}, {len(samples)} candidates, {shared} shared rounds "
              f"(rounds: Simes/Bonferroni eliminated; first look by race.first_look_rounds: "
              f"{race.first_look_rounds(len(samples), share)})")
        print("  " + "  ".join(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--share", type=float, default=race.RACE_ALPHA * race.FIRST_LOOK_SHARE,
                        help="the α a look spends (default: the first look's)")
    args = parser.parse_args()
    for run_dir in args.runs:
        replay(run_dir, args.share)


if __name__ == "__main__":
    main()
