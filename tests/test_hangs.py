"""A hung launch leaves what each rank was doing in the run folder and names it in the `timeout` row
(bench/worker/hangs.py), and `bench analyze` reads it (hangs.read): the real CLI, gloo on CPU.
Rank 1 hung by debug.fault=hang inside its first timed step while rank 0 waits for it (the watchdog's
stacks), or skipping that step's gradient all-reduce (debug.fault=skip: the process group's timeout)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time

import pandas as pd
import pytest
from test_runner import REPO, assert_no_orphans, read_csv, run_bench

from bench.worker import hangs
from bench.worker.hangs import DUMP_WAIT_S


@pytest.mark.timeout(120)
def test_a_hung_rank_is_named_by_its_stack_in_the_timeout_row(tmp_path):
    out = tmp_path / "run"
    t0 = time.time()
    proc = run_bench(out, "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1",
                     "run.cell_timeout_s=3", "run.startup_timeout_s=5", "profile.enabled=false",
                     # above the watchdog's limit: the watchdog, not the rank's collective, ends the hang
                     "run.pg_timeout_s=60", "debug.fault=hang@-ga1-")
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


@pytest.mark.timeout(120)
def test_a_skipped_collective_is_named_by_the_process_group_timeout_and_read_by_analyze(tmp_path):
    # rank 1 runs its first timed step's backward without the gradient all-reduce: its later collectives pair
    # with rank 0's one apart (gloo matches them by sequence number), until rank 1 waits in the round's
    # barrier and rank 0 in a gradient all-reduce nobody joins. run.pg_timeout_s "auto" = 0.75 × 8 = 6 s,
    # below the watchdog (8 s + the first cell's 20 s): the ranks raise first and say where they were.
    out = tmp_path / "run"
    proc = run_bench(out, "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1",
                     "matrix.scaling=strong", "run.cell_timeout_s=8", "run.startup_timeout_s=20",
                     "profile.enabled=false", "debug.fault=skip@-ga1-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, (row,) = read_csv(out)
    assert row["status"] == "timeout", row
    assert " stuck in " in row["error"] and "run.pg_timeout_s=6s" in row["error"], row["error"]
    assert "cell_timeout_s" not in row["error"]  # the watchdog did not have to kill it
    done = subprocess.run([sys.executable, "-m", "bench", "analyze", str(out)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    said = done.stdout
    hung = read_csv_frame(out / hangs.HANGS_FILE)
    assert set(hung["rank"]) == {0, 1}, hung
    by_rank = hung.set_index("rank")
    assert by_rank.loc[1, "collective"] == "barrier"  # rank 1's round barrier, its seq one behind rank 0's
    assert by_rank.loc[0, "collective"] == "a gradient collective (backward)"
    assert by_rank.loc[0, "seq"] == by_rank.loc[1, "seq"] + 1, hung
    # which rank's timeout fires first is a race: the other one's collective then loses its peer (gloo:
    # "Connection closed by peer") and records no `since` of its own (hangs.record_lost_peer)
    assert by_rank["since"].notna().any(), hung
    for rank in (0, 1):
        r = by_rank.loc[rank]
        since = f" since {r['since_utc']}" if pd.notna(r["since"]) else " ("
        assert f"rank {rank} stuck in {r['collective']} #{r['seq']}{since}" in said, said
    assert "launch 0: the ranks wait in different collectives" in said and "collective mismatch" in said
    # the row is recorded within seconds of the timeout: the collective began `since`, raised 6 s later
    recorded = (out / "cells.jsonl").stat().st_mtime
    late = recorded - (by_rank["since"].max() + 6)
    assert 0 <= late <= 8, late  # GRACE_S (3 s) for the peer's word, then the launch ends
    print(f"row recorded {late:.2f} s after the process group's timeout")
    assert_no_orphans(out)


def read_csv_frame(path):
    import pandas as pd

    return pd.read_csv(path, dtype={"cell_id": str})


def test_analyze_reads_nccls_flight_recorder_and_the_ranks_records(tmp_path):
    # hand-made: rank 0's recorder (torch's dump format) has all-reduce #4 completed and #5 only scheduled;
    # rank 1 wrote its own record (gloo's path) of a barrier #4. The recorder's first open entry wins for
    # rank 0; the two ranks disagree, so the launch is a mismatch.
    folder = tmp_path / "hangs" / "launch-2"
    folder.mkdir(parents=True)
    entries = [{"collective_seq_id": 5, "profiling_name": "nccl:all_reduce", "time_created_ns": 1.7e18 + 5e9,
                "state": "scheduled"},
               {"collective_seq_id": 4, "profiling_name": "nccl:all_reduce", "time_created_ns": 1.7e18,
                "state": "completed"}]
    (folder / "nccl-trace-rank-0").write_bytes(pickle.dumps({"version": "2.4", "pg_config": {},
                                                             "entries": entries}))
    (folder / "rank-1.json").write_text(json.dumps({"rank": 1, "cell_id": "c", "collective": "barrier",
                                                    "seq": 4, "since": 1.7e9 + 4}))
    hung = hangs.read(tmp_path)
    assert hung[["launch", "rank", "collective", "seq"]].values.tolist() == [[2, 0, "all_reduce", 5],
                                                                             [2, 1, "barrier", 4]]
    assert hung.loc[0, "since"] == pytest.approx(1.7e9 + 5)
    assert hung.loc[0, "source"] == "NCCL flight recorder"
    said = hangs.lines(hung)
    assert said[0] == ("rank 0 stuck in all_reduce #5 since 2023-11-14 22:13:25.000 UTC (launch 2; NCCL "
                       "flight recorder)")
    assert said[1].startswith("rank 1 stuck in barrier #4 since 2023-11-14 22:13:24.000 UTC (launch 2, "
                              "cell c")
    assert "rank 0: all_reduce #5, rank 1: barrier #4): a collective mismatch" in said[2]
    # every entry completed: nothing stuck; a pickle naming a class is refused, never loaded
    (folder / "nccl-trace-rank-0").write_bytes(pickle.dumps({"entries": entries[1:]}))
    assert hangs.read(tmp_path)["rank"].tolist() == [1]
    classy = pickle.dumps({"entries": [], "x": __import__("datetime").timedelta(1)})
    (folder / "nccl-trace-rank-0").write_bytes(classy)
    assert hangs.flight_recorder_stuck(folder / "nccl-trace-rank-0") is None


def test_which_errors_are_a_collective_timeout_and_what_they_name():
    gloo = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 4500ms for recv "
                        "operation to complete")
    closed = RuntimeError("Application timeout caused pair closure")  # DDP's second bucket, same timeout
    nccl = RuntimeError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, "
                        "OpType=ALLREDUCE, NumelIn=1000, NumelOut=1000, Timeout(ms)=450000) ran for 450012 "
                        "milliseconds before timing out.")
    assert all(hangs.timed_out(e) for e in (gloo, closed, nccl))
    assert not hangs.timed_out(RuntimeError("Connection reset by peer"))
    assert not hangs.timed_out(RuntimeError("CUDA out of memory"))
    assert hangs.collective_of(nccl) == ("allreduce", 8)  # NCCL's Work names both


def test_a_rank_whose_peer_timed_out_first_is_a_timeout_too(tmp_path, monkeypatch):
    # rank 0's all-reduce timed out 0.1 s ago and closed the pair: rank 1's barrier raises gloo's "Connection
    # closed by peer". Its cell is `timeout`, its record names its own collective with no `since` (it did not
    # wait a timeout of its own); a closure with no recent peer record (a crash) stays `failed`
    from bench.worker import guard

    monkeypatch.setenv(hangs.DIR_ENV, str(tmp_path))
    said = []
    monkeypatch.setattr(hangs, "_state", {})
    hangs.arm(1, 6.0, lambda **event: said.append(event))
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20613. "
                          "This is typically caused by a remote worker crashing.")
    assert hangs.peer_timed_out(closed, wait_s=0.1) is None
    peer = {"rank": 0, "collective": "a gradient collective (backward)", "seq": 7, "since": time.time() - 6.1,
            "raised": time.time() - 0.1}
    (tmp_path / "rank-0.json").write_text(json.dumps(peer))
    status, text = guard.failure(closed, "cell-a")
    assert status == "timeout", text
    assert text.startswith("rank 1 stuck in ")
    theirs = "its peer rank 0 left it when its own collective (a gradient collective (backward) #7) outlived"
    assert theirs in text
    assert "run.pg_timeout_s=6s" in text
    mine = json.loads((tmp_path / "rank-1.json").read_text())
    assert mine["since"] is None and mine["cell_id"] == "cell-a" and said[-1]["event"] == "stuck"
    # a peer record from long ago (an earlier cell's) is not this one's
    peer["raised"] = time.time() - 60
    (tmp_path / "rank-0.json").write_text(json.dumps(peer))
    assert hangs.peer_timed_out(closed, wait_s=0.1) is None
    assert hangs.peer_timed_out(RuntimeError("something else"), wait_s=0.1) is None
