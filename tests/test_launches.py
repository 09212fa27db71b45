"""run.launches: a cell measured in several launches, their order shuffled, merged into one row
(bench/run/merge.py); the straggler fault and the warm-up test inside a rank (bench/worker/cell.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import stats
from bench.config import ConfigError, load_config
from bench.matrix import expand
from bench.run import between, merge, results
from bench.run.folder import launches_complete
from bench.run.schedule import launch_order
from bench.run_folder import launch_file, read_records
from bench.schema import PASSES, REPEAT_PASSES, Passes

REPO = Path(__file__).resolve().parent.parent


def test_the_launch_order_is_shuffled_with_the_seed():
    one = launch_order([1, 2], 1, 1234)
    assert one == [(1, 0), (2, 0)]  # one launch each: world sizes in order, as before
    three = launch_order([1, 2], 3, 1234)
    assert sorted(three) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert three == launch_order([1, 2], 3, 1234) and three != sorted(three)
    assert any(launch_order([1, 2], 3, seed) != three for seed in range(5))


def test_config_checks_launches_and_the_straggler_fault():
    assert load_config("cpu-smoke", ["run.launches=3"]).run.launches == 3
    for bad, words in (("run.launches=0", "run.launches=0: must be >= 1"),
                       ("debug.fault=slow@x", "'slow:<ms>@<...>'"),
                       ("debug.fault=slow:-2@x", "slow:<ms> takes milliseconds > 0")):
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("*", r"\*")):
            load_config("cpu-smoke", [bad])
    debug = load_config("cpu-smoke", ["debug.fault=slow:2.5@overlap"]).debug
    assert debug.slow_ms_for("overlap-mlp", 1, 2) == 2.5 and debug.slow_ms_for("torch-mlp", 1, 2) == 0.0
    assert debug.fault_for("overlap-mlp") == "slow"


def _row(times, ratios=(), **extra):
    return {"step_times_ms": list(times), "warmup_times_ms": [9.0], "speed_vs_torch_ratios": list(ratios),
            "step_time_ms_p50": sorted(times)[len(times) // 2], "tokens_per_s": 1000.0, "mfu": None,
            "warmup_steps_detected": 2, "outlier_steps": 1, "cell_wall_s": 3.0, "steps_wall_s": 1.0,
            "stopped_by": None, "rank_skew_ms_p50": None, "peak_mem_mb": 5.0} | extra


def test_two_launches_merged_by_hand():
    # launch 0: steps 9, 10 (×3), 11 (×2) → median 10, interval [9, 11] (n = 6: [min, max]); launch 3:
    # 11, 12 (×3), 13 (×2) → median 12, [11, 13]. Alone (no family): the cell's own spread on 1 degree of
    # freedom: centre √120, half = t_{0.975, 1} · √(max(s², w̄) / 2), s² = (ln 1.2)² / 2.
    a = [9.0, 10.0, 10.0, 10.0, 11.0, 11.0]
    b = [11.0, 12.0, 12.0, 12.0, 13.0, 13.0]
    e0, l0 = merge.launch_entry(0, PASSES, "ok", None, _row(a, [1.1] * 6, compute_only_ms_p50=4.0), "SHM")
    e1, l1 = merge.launch_entry(3, REPEAT_PASSES, "ok", None, _row(b, [0.9] * 6, warmup_steps_detected=5,
                                                            peak_mem_mb=None), None)
    lists = {k: l0[k] + l1[k] for k in merge.LISTS}
    row = merge.merged_row([e0, e1], lists, 8, None)
    half = 12.706205 * math.sqrt(math.log(1.2) ** 2 / 2 / 2)
    assert row["step_time_ms_p50"] == pytest.approx(math.sqrt(120))
    assert math.log(row["step_time_ms_ci95_high"] / row["step_time_ms_p50"]) == pytest.approx(half, rel=1e-5)
    assert row["between_launch_cv_pct"] == pytest.approx(100 * math.log(1.2) / math.sqrt(2))
    assert (row["launches"], row["n_timed_steps"], row["warmup_steps_detected"]) == (2, 12, 5)
    assert (row["outlier_steps"], row["cell_wall_s"], row["steps_wall_s"]) == (2, 6.0, 2.0)
    assert row["samples_per_s"] == pytest.approx(8 / math.sqrt(120) * 1e3)
    # per step time: the full launch's tokens/s at its own p50 (10) rescaled to the merged one
    assert row["tokens_per_s"] == pytest.approx(1000.0 * 10 / math.sqrt(120)) and row["mfu"] is None
    assert row["compute_only_ms_p50"] == 4.0 and row["peak_mem_mb"] == 5.0  # the full launch's
    assert row["speed_vs_torch"] == pytest.approx(1.0)  # the launches' rounds pooled
    assert row["speed_vs_torch_ratios"] == [1.1] * 6 + [0.9] * 6
    # over the 12 pooled steps: p90 at position 11 · 0.9 = 9.9 between 12 and 13 (linear interpolation)
    assert row["step_time_ms_p90"] == pytest.approx(12.9) and row["step_time_ms_min"] == 9.0
    one = merge.merged_row([e0], l0, 8, None)  # one launch: its own row, the spread unknown
    assert (one["launches"], one["between_launch_cv_pct"], one["step_time_ms_p50"]) == (1, None, 10.0)


def test_a_merged_rows_step_compute_only_and_exposed_communication_come_from_the_same_launches():
    # Steps as above (medians 10 and 12: merged √120). Compute-only rounds of one rank: launch 0 3, 4 (×3),
    # 5 (×2) → median 4, interval [3, 5]; launch 3: 5, 6 (×3), 7 (×2) → 6, [5, 7]. Merged as the step is:
    # √24, its interval alone on 1 degree of freedom, half = t · √(max(s², w̄) / 2) with s² = (ln 1.5)² / 2
    # and w̄ the mean of (ln(hi/lo) / 3.92)². Exposed = √120 − √24, its half-width the two linear
    # half-widths in quadrature. Before, compute-only and exposed came from launch 0 alone (4.0 and 6.0)
    # while the step was √120, so step − compute-only ≠ exposed.
    a, b = [9.0, 10.0, 10.0, 10.0, 11.0, 11.0], [11.0, 12.0, 12.0, 12.0, 13.0, 13.0]
    co_a, co_b = [3.0, 4.0, 4.0, 4.0, 5.0, 5.0], [5.0, 6.0, 6.0, 6.0, 7.0, 7.0]
    e0, l0 = merge.launch_entry(0, PASSES, "ok", None, _row(a, compute_only_ms_p50=4.0, exposed_comm_ms=6.0,
                                                          compute_only_ms_per_rank=[co_a]), None)
    e1, l1 = merge.launch_entry(3, REPEAT_PASSES, "ok", None,
                                _row(b, compute_only_ms_p50=6.0, exposed_comm_ms=6.0,
                                     compute_only_ms_per_rank=[co_b]), None)
    row = merge.merged_row([e0, e1], {k: l0[k] + l1[k] for k in merge.LISTS}, 8, None)
    assert row["compute_only_ms_p50"] == pytest.approx(math.sqrt(24))
    assert row["exposed_comm_ms"] == pytest.approx(math.sqrt(120) - math.sqrt(24))
    assert row["step_time_ms_p50"] - row["compute_only_ms_p50"] == pytest.approx(row["exposed_comm_ms"])
    w_bar = ((math.log(5 / 3) / (2 * 1.959964)) ** 2 + (math.log(7 / 5) / (2 * 1.959964)) ** 2) / 2
    half = 12.706205 * math.sqrt(max(math.log(1.5) ** 2 / 2, w_bar) / 2)
    co_hw = (math.sqrt(24) * math.exp(half) - math.sqrt(24) * math.exp(-half)) / 2
    step_hw = (row["step_time_ms_ci95_high"] - row["step_time_ms_ci95_low"]) / 2
    expected = math.hypot(step_hw, co_hw)
    assert row["exposed_comm_ms_ci95_high"] - row["exposed_comm_ms"] == pytest.approx(expected, rel=1e-4)
    assert row["exposed_comm_ms"] - row["exposed_comm_ms_ci95_low"] == pytest.approx(expected, rel=1e-4)


def test_a_failed_launch_ends_the_cell_and_says_which():
    entries = [{"status": "ok", "error": None}, {"status": "timeout", "error": "no progress"}]
    assert merge.merged_status(entries, 3) == ("timeout", "launch 2 of 3: no progress")
    assert merge.merged_status(entries[:1], 3) == ("ok", None)
    assert merge.merged_status([{"status": "failed", "error": "boom"}], 1) == ("failed", "boom")


def test_a_race_elimination_ends_the_cell_and_keeps_its_rounds(tmp_path):
    # run.search race with three launches: a cell raced out in its second launch is not measured in the
    # third, and its record keeps the rounds it was compared on (the eliminating launch's row, in
    # launch_rows) and the comparison that eliminated it, where a failure keeps no row. Its own figures are
    # one launch's of three: the row leaves them out (bench/schema.py partial_race_row).
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.grad_accum=1", "matrix.scaling=strong",
                                       "matrix.engine=torch", "run.launches=3", "run.search=race"])
    (cell,) = expand(config)
    records = merge.LaunchRecords(tmp_path, config)
    records.outcome(cell, 0, PASSES, "ok", None, _row([10.0 + i / 10 for i in range(6)]))
    raced = _row([14.0 + i / 10 for i in range(6)], race_against="overlap-x", race_round=6)
    record = records.outcome(cell, 1, REPEAT_PASSES, "raced_out", "raced out after 6 rounds", raced)
    assert not records.needs(cell, 2)
    assert (record["status"], record["error"]) == ("raced_out", "launch 2 of 3: raced out after 6 rounds")
    assert record["race_against"] == "overlap-x" and record["step_time_ms_p50"] is None
    assert record["launch_rows"][1]["row"]["step_time_ms_p50"] == 14.3
    assert len(record["launch_rows"]) == 2 and len(record["step_times_ms"]) == 12


def test_the_progress_bar_drops_the_launches_an_ended_cell_will_not_run(tmp_path):
    # Three launches of two cells: 6 measurements. Measured launches leave the total alone; a cell that fails
    # in its second launch takes its third off it.
    import os
    from types import SimpleNamespace

    from bench.run.progress import Progress
    from bench.run.sweep import Sweep

    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.grad_accum=1", "matrix.scaling=strong",
                                       "matrix.engine=torch,overlap", "run.launches=3"])
    cells = expand(config)
    sweep = Sweep(config, tmp_path, Progress(total=0, stream=open(os.devnull, "w")))
    sweep.progress.total = sweep.measurements(cells)
    assert sweep.progress.total == 6
    first, second = (SimpleNamespace(repeat=j, passes=Passes.of_repeat(j)) for j in range(2))
    for cell in cells:
        sweep.record(cell, first, "ok", None, _row([10.0 + i / 10 for i in range(6)]))
    sweep.record(cells[0], second, "ok", None, _row([10.0 + i / 10 for i in range(6)]))
    assert sweep.progress.total == 6
    sweep.record(cells[1], second, "failed", "RuntimeError: boom")
    assert (sweep.progress.total, sweep.progress.done) == (5, 4)


def test_launch_records_merge_a_family_and_resume_where_they_stopped(tmp_path):
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.grad_accum=1", "matrix.scaling=strong",
                                       "matrix.engine=torch,overlap,bucketed", "run.launches=2"])
    cells = expand(config)
    records = merge.LaunchRecords(tmp_path, config)
    assert all(records.needs(c, 0) and records.needs(c, 1) for c in cells)
    for k, cell in enumerate(cells):
        records.outcome(cell, 0, PASSES, "ok", None, _row([10.0 + k + i / 10 for i in range(6)]))
    assert not records.needs(cells[0], 0) and records.needs(cells[0], 1)
    assert {r["launches"] for r in read_records(tmp_path)} == {1}
    records.outcome(cells[0], 1, REPEAT_PASSES, "ok", None, _row([11.0 + i / 10 for i in range(6)]))
    records.outcome(cells[1], 1, REPEAT_PASSES, "ok", None, _row([12.2 + i / 10 for i in range(6)]))
    records.outcome(cells[2], 1, REPEAT_PASSES, "failed", "RuntimeError: boom", None)
    records.remerge(cells)
    latest = {r["cell_id"]: r for r in read_records(tmp_path)}
    first, second, failed = (latest[c.cell_id] for c in cells)
    assert failed["status"] == "failed" and failed["error"] == "launch 2 of 2: RuntimeError: boom"
    assert len(failed["launch_rows"]) == 2 and failed["step_time_ms_p50"] is None  # the first launch kept
    # the family of the two measured cells, both slower in launch 1 (medians 10.25 → 11.25, 11.25 → 12.45):
    # the launches' shared effect is the mean of the two log ratios
    family = merge.family_of([first, second])
    shift = (math.log(11.25 / 10.25) + math.log(12.45 / 11.25)) / 2
    assert family.effects[1] - family.effects[0] == pytest.approx(shift)
    assert first["launches"] == 2 and first["step_time_ms_p50"] == pytest.approx(
        math.sqrt(10.25 * 11.25), rel=1e-6)  # the launches' medians' geometric mean
    assert first["step_time_ms_ci95_low"] < first["step_time_ms_p50"] < first["step_time_ms_ci95_high"]
    # resumed: a new reader of the folder knows what each cell still needs
    again = merge.LaunchRecords(tmp_path, config)
    assert [again.needs(c, 1) for c in cells] == [False, False, False]
    assert [launches_complete(latest[c.cell_id], 2) for c in cells] == [True, True, True]
    assert not launches_complete(latest[cells[0].cell_id] | {"launch_rows": [{}]}, 2)
    fresh = merge.LaunchRecords(tmp_path, config, fresh={cells[2].cell_id})  # --retry failed
    assert fresh.needs(cells[2], 0) and fresh.needs(cells[2], 1)
    # results.csv carries the launch columns
    csv_row = next(r for r in results.read_records(tmp_path) if r["cell_id"] == cells[0].cell_id)
    assert csv_row["between_launch_cv_pct"] is not None


def test_the_straggler_fault_slows_every_step_of_the_cells_it_names(one_rank_group):
    from bench.worker.cell import run_group
    from bench.worker.context import Launch
    from bench.worker.trainer import Trainer

    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.grad_accum=1", "matrix.scaling=strong",
                                       "matrix.engine=torch,overlap", "run.timed_steps=6",
                                       "run.compute_only_steps=2", "run.phase_steps=1",
                                       "debug.fault=slow:20@overlap"])
    cells = expand(config)
    # the last rank (rank 1 of 2, rank 0 of 1) of the cells the pattern names, only
    assert [Trainer(c, config, torch.device("cpu"), 0, 1, 2).straggle_s for c in cells] == [0.0, 0.02]
    assert Trainer(cells[1], config, torch.device("cpu"), 0, 2, 2).straggle_s == 0.0
    launch = Launch(config, torch.device("cpu"), passes=REPEAT_PASSES)
    rows = {c.engine: row for c, (_, _, row) in zip(cells, run_group(cells, launch))}
    # every overlap step, warm-up and timed, sleeps 20 ms
    assert rows["overlap"]["step_time_ms_min"] >= 20.0 and min(rows["overlap"]["warmup_times_ms"]) >= 20.0
    # a timing-only launch (run.launches' repeats) runs its compute-only rounds (merged with the step over
    # the launches: bench/run/merge.py), no probe or memory pass
    assert rows["torch"]["compute_only_ms_p50"] > 0 and "peak_mem_mb" not in rows["torch"]
    assert rows["torch"]["allreduce_sweep"] == [] and rows["overlap"]["compute_only_ms_p50"] >= 20.0


def test_rounds_still_warming_up_are_found_and_run_again(one_rank_group):
    import time

    from bench.worker.rounds import adaptive_rounds
    from bench.worker.warmup import warmup_found

    calls = {"n": 0}

    def step():  # the first 6 timed steps at 20 ms, then 1 ms
        calls["n"] += 1
        time.sleep(0.020 if calls["n"] <= 6 else 0.001)

    config = load_config("cpu-smoke", ["run.timed_steps=12", "run.target_ci_pct=0"])
    warm = [[20.0, 20.0]]  # the warm-up's two steps, as slow
    rounds = adaptive_rounds([step], config, torch.device("cpu"), None, warmup=warm)
    per_rank, stopped_by = rounds.per_rank, rounds.stopped_by
    found, first = warmup_found(warm, per_rank)
    assert stopped_by is None and found == [8] and first == 6  # 2 warm-up steps + 6 timed rounds
    assert len(per_rank[0][0]) > 12  # rounds found warming up at 12 are run again, once


def test_rounds_run_again_are_replaced_until_the_count_stands(one_rank_group):
    # 2 warm-up steps and the first 6 of 12 timed rounds at 20 ms, the rest 1 ms. After 12 rounds the test
    # finds the warm-up 5 rounds into them (its break sits in the series' first half, so one short): 5 are
    # run again, and in the longer series it finds all 6, so one more: 18 rounds, 12 of them steady (run
    # once, the 5 would leave 11: what made a cell's interval vanish on CI, 5 steady rounds of 6).
    import time

    from bench.worker.rounds import adaptive_rounds
    from bench.worker.warmup import warmup_found

    calls = {"n": 0}

    def step():
        calls["n"] += 1
        time.sleep(0.020 if calls["n"] <= 6 else 0.001)

    config = load_config("cpu-smoke", ["run.timed_steps=12", "run.repeats=1", "run.target_ci_pct=0"])
    warm = [[20.0, 20.0]]
    rounds = adaptive_rounds([step], config, torch.device("cpu"), None, warmup=warm)
    _, first = warmup_found(warm, rounds.per_rank)
    assert first == 6 and len(rounds.per_rank[0][0]) == 18  # 12 steady rounds after the 6 left out


@pytest.mark.slow  # two real launches (~10 s): `make test` runs it, `make test-fast` leaves it
def test_a_run_of_two_launches_end_to_end(tmp_path):
    """Two launches of world size 1 (torch and overlap side by side): the first full and profiled, the
    second timing only; every row merged over both."""
    out = tmp_path / "run"
    sets = ["matrix.world_size=1", "matrix.grad_accum=1", "matrix.scaling=strong",
            "matrix.engine=torch,overlap", "run.launches=2", "run.timed_steps=6", "run.compute_only_steps=2",
            "run.phase_steps=1", "run.probe_iters=1", "profile.cells=torch-*", "run.cell_timeout_s=120"]
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "cpu-smoke",
                           *[a for s in sets for a in ("--set", s)], "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    plans = [json.loads((out / "logs" / launch_file(k, "plan.json")).read_text()) for k in range(2)]
    repeat = [sorted(p["passes"]) != sorted(PASSES) for p in plans]
    assert sorted(repeat) == [False, True] and all(
        sorted(p["passes"]) == sorted(REPEAT_PASSES) for p, r in zip(plans, repeat) if r)
    assert [p["carried_s"] for p in plans] == [0.0, 0.0]  # fixed rounds (cpu-smoke) leave no budget
    assert [len(p["profile"]) for p, r in zip(plans, repeat) if r] == [0]  # profiled once, in the full one
    rows = {r["engine"]: r for r in read_records(out)}
    for r in rows.values():
        assert r["status"] == "ok" and r["launches"] == 2 and r["between_launch_cv_pct"] is not None
        assert [e["passes"] == list(PASSES) for e in r["launch_rows"]] == [not x for x in repeat]
        assert r["step_time_ms_ci95_low"] < r["step_time_ms_p50"] < r["step_time_ms_ci95_high"]
        assert r["peak_mem_mb"] > 0 and r["compute_only_ms_p50"] > 0  # peak memory from the full launch
        assert all(e["row"]["compute_only_ms_per_rank"] for e in r["launch_rows"])  # compute-only in each
        assert r["step_time_ms_p50"] - r["compute_only_ms_p50"] == pytest.approx(r["exposed_comm_ms"])
    assert rows["torch"]["trace_dir"] and not rows["overlap"]["trace_dir"]
    assert "/4 cell launches" in proc.stderr  # the progress bar counts (cell, launch) measurements
    spread = merge.spread_of(rows["torch"]["launch_rows"], rows["torch"]["step_times_ms"])
    assert rows["torch"]["step_time_ms_p50"] == pytest.approx(math.exp(spread.mean))
    assert isinstance(between.fit_family([spread]), type(None)) and stats.MIN_SAMPLES == 6


def test_a_quiet_group_hands_its_unspent_budget_to_the_next():
    from bench.worker.rounds import Budget

    budget = Budget()
    assert budget.allowance_s(8.0) == 8.0
    budget.spend(8.0, 3.0)             # stopped at the target after 3 s: 5 s left over
    assert budget.allowance_s(8.0) == 13.0
    budget.spend(13.0, 13.4)           # the next spent it all (a round past it: nothing carried, no debt)
    assert budget.allowance_s(8.0) == 8.0


def test_a_group_of_several_plain_groups_worth_of_cells_gets_their_budget():
    # default on CPU: 5 engines a plain group, 7 s each; the engine-options slice's group of 11 cells
    # (every option variant of one configuration side by side) gets 11 / 5 × 7 = 15.4 s, as the grid would
    # give them in separate groups; a smaller group (3 bucketed engines, naive alone) still gets one share.
    from bench.matrix import engines_per_group, group_budget_s

    config = load_config("default", cuda_available=False)
    assert (engines_per_group(config), config.run.max_group_s) == (5, 7.0)
    assert group_budget_s(config, 11) == pytest.approx(15.4)
    assert group_budget_s(config, 1) == group_budget_s(config, 3) == 7.0


def test_pin_cpus_gives_each_local_rank_its_own_share(monkeypatch):
    from bench.worker import process

    pinned = []
    monkeypatch.setattr(process.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(process.os, "sched_setaffinity", lambda pid, cpus: pinned.append(list(cpus)),
                        raising=False)
    assert process.pin_cpus(2, 1, 2) == [2, 3] and pinned == [[2, 3]]
    assert process.pin_cpus(3, 0, 2) is None and len(pinned) == 1  # 6 CPUs wanted, 4 allowed: left alone


def _pair_of_runs(tmp_path, launches: int, shifts: list[float]):
    """Two fixture runs of 20 cells (torch, world sizes 1..20): run b's steps × each shift, each ±3 %."""
    from report_fixtures import row, write_run

    def rows(scale):
        out = []
        for n, shift in zip(range(1, 21), scale):
            r = row("torch", n, 100.0 * shift, global_batch=840)
            r.update(step_time_ms_ci95_low=97.0 * shift, step_time_ms_ci95_high=103.0 * shift,
                     launches=launches, between_launch_cv_pct=2.0 if launches > 1 else "")
            out.append(r)
        return out

    return (write_run(tmp_path / "a", rows([1.0] * 20)), write_run(tmp_path / "b", rows(shifts)))


def test_compare_corrects_its_cell_verdicts_for_their_number_and_says_what_it_knows_of_launches(tmp_path):
    from bench.report import compare
    from bench.report.compare_page import write_compare_page
    from bench.run_folder import load_run

    # 20 cells, b 5 % slower in each: ratio 1/1.05, each side [97, 103] % → the ratio's log half-widths
    # √(ln(100/97)² + ln(1.03)²) = 0.04244 both ways, se = 0.04244/1.96 = 0.02166, z = ln(1.05)/0.02166 =
    # 2.25, p = 0.024 each: slower alone against 1. That 5 % common to every cell is the launch shift
    # (median 1/1.05, MAD 0 so σ = the cells' se: √(π/2)·0.02166/√20 = 0.006070, × t_{0.975,19} 2.093 =
    # 0.01270), and each cell relative to it is within noise, alone and after Holm
    a, b = _pair_of_runs(tmp_path, 2, [1.05] * 20)
    joined = compare.join_cells([load_run(a), load_run(b)])
    se = math.hypot(math.log(100 / 97), math.log(103 / 100)) / stats.Z95
    p = 2 * (1 - __import__("statistics").NormalDist().cdf(math.log(1.05) / se))
    assert joined["p_b_vs_a"].tolist() == pytest.approx([p] * 20, rel=1e-3)
    assert set(joined["verdict_b_vs_a"]) == {"slower"} and set(joined["verdict_holm"]) == {"within noise"}
    assert joined["launch_shift_x"].tolist() == pytest.approx([1 / 1.05] * 20)
    assert joined["launch_shift_ci95_high_x"].iloc[0] == pytest.approx(math.exp(0.01270) / 1.05, rel=1e-4)
    assert joined["p_vs_shift"].tolist() == pytest.approx([1.0] * 20)
    assert set(joined["verdict_vs_shift"]) == {"within noise"}
    text = (write_compare_page([a, b], tmp_path / "cmp").parent / "summary.md").read_text()
    assert ("b is 5 % slower than a across every cell: the shift common to all cells is 0.952× [0.940, 0.965]"
            in text)
    assert "cannot be told from a launch effect unless the runs have several launches each" in text
    # 1.96·√(2²/2 + 2²/2) = 3.9 %, against ln(1.05) = 4.9 %
    assert "would give a common shift within ±3.9 % (95 %), which this one exceeds" in text
    assert "20 within noise once corrected for the 20 comparisons" in text
    assert "each cell alone against the shift: 20 within noise" in text
    assert "against no difference (the shift left in), each cell alone: 20 slower" in text
    assert "a timed each cell in 2 launches, whose medians spread by 2.0 %" in text
    # one cell 40 % slower: its p survives the correction; one-launch runs are said to leave the noise unknown
    a1, b1 = _pair_of_runs(tmp_path / "one", 1, [1.0] * 19 + [1.4])
    text = (write_compare_page([a1, b1], tmp_path / "cmp1").parent / "summary.md").read_text()
    assert "1 slower, 19 within noise once corrected" in text
    assert "At least one of them timed each cell in one launch, so that cannot be said here" in text
    assert "a and b timed each cell in one launch, so their between-launch variance is unknown" in text


def test_the_report_says_what_the_intervals_hold_of_launches_warm_up_and_outliers():
    import pandas as pd

    from bench.report import findings

    base = {"status": "ok", "step_time_ms_ci95_low": 9.0, "cell_id": "c"}
    one = pd.DataFrame([base | {"launches": 1.0, "between_launch_cv_pct": float("nan")}])
    assert "the variance between launches is unknown" in findings.launch_noise(one)[0]
    two = pd.DataFrame([base | {"launches": 2.0, "between_launch_cv_pct": 3.0},
                        base | {"launches": 2.0, "between_launch_cv_pct": 5.0, "cell_id": "d"}])
    assert "2 of 2 cells were timed in 2 launches" in findings.launch_noise(two)[0]
    assert "4.0 % at the median cell" in findings.launch_noise(two)[0]
    counted = pd.DataFrame([base | {"warmup_steps_detected": 7.0, "outlier_steps": 3.0},
                            base | {"warmup_steps_detected": 0.0, "outlier_steps": 0.0, "cell_id": "d"}])
    warm, outliers = findings.warmup_and_outliers(counted)
    assert "a slower start in 1 of 2 cells, the longest 7 steps (c)" in warm
    assert outliers.startswith("3 timed steps in 1 cells lie outside Tukey's fences")


def test_the_passes_a_launch_ran_are_kept_and_an_older_folders_flag_still_read():
    """An entry keeps its launch's pass names; a record written before them (a resumed older folder) kept a
    `full` boolean, read as every pass (True) or the repeats' (False); the base row is the first measured
    entry that ran every pass."""
    entry, _ = merge.launch_entry(2, REPEAT_PASSES, "ok", None, {"step_time_ms_p50": 1.0}, None)
    assert entry["passes"] == ["timed", "parity", "compute_only"] and merge.passes_of(entry) == REPEAT_PASSES
    assert merge.passes_of({"full": True}) == PASSES and merge.passes_of({"full": False}) == REPEAT_PASSES
    old = [{"status": "failed", "full": True}, {"status": "ok", "full": False},
           {"status": "ok", "full": True}]
    assert merge.base_entry(old) is old[2] and merge.base_entry(old[:2]) is old[1]
    assert PASSES.profiles and not REPEAT_PASSES.profiles and frozenset(REPEAT_PASSES) == set(entry["passes"])
    assert Passes.of_repeat(0) == PASSES and Passes.of_repeat(3) == REPEAT_PASSES
