"""bench.run.results: one function turns a worker's event into a record; status travels in the event only."""

from __future__ import annotations

import csv

import pytest

from bench.config import load_config
from bench.matrix import expand
from bench.report import run_ledger
from bench.run.merge import LaunchRecords
from bench.run.results import SWEEP_FILE, append_record, make_record, record_from_event
from bench.run_folder import load_run, read_records
from bench.schema import PASSES, REPEAT_PASSES, RESULT_COLUMNS, ROUND_FIGURES, SWEEP_COLUMNS


def test_record_of_a_diverged_cell_keeps_its_numbers():
    config = load_config("cpu-smoke", ["matrix.scaling=strong",
                                       "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1"])
    (cell,) = expand(config)
    # status travels in the event only: a stray "status" or cell key inside the row cannot override it
    row = {"status": "ok", "engine": "naive", "step_time_ms_p50": 2.0, "exposed_comm_ms": float("nan"),
           "step_times_ms": [2.0]}
    event = {"event": "finish", "cell_id": cell.cell_id, "status": "diverged", "error": "differ across ranks",
             "row": row}
    record = record_from_event(cell, config, event)
    assert record["status"] == "diverged" and "differ across ranks" in record["error"]
    assert record["engine"] == "torch" and record["backend"] == "gloo" and record["device"] == "cpu"
    assert record["step_time_ms_p50"] == 2.0 and record["exposed_comm_ms"] is None
    assert set(RESULT_COLUMNS) <= set(record) and record["step_times_ms"] == [2.0]


def test_record_of_an_error_event_carries_its_status():
    config = load_config("cpu-smoke", ["matrix.scaling=strong",
                                       "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1"])
    (cell,) = expand(config)
    event = {"event": "error", "cell_id": cell.cell_id, "rank": 1, "status": "oom", "error": "OutOfMemory"}
    record = record_from_event(cell, config, event)
    assert (record["status"], record["error"], record["step_time_ms_p50"]) == ("oom", "OutOfMemory", None)
    with pytest.raises(ValueError, match="no outcome"):
        record_from_event(cell, config, {"event": "start", "cell_id": cell.cell_id})


def test_allreduce_sweep_csv_is_written_with_results_csv(tmp_path):
    config = load_config("cpu-smoke", ["matrix.scaling=strong",
                                       "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1,2"])
    one, two = expand(config)
    sweep = [{"size_bytes": 4096, "dtype": "float32", "time_us": 50.0, "algbw_gbps": 0.08192,
              "busbw_gbps": 0.08192},
             {"size_bytes": 8192, "dtype": "float32", "time_us": 64.0, "algbw_gbps": 0.128,
              "busbw_gbps": None}]
    append_record(tmp_path, make_record(one, config, "ok", measured={"allreduce_sweep": sweep}))
    append_record(tmp_path, make_record(two, config, "failed", "boom"))  # no measurement, no sweep lines
    with open(tmp_path / SWEEP_FILE, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == SWEEP_COLUMNS
        lines = list(reader)
    assert [(r["cell_id"], r["world_size"], r["backend"], r["dtype"], r["size_bytes"], r["time_us"])
            for r in lines] == [(one.cell_id, "2", "gloo", "float32", "4096", "50.0"),
                                (one.cell_id, "2", "gloo", "float32", "8192", "64.0")]
    assert lines[1]["busbw_gbps"] == "" and (tmp_path / "results.csv").is_file()
    assert not list(tmp_path.glob("*.tmp"))


def test_a_raced_out_row_of_several_launches_leaves_out_one_launchs_figures(tmp_path):
    # Issue 45: with run.launches=2 a cell measured in launch 1 and eliminated in launch 2 read launch 2's
    # p50 (a faster launch for every cell) beside the survivors' figures over both: it looked the fastest.
    config = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.engine=torch,overlap",
                                       "matrix.world_size=1", "matrix.grad_accum=1", "run.launches=2"])
    torch_cell, overlap = expand(config)
    records = LaunchRecords(tmp_path, config)

    def row(p50):
        return {"step_time_ms_p50": p50, "samples_per_s": 8 / p50 * 1000, "n_timed_steps": 3,
                "step_times_ms": [p50] * 3}

    race = {"race_against": torch_cell.cell_id, "race_slowdown": 1.1, "race_round": 3}
    for cell, second in ((torch_cell, ("ok", None, row(0.9))),
                         (overlap, ("raced_out", "raced out after 3 rounds", row(0.8) | race))):
        records.outcome(cell, 0, PASSES, "ok", None, row(2.0))
        records.outcome(cell, 1, REPEAT_PASSES, *second)
    rows = {r["cell_id"]: r for r in csv.DictReader((tmp_path / "results.csv").open())}
    survivor, out = rows[torch_cell.cell_id], rows[overlap.cell_id]
    assert float(survivor["step_time_ms_p50"]) > 0.9 and survivor["launches"] == "2"
    assert out["status"] == "raced_out" and out["race_slowdown"] == "1.1" and out["race_round"] == "3"
    assert all(out[c] == "" for c in ROUND_FIGURES)  # not 0.8 ms, 10,000 samples/s
    record = read_records(tmp_path)[-1]
    assert [e["row"]["step_time_ms_p50"] for e in record["launch_rows"]] == [2.0, 0.8]  # each launch's kept
    # the report's table says the same, for a folder written before rows left them out too
    run = load_run(tmp_path)
    assert run_ledger.raced_out(run.results)["step_time_ms_p50"].isna().all()
    old = run.results.assign(step_time_ms_p50=0.8)
    assert run_ledger.raced_out(old)["step_time_ms_p50"].isna().all()
    # one launch: the row's rounds are the cell's only launch, kept as before
    one = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.engine=overlap", "matrix.world_size=1",
                                    "matrix.grad_accum=1", "run.launches=1"])
    assert make_record(overlap, one, "raced_out", "why", row(0.8) | race)["step_time_ms_p50"] == 0.8
