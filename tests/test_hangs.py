"""A hung launch leaves what each rank was doing in the run folder and names it in the `timeout` row
(bench/worker/hangs.py): the real CLI, gloo on CPU, rank 1 hung by debug.fault=hang inside its first timed
step while rank 0 waits for it in the step's collective."""

from __future__ import annotations

import json
import time

import pytest
from test_runner import assert_no_orphans, read_csv, run_bench

from bench.worker.hangs import DUMP_WAIT_S


@pytest.mark.timeout(120)
def test_a_hung_rank_is_named_by_its_stack_in_the_timeout_row(tmp_path):
    out = tmp_path / "run"
    t0 = time.time()
    proc = run_bench(out, "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1",
                     "run.cell_timeout_s=3", "run.startup_timeout_s=5", "profile.enabled=false",
                     "debug.fault=hang@-ga1-")
    wall = time.time() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, (row,) = read_csv(out)
    assert row["status"] == "timeout", row
    error = row["error"]
    assert "cell_timeout_s=3s + run.startup_timeout_s=5s" in error, error
    assert "rank 1 in inject_fault (trainer.py:" in error, error
    assert "rank 0 in " in error and "every rank's stack: hangs/launch-0/" in error, error
    for rank in (0, 1):
        stack = (out / "hangs" / "launch-0" / f"rank-{rank}.stack").read_text()
        assert "Current thread" in stack and "bench/worker/main.py" in stack
    # the stacks cost at most DUMP_WAIT_S beyond the kill, which comes 3 + 5 s (the first cell's limit)
    # after the last event
    events = (out / "logs" / "launch-0.events.jsonl").read_text().splitlines()
    last_heard = max(json.loads(line)["t"] for line in events)
    recorded = (out / "cells.jsonl").stat().st_mtime
    assert recorded - last_heard <= 3 + 5 + DUMP_WAIT_S + 2, (recorded - last_heard, wall)
    print(f"hang to row: {recorded - last_heard:.2f} s after the last event; run wall {wall:.1f} s")
    assert_no_orphans(out)
