"""A racing search end to end (`bench run --search race`) on the cpu-smoke preset through real processes,
with a candidate slower in every round (tests/slow_engine.py): it is raced out with its comparison, the
survivors are measured fully, advise ranks only them and the report says so; and the launcher's carry-over
of an elimination to a larger world size, on a recorded run folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import anatomy, engines, race, run_folder
from bench.advise import api as advise
from bench.config import load_config
from bench.matrix import expand
from bench.report import findings, run_ledger
from bench.run import results
from bench.run.folder import RETRYABLE
from bench.run.progress import Progress
from bench.run.sweep import Sweep
from bench.schema import RACE_COLUMNS, STATUSES
from tests.test_runner import read_csv, run_bench

TESTS = str(Path(__file__).resolve().parent)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launches", [1, 2])
def test_a_race_on_cpu_smoke_eliminates_the_slow_candidate(tmp_path, monkeypatch, launches):
    monkeypatch.setenv(engines.PLUGIN_VARIABLE, "slow_engine")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    out = tmp_path / "run"
    # one recipe (global batch 4 at world size 2), three candidates, 8 fixed rounds: a single look at the
    # end with all of 5 % (race.looks(8, 8, 3)); slowtorch loses every round: p = 2^-8 <= 0.05 / 3 / 2.
    # Only slowtorch is to be profiled: a raced-out cell gets no profiled pass, so no trace at all.
    proc = run_bench(out, "matrix.engine=torch,bucketed,slowtorch", "matrix.world_size=2",
                     "matrix.grad_accum=1", "run.timed_steps=8", "profile.cells=slowtorch-*",
                     f"run.launches={launches}",
                     extra=("--search", "race"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert race.looks(8, 8, 3) == [(8, pytest.approx(0.05))]
    _, rows = read_csv(out)
    slow = [r for r in rows if r["engine"] == "slowtorch"]
    assert len(slow) == 1 and all(r["status"] == "raced_out" for r in slow)
    assert not (out / run_folder.TRACES).exists() or not any((out / run_folder.TRACES).iterdir())
    for r in slow:
        assert r["race_against"] in {row["cell_id"] for row in rows if row["world_size"] == r["world_size"]}
        assert r["race_round"] == "8" and r["race_paired"] == "true"
        assert float(r["race_slowdown_low"]) > 1 and float(r["race_p"]) == pytest.approx(2 ** -8)
        assert float(r["race_p"]) <= float(r["race_level"])
        if launches == 1:
            assert r["n_timed_steps"] == "8" and r["step_time_ms_p50"]
        else:  # one launch's rounds beside the survivors' over two: left out (bench/schema.py ROUND_FIGURES)
            assert not r["n_timed_steps"] and not r["step_time_ms_p50"] and not r["samples_per_s"]
        assert not r["compute_only_ms_p50"] and not r["peak_mem_mb"]
        # with two launches the first eliminates it ("launch 1 of 2: raced out ..."): the second does not
        # measure it again
        said = "raced out after 8 rounds"
        assert r["error"].startswith(said if launches == 1 else f"launch 1 of 2: {said}")
        assert not r["trace_dir"]
    survivors = [r for r in rows if r["status"] == "ok"]
    assert survivors and all(r["compute_only_ms_p50"] and r["peak_mem_mb"] and not r["race_against"]
                             for r in survivors)
    records = {r["cell_id"]: r for r in results.read_records(out)}
    assert all(len(records[r["cell_id"]]["launch_rows"]) == 1 for r in slow)
    assert all(records[r["cell_id"]]["launches"] == launches for r in survivors)
    assert all(r["status"] in ("ok", "raced_out") for r in rows)
    # advise ranks the survivors only; the report's findings say the run was raced, and list the eliminated
    table = advise.run(out, target=None, write=False).table
    ranked = table[table["rank"].notna()]
    assert set(ranked["cell_id"]) <= {r["cell_id"] for r in survivors if r["world_size"] == "2"}
    left_out = table[table["rank"].isna()].set_index("cell_id")  # "did not make it", with the race's reason
    assert {r["cell_id"] for r in slow} <= set(left_out.index)
    assert all(left_out.loc[r["cell_id"], "status"] == "raced_out" for r in slow)
    run = run_folder.load_run(out)
    said = " ".join(findings.race_summary(run.results, "race"))
    assert "The run was raced (run.search = race)" in said and "after 8 rounds" in said
    # (torch and bucketed may race each other out too: 8 one-way rounds between them is a real difference)
    assert set(run_ledger.raced_out(run.results)["cell_id"]) == {r["cell_id"] for r in rows
                                                              if r["status"] == "raced_out"}
    assert "raced_out" not in set(run_ledger.not_measured(run.results)["status"])
    # the cost anatomy (anatomy.PARTS): the run's parts in anatomy.json and printed; a raced-out cell
    # paid for its build, warm-up and rounds only, a survivor for every phase
    assert "where the time went (anatomy.json" in proc.stdout
    data = run_folder.read_anatomy(out)
    assert {"start", "spawn", "rendezvous", "teardown", "writing", "build", "timed"} <= set(data["parts"])
    assert anatomy.added(data["parts"]) <= data["wall_s"] and len(data["launches"]) == launches
    for r in slow:
        parts = records[r["cell_id"]]["anatomy_s"]
        assert {"build", "warmup", "timed"} <= set(parts)
        assert not {"phase", "gate", "compute_only", "probe", "memory", "profile"} & set(parts)
    for r in survivors:
        assert {"build", "warmup", "timed", "gate", "compute_only", "memory"} <= set(
            records[r["cell_id"]]["anatomy_s"])
    shown = run_ledger.anatomy_run_table(data)
    added = shown[~shown["part"].isin(anatomy.CONCURRENT)]["seconds"].sum()
    assert list(shown["part"])[-1] == "unaccounted" and added == pytest.approx(data["wall_s"], abs=0.05)
    assert set(run_ledger.anatomy_cells_table(list(records.values()))["cell_id"]) == set(records)


def test_a_race_does_not_launch_what_a_smaller_world_size_raced_out(tmp_path):
    # Recorded: at world size 2, naive (accumulation 1) raced out in both of its recipes (strong, weak);
    # the world-size-4 launch records its naive cells raced_out, with that comparison, and launches the rest.
    config = load_config("cpu-smoke", ["matrix.world_size=2,4", "matrix.grad_accum=1", "run.search=race",
                                       "run.allow_oversubscribe=true"])
    cells = expand(config)
    (tmp_path / run_folder.LOGS).mkdir()
    for cell in (c for c in cells if c.world_size == 2):
        status = "raced_out" if cell.engine == "naive" else "ok"
        measured = {"race_against": "torch-x", "race_slowdown": 1.5, "race_round": 13} \
            if status != "ok" else {}
        results.append_record(tmp_path, results.make_record(cell, config, status, "why", measured))
    sweep = Sweep(config, tmp_path, Progress(total=4, stream=open(os.devnull, "w")))
    at4 = [c for c in cells if c.world_size == 4]
    kept = sweep.carry_over(at4)
    assert {c.engine for c in kept} == {"torch", "bucketed", "overlap"}
    recorded = {r["cell_id"]: r for r in results.read_records(tmp_path)}
    for cell in (c for c in at4 if c.engine == "naive"):
        r = recorded[cell.cell_id]
        assert r["status"] == "raced_out" and r["error"].startswith("not launched at world size 4")
        assert (r["race_against"], r["race_slowdown"], r["race_round"]) == ("torch-x", 1.5, 13)
        assert set(RACE_COLUMNS) <= set(r)
    # --resume --retry raced_out measures them again (a status like any other failure to finish)
    assert "raced_out" in RETRYABLE and "raced_out" in STATUSES
