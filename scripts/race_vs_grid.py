"""A racing search against the full grid of the same preset (docs/measurement.md, "Racing"): per recipe
(world size, global batch), the race's winner (its ok row of highest samples/s, what `bench advise` ranks
first) against the grid's best, whether the grid calls them tied (the winner's configuration, measured
in the grid, has a 95 % throughput interval reaching the best one's: advise's tie rule), and whether the
race eliminated the grid's best (a miss of the race itself, rather than the two runs measuring apart);
then each run's sweep time (its launches' first to last event) and how many cells the race eliminated;
then what any race could save on the grid's own cells at this machine's noise (`oracle_share`); last, how
far apart the two runs measured the same cells, group by group (`group_drift`): the grid compares cells of
different groups, stepped minutes apart, so a shift of the machine between groups moves its answer and not
its intervals (two grids may be given, to see the grid's own reproducibility).

    python -m bench run --config default --set matrix.world_size=2 --set profile.enabled=false \\
        --search race --out RACE
    python -m bench run --config default --set matrix.world_size=2 --set profile.enabled=false --out GRID
    PYTHONPATH=. python scripts/race_vs_grid.py RACE GRID
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from statistics import NormalDist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import anatomy as anatomy_parts  # noqa: E402
from bench import race, run_folder  # noqa: E402
from bench.config import RunConfig, config_from_dict, read_tables  # noqa: E402
from bench.matrix import MEMORY_STEPS  # noqa: E402
from bench.schema import CONFIG_KEYS, GROUP_KEYS  # noqa: E402


def sweep_seconds(run_dir: Path) -> float:
    """From the first to the last event of the run's launches."""
    paths = sorted((run_dir / run_folder.LOGS).glob("launch-*.events.jsonl"))
    times = [json.loads(line)["t"] for path in paths
             for line in path.read_text().splitlines() if line.strip()]
    return max(times) - min(times)


def throughput_interval(row: dict) -> tuple[float, float]:
    return (row["global_batch"] / row["step_time_ms_ci95_high"] * 1e3,
            row["global_batch"] / row["step_time_ms_ci95_low"] * 1e3)


def config_of(row: dict) -> tuple:
    return tuple(row[k] for k in CONFIG_KEYS)


def grid_run(run_dir: Path) -> RunConfig:
    """The run settings the grid ran with (its config.toml)."""
    return config_from_dict(read_tables(run_dir / run_folder.CONFIG)).run


def paired_noise(grid: list[dict]) -> float:
    """The machine's round-to-round noise of a paired comparison: the median, over the grid's cells, of the
    standard deviation of ln(step / its torch twin's step) over their shared rounds."""
    sds = [statistics.stdev(math.log(x) for x in r["speed_vs_torch_ratios"]) for r in grid
           if len(r.get("speed_vs_torch_ratios") or []) >= 6]
    return statistics.median(sds)


def oracle_share(grid: list[dict], sigma: float, run: RunConfig,
                 alpha: float = race.RACE_ALPHA) -> float:
    """A floor under any race's cost, as a share of the grid's step time on the grid's own cells: a race
    that knew the paired noise `sigma` exactly and spent all of `alpha` at one look, each candidate tested
    against its recipe's best alone at the laxest level Holm's procedure reaches (alpha / (K − 1): a
    one-sided z-test), needs ⌈(z σ / ln d)²⌉ rounds to eliminate a candidate d × slower than the best (after
    the same warm-up); one it cannot eliminate before the grid's own rounds is measured in full. Step
    counts as the grid's (`run`, its run settings): warm-up, its timed rounds, compute-only, phase and
    MEMORY_STEPS memory steps; each weighted by the cell's median step. Launch, build and probe costs are
    left out of both, which only favours the race."""
    by_recipe: dict[tuple, list[dict]] = {}
    for r in grid:
        by_recipe.setdefault(race.recipe(r), []).append(r)
    spent = full = 0.0
    for rows in by_recipe.values():
        z = NormalDist().inv_cdf(1 - alpha / max(1, len(rows) - 1))
        best = min(r["step_time_ms_p50"] for r in rows)
        for r in rows:
            step, grid_rounds = r["step_time_ms_p50"] / 1e3, r["n_timed_steps"]
            whole = run.warmup_steps + grid_rounds + run.compute_only_steps + run.phase_steps + MEMORY_STEPS
            ratio = r["step_time_ms_p50"] / best
            needed = math.inf if ratio <= 1 else math.ceil((z * sigma / math.log(ratio)) ** 2)
            spent += step * (whole if needed >= grid_rounds else run.warmup_steps + needed)
            full += step * whole
    return spent / full


def group_drift(first: list[dict], second: list[dict]) -> tuple[float, float, int]:
    """How two runs' step times of the same cells differ: per cell ln(first's median step / second's), over
    the cells both measured (ok or raced_out in the first, ok in the second); grouped by the grid's side-by-
    side groups (schema.GROUP_KEYS: a configuration, every engine), the standard deviation of the groups'
    means (between) and the pooled one within a group (within), and the number of groups. Within ≪
    between: the groups were measured in different states of the machine (or company), which no
    within-group interval holds."""
    second_by = {r["cell_id"]: r for r in second if r["status"] == "ok"}
    groups: dict[tuple, list[float]] = {}
    for r in first:
        other = second_by.get(r["cell_id"])
        if r["status"] in ("ok", "raced_out") and other is not None:
            key = tuple(r[k] for k in GROUP_KEYS)
            groups.setdefault(key, []).append(math.log(r["step_time_ms_p50"] / other["step_time_ms_p50"]))
    means = {key: statistics.fmean(v) for key, v in groups.items()}
    within = [x - means[key] for key, v in groups.items() for x in v]  # a group of one adds 0
    dof = sum(len(v) - 1 for v in groups.values())
    between_sd = statistics.stdev(means.values()) if len(means) > 1 else math.nan
    within_sd = math.sqrt(sum(x * x for x in within) / dof) if dof else math.nan
    return between_sd, within_sd, len(groups)


def unskippable_s(raced: list[dict], anatomy: dict, min_rounds: int) -> float:
    """What no race can skip, from the race's own run: every candidate's build and warm-up (its rows'
    anatomy_s), its steps to the survivors' minimum rounds at its median step (an elimination needs at least
    those: race.looks), and the run's and launches' fixed parts (anatomy.json, anatomy.RUN_PARTS and
    LAUNCH_PARTS, the concurrent ones left out)."""
    cells = [r for r in raced if r["status"] in ("ok", "raced_out")]
    built = sum((r.get("anatomy_s") or {}).get(p, 0.0) for r in cells for p in ("build", "warmup"))
    stepped = sum(min_rounds * r["step_time_ms_p50"] / 1e3 for r in cells)
    whole = anatomy_parts.RUN_PARTS + anatomy_parts.LAUNCH_PARTS
    fixed = anatomy_parts.added({p: v for p, v in anatomy["parts"].items() if p in whole})
    return built + stepped + fixed


def survivors_s(raced: list[dict], grid: list[dict]) -> float:
    """What the race's survivors cost in the grid: the grid's anatomy_s totals of the cells the race kept
    (ok there). A race measures them as the grid does, so it cannot spend less on them."""
    kept = {r["cell_id"] for r in raced if r["status"] == "ok"}
    return sum(anatomy_parts.added(r.get("anatomy_s") or {}) for r in grid
               if r["status"] == "ok" and r["cell_id"] in kept)


def main(race_dir: Path, grid_dir: Path) -> None:
    raced, grid = run_folder.read_records(race_dir), run_folder.read_records(grid_dir)
    grid_by_config = {config_of(r): r for r in grid if r["status"] == "ok"}
    recipes = sorted({race.recipe(r) for r in grid if r["status"] == "ok"})
    same = tied = lost = 0
    for key in recipes:
        ok_grid = [r for r in grid if r["status"] == "ok" and race.recipe(r) == key]
        ok_race = [r for r in raced if r["status"] == "ok" and race.recipe(r) == key]
        best = max(ok_grid, key=lambda r: r["samples_per_s"])
        winner = max(ok_race, key=lambda r: r["samples_per_s"])
        twin = grid_by_config.get(config_of(winner))
        is_tied = twin is not None and throughput_interval(twin)[1] >= throughput_interval(best)[0]
        same += winner["cell_id"] == best["cell_id"]
        tied += winner["cell_id"] == best["cell_id"] or is_tied
        gone = sum(r["status"] == "raced_out" and race.recipe(r) == key for r in raced)
        fate = next((r for r in raced if r["cell_id"] == best["cell_id"]), {})
        lost += fate.get("status") == "raced_out"
        print(f"ws{key[2]} gb{key[3]}: race winner {winner['cell_id']} ({winner['samples_per_s']:.1f}/s); "
              f"grid best {best['cell_id']} ({best['samples_per_s']:.1f}/s); "
              + ("the same" if winner["cell_id"] == best["cell_id"] else
                 f"in the grid {twin['samples_per_s']:.1f}/s, " + ("tied" if is_tied else "NOT tied"))
              + f"; {gone} of {len(ok_grid)} raced out"
              + (f"; the grid's best was raced out: {fate['error']}" if fate.get("status") == "raced_out"
                 else f"; the grid's best {fate.get('status', 'missing')} in the race"
                 + (", tied there with the winner" if fate.get("status") == "ok" and fate is not winner
                    and throughput_interval(fate)[1] >= throughput_interval(winner)[0] else "")))
    t_race, t_grid = sweep_seconds(race_dir), sweep_seconds(grid_dir)
    out = sum(r["status"] == "raced_out" for r in raced)
    print(f"recipes: {len(recipes)}; winner = grid's best {same}, best or tied {tied} "
          f"({tied / len(recipes):.0%}); the grid's best raced out in {lost}")
    print(f"sweep: race {t_race:.0f} s, grid {t_grid:.0f} s, race/grid {t_race / t_grid:.0%}; "
          f"{out} of {len(raced)} cells raced out")
    ok = [r for r in grid if r["status"] == "ok"]
    sigma = paired_noise(ok)
    print(f"floor: paired noise σ {sigma:.3f} a round (ln ratio); a race knowing σ, all of α at one look: "
          f"{oracle_share(ok, sigma, grid_run(grid_dir)):.0%} of the grid's step time")
    race_anatomy, grid_anatomy = run_folder.read_anatomy(race_dir), run_folder.read_anatomy(grid_dir)
    if race_anatomy and grid_anatomy:
        wall = grid_anatomy["wall_s"]
        floor = unskippable_s(raced, race_anatomy, config_from_dict(read_tables(race_dir / run_folder.CONFIG))
                              .run.min_timed_steps)
        kept = survivors_s(raced, grid)
        print(f"what no race skips (every candidate built, warmed up and stepped to the minimum rounds, and "
              f"the launch): {floor:.1f} s, {floor / wall:.0%} of the grid's wall; the race's survivors cost "
              f"{kept:.1f} s in the grid, {kept / wall:.0%}")
    between, within, n = group_drift(raced, grid)
    print(f"the two runs' step of the same cell, ln(first / second): SD between the grid's {n} groups' means "
          f"{between:.3f}, within a group {within:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
