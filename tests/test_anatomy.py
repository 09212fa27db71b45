"""The cost anatomy (bench/anatomy.py PARTS): its parts, its arithmetic (hand-worked), the estimate's,
and what a real run records (tests/test_race_run.py runs one)."""

from __future__ import annotations

import pandas as pd
import pytest

from bench import anatomy
from bench.__main__ import main as bench_main
from bench.config import load_config
from bench.matrix import MEMORY_STEPS
from bench.run.estimate import (
    cell_parts,
    estimate_cell_seconds,
    estimate_parts,
    estimate_seconds,
    scaled_parts,
)
from tests.test_estimate import HAND, hand_cell


def test_parts_are_defined_once_with_a_scope_each():
    scopes = set(anatomy.CELL_PARTS) | set(anatomy.LAUNCH_PARTS) | set(anatomy.RUN_PARTS)
    assert scopes == set(anatomy.PARTS)
    assert {"spawn", "rendezvous", "build", "warmup", "timed", "profile", "compute_only", "gate", "analysis",
            "writing"} <= set(anatomy.PARTS)


def test_share_hand_worked():
    # 6 s of a race's timed rounds over three candidates that stepped 10, 10 and 40 rounds: 1, 1, 4
    shared = anatomy.share(6.0, ["a", "b", "c"], [10, 10, 40])
    assert shared == pytest.approx({"a": 1.0, "b": 1.0, "c": 4.0})
    # without weights (or all zero): evenly
    assert anatomy.share(6.0, ["a", "b", "c"]) == pytest.approx({"a": 2.0, "b": 2.0, "c": 2.0})
    assert anatomy.share(6.0, ["a", "b"], [0, 0]) == pytest.approx({"a": 3.0, "b": 3.0})
    assert anatomy.share(6.0, []) == {}


def test_add_total_and_an_unknown_part():
    parts = anatomy.add({}, "timed", 1.5)
    anatomy.add(parts, "timed", 0.5)
    assert parts == {"timed": 2.0}
    # summed in PARTS order, whatever order they came in
    assert list(anatomy.total([{"timed": 1.0, "build": 2.0}, {"spawn": 3.0, "timed": 1.0}])) == [
        "spawn", "build", "timed"]
    with pytest.raises(KeyError, match="'bogus' is not one of"):
        anatomy.add({}, "bogus", 1.0)


def test_table_and_words():
    lines = anatomy.table({"build": 1.0, "timed": 3.0}, wall_s=5.0)
    assert lines[0].split() == ["build", "1.0", "s", "20.0", "%"]
    assert lines[1].split() == ["timed", "3.0", "s", "60.0", "%"]
    assert "total" in lines[-1] and "unaccounted 1.0 s" in lines[-1]
    # the launcher's writing overlaps the ranks' work: shown, not added
    lines = anatomy.table({"timed": 3.0, "writing": 1.0}, wall_s=4.0)
    assert "not in the total" in lines[1] and "unaccounted 1.0 s" in lines[-1]
    assert anatomy.added({"timed": 3.0, "writing": 1.0}) == 3.0
    assert anatomy.words({"timed": 3.0, "build": 1.0}) == "build 1.0 s, timed 3.0 s"


def test_cell_parts_hand_worked():
    config = load_config("cpu-smoke", ["run.warmup_steps=5", "run.timed_steps=20", "run.repeats=1",
                                       "run.phase_steps=3", "run.compute_only_steps=10", "run.launches=1"])
    assert MEMORY_STEPS == 3
    # step 0.30 s, 0.24 without the all-reduce (tests/test_estimate.py), builds 1e-8 × 1e7 = 0.1 s
    parts = cell_parts(config, HAND, hand_cell(), 1e10, 10_000_000, 100)
    assert parts == pytest.approx({"build": 0.1, "warmup": 1.5, "timed": 6.0, "phase": 0.9, "gate": 0.0,
                                   "compute_only": 2.4, "memory": 0.1 + 0.9, "other": 0.5})
    assert sum(parts.values()) == pytest.approx(
        estimate_cell_seconds(config, HAND, hand_cell(), 1e10, 10_000_000, 100)) == pytest.approx(12.4)


def test_scaled_parts_hand_worked():
    # two cells of {timed 3, build 1} in two slots at once: 4 s, not 8; the parts scale with it
    parts = {"a": {"timed": 3.0, "build": 1.0}, "b": {"timed": 3.0, "build": 1.0}}
    assert scaled_parts(parts, 4.0) == pytest.approx({"build": 1.0, "timed": 3.0})
    assert scaled_parts(parts, 8.0) == pytest.approx({"build": 2.0, "timed": 6.0})


def test_estimate_parts_add_up_to_the_estimate_and_the_dry_run_prints_them(capsys, monkeypatch):
    monkeypatch.setattr("bench.run.estimate.RATES", {"cpu": HAND})
    config = load_config("cpu-smoke", ["matrix.engine=torch,bucketed"])
    from bench.matrix import expand

    cells = expand(config)
    parts = estimate_parts(config, cells, HAND)
    assert parts["start"] == 7.0 and parts["spawn"] == 10.0 * len({c.world_size for c in cells}) * \
        config.run.launches
    assert sum(parts.values()) == pytest.approx(estimate_seconds(config, cells, HAND))
    assert bench_main(["run", "--config", "cpu-smoke", "--set", "matrix.engine=torch,bucketed",
                       "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"  the estimate's parts: {anatomy.words(parts)}" in out
    assert bench_main(["run", "--config", "cpu-smoke", "--set", "matrix.engine=torch,bucketed",
                       "--search", "race", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "  the grid's parts: " in out
    assert "  race's parts, low: " in out and "  race's parts, high: " in out


def test_the_report_section_shows_the_run_and_each_cell(tmp_path):
    import json

    from report_fixtures import scaling_rows, write_run

    from bench import run_folder
    from bench.report.run_page import anatomy_section

    rows = scaling_rows()[:2]
    run_dir = write_run(tmp_path / "run", rows)
    parts = [{"build": 1.0, "timed": 3.0}, {"build": 1.0, "warmup": 0.5}]
    lines = [json.loads(line) for line in (run_dir / run_folder.CELLS).read_text().splitlines()]
    (run_dir / run_folder.CELLS).write_text("".join(json.dumps(r | {"anatomy_s": p}) + "\n"
                                                    for r, p in zip(lines, parts)))
    data = {"wall_s": 10.0,
            "parts": {"spawn": 2.0, "build": 2.0, "warmup": 0.5, "timed": 3.0, "writing": 1.0}}
    (run_dir / run_folder.ANATOMY).write_text(json.dumps(data))
    assert run_folder.read_anatomy(tmp_path) is None  # no anatomy.json: no section
    out = tmp_path / "report"
    (out / "tables").mkdir(parents=True)
    anatomy_section(run_folder.load_run(run_dir), out)
    run_table = pd.read_csv(out / "tables" / "anatomy.csv").set_index("part")
    # 2.0 + 2.0 + 0.5 + 3.0 = 7.5 of 10 s; writing shown, not added (it overlaps the ranks' work)
    assert run_table.loc["unaccounted", "seconds"] == pytest.approx(2.5)
    assert run_table.loc["timed", "share_pct"] == pytest.approx(30.0)
    cells = pd.read_csv(out / "tables" / "anatomy_cells.csv").set_index("cell_id")
    assert list(cells["total_s"]) == [4.0, 1.5] and cells.iloc[0]["timed"] == 3.0


def test_a_compiled_graph_is_paid_once_per_launch_by_the_options_outside_it():
    import dataclasses

    from bench.run.estimate import compiling, graph_key

    torch_c = hand_cell(compile="inductor")
    hooked = dataclasses.replace(torch_c, comm_hook="powersgd")
    bf16 = dataclasses.replace(torch_c, precision="bf16")
    other_ws = dataclasses.replace(torch_c, world_size=2)
    assert graph_key(torch_c) == graph_key(hooked) != graph_key(bf16)
    # the hook runs outside the graph: its cell reuses torch's graphs; bf16 compiles its own; so does another
    # world size (another launch, another process); an eager cell compiles nothing
    assert compiling([torch_c, hooked, bf16, other_ws, hand_cell()]) == {
        torch_c.cell_id, bf16.cell_id, other_ws.cell_id}
    # Rates.compile_s 20 s: the reusing cell's warm-up holds none of it, in each of its launches
    rates = dataclasses.replace(HAND, compile_s=20.0)
    config = load_config("cpu-smoke", ["run.warmup_steps=5", "run.timed_steps=20", "run.repeats=1",
                                       "run.phase_steps=3", "run.compute_only_steps=10", "run.launches=2"])
    pays = cell_parts(config, rates, torch_c, 1e10, 10_000_000, 100, compiles=True)
    reuses = cell_parts(config, rates, hooked, 1e10, 10_000_000, 100, compiles=False)
    assert pays["warmup"] - reuses["warmup"] == pytest.approx(2 * 20.0)  # two launches: each compiles
    assert pays["warmup"] == pytest.approx(2 * (5 * 0.30 + 20.0))
