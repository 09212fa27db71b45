"""bench.results: one function turns a worker's event into a record; status travels in the event only."""

from __future__ import annotations

import pytest

from bench.config import load_config
from bench.matrix import expand
from bench.results import record_from_event
from bench.schema import RESULT_COLUMNS


def test_record_of_a_diverged_cell_keeps_its_numbers():
    config = load_config("cpu-smoke", ["matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1"])
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
    config = load_config("cpu-smoke", ["matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1"])
    (cell,) = expand(config)
    event = {"event": "error", "cell_id": cell.cell_id, "rank": 1, "status": "oom", "error": "OutOfMemory"}
    record = record_from_event(cell, config, event)
    assert (record["status"], record["error"], record["step_time_ms_p50"]) == ("oom", "OutOfMemory", None)
    with pytest.raises(ValueError, match="no outcome"):
        record_from_event(cell, config, {"event": "start", "cell_id": cell.cell_id})
