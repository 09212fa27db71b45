"""bench.run.launch pieces without torchrun: the events tail, killing a launch's process groups, summaries."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.lifetime import descendants, kill_groups
from bench.run.launch_log import tail
from bench.run.progress import summary_line
from bench.worker.events import EventReader

# A parent in its own session that starts a child in another session (as torchrun starts its workers),
# prints the child's pid, then both sleep.
TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_event_reader_returns_complete_lines_only(tmp_path):
    path = tmp_path / "events.jsonl"
    reader = EventReader(path)
    assert reader.read() == []
    with open(path, "a") as f:
        f.write(json.dumps({"event": "start", "cell_id": "a"}) + "\n" + '{"event": "fin')
    assert reader.read() == [{"event": "start", "cell_id": "a"}]
    with open(path, "a") as f:
        f.write('ish", "cell_id": "a"}\n')
    assert reader.read() == [{"event": "finish", "cell_id": "a"}]
    assert reader.read() == []


def test_kill_groups_stops_children_in_their_own_sessions():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    assert child in descendants(proc.pid)
    t0 = time.perf_counter()
    kill_groups(proc, set())
    assert time.perf_counter() - t0 < 10
    deadline = time.time() + 5
    while time.time() < deadline and _alive(child):
        time.sleep(0.05)
    assert proc.returncode is not None and not _alive(child)
    proc.stdout.close()


def test_tail_and_summary_line(tmp_path):
    log = tmp_path / "x.err"
    log.write_text("\n".join(f"line {i}" for i in range(30)) + "\n")
    assert tail(log, 3) == "line 27\nline 28\nline 29"
    assert tail(tmp_path / "missing") == ""
    ok = {"status": "ok", "cell_id": "c", "step_time_ms_p50": 1.5, "step_time_ms_p90": 2.0,
          "samples_per_s": 10.0, "exposed_comm_ms": None, "error": None}
    assert "step p50 1.50 ms" in summary_line(ok) and "exposed comm - ms" in summary_line(ok)
    one = ok | {"world_size": 1, "exposed_comm_ms": 5.53}  # one rank communicates nothing
    assert "sync overhead (1 rank) 5.53 ms" in summary_line(one) and "exposed comm" not in summary_line(one)
    failed = ok | {"status": "failed", "error": "Traceback...\nRuntimeError: boom"}
    assert summary_line(failed).endswith("(RuntimeError: boom)")


def _launch_with_a_profile_error(tmp_path, error: str):
    """A launch whose events say rank 1's profiled pass of its cell failed with `error`, a trace file of
    that cell already cut short on disk (what a full disk leaves)."""
    import os

    from bench.config import load_config
    from bench.matrix import expand
    from bench.run.launch import Launch
    from bench.run.progress import Progress
    from bench.run.sweep import Sweep

    config = load_config("cpu-smoke", ["matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1",
                                       "matrix.scaling=strong", "run.launches=1"])
    (cell,) = expand(config)
    sweep = Sweep(config, tmp_path, Progress(total=1, stream=open(os.devnull, "w")))
    launch = Launch(sweep, 2, [cell], [], 0)
    cut = tmp_path / "traces" / cell.cell_id / "rank1.1.pt.trace.json.gz"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(b"\x1f\x8b\x08")
    event = {"event": "error", "cell_ids": [cell.cell_id], "rank": 1, "status": "failed", "phase": "profile",
             "error": f"{error}\n…\n  File \"profiler.py\", line 1, in save", "t": time.time()}
    launch.reader.path.write_text(json.dumps(event) + "\n")
    return launch, cell, cut


def test_a_full_disk_in_a_profiled_pass_stops_the_sweep_and_leaves_no_cut_trace(tmp_path):
    # Issue 45: on a full tmpfs `bench run` said "done ... 8 ok" after a 60 s hang, a corrupt .gz left behind
    import errno

    import pytest

    launch, cell, cut = _launch_with_a_profile_error(tmp_path, "OSError: [Errno 28] No space left on device")
    with pytest.raises(OSError) as raised:
        launch.follow_events()
    assert raised.value.errno == errno.ENOSPC and cell.cell_id in raised.value.filename
    assert not cut.exists()


def test_another_profiled_pass_failure_keeps_the_row_and_says_so(tmp_path):
    launch, cell, cut = _launch_with_a_profile_error(tmp_path, "RuntimeError: the profiler broke")
    launch.follow_events()  # not a reason to stop the sweep: the cell's row is measured and kept
    assert launch.profile_errors == {cell.cell_id: "RuntimeError: the profiler broke"} and not cut.exists()


def test_a_launch_log_on_a_full_disk_drains_its_pipe_without_a_thread_traceback(tmp_path, monkeypatch):
    # Issue 45: the log thread's open() failed (ENOSPC) and printed a thread traceback before the
    # launcher's one-line error. A folder that does not exist fails open() the same way.
    import os
    import threading

    from bench.run.launch_log import CappedLog

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    read, write = os.pipe()
    with open(read, "rb") as pipe:
        log = CappedLog(pipe, tmp_path / "missing" / "launch-0.err")
        os.write(write, b"x" * 1000)
        os.close(write)
        log.join(timeout=30)
    assert not log.is_alive() and raised == []
