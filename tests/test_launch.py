"""bench.run.launch pieces without torchrun: the events tail, killing a launch's process groups, summaries."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.lifetime import descendants, kill_groups
from bench.run.launch import summary_line, tail
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
