"""`bench tensorboard`: the torch-tb-profiler plugin lists every cell as a run and every rank as a worker.

The live test starts the real command on a loopback port against traces made as the suite makes them, asks
the plugin's HTTP API (torch_tb_profiler/plugin.py: /runs, /workers?run=&view=) and kills the whole
process group (the plugin spawns a multiprocessing Manager), leaving nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest
from report_fixtures import write_run, write_traces

from bench.__main__ import main as bench_main
from bench.report import tensorboard

CELLS = ["torch-mlp-tiny-ws2", "overlap-mlp-tiny-ws2"]
API = "data/plugin/pytorch_profiler"
DEADLINE_S = 60


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _wait_for_url(proc: subprocess.Popen, deadline: float) -> str:
    """The address the command prints; read on a thread so a silent process cannot hang the test."""
    found: list[str] = []

    def read():
        for line in proc.stdout:
            if "http://" in line:
                found.append(line.split("http://", 1)[1].split("#")[0].strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=max(0.0, deadline - time.monotonic()))
    assert found, f"no address printed; exit code {proc.poll()}"
    return "http://" + found[0]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (leader and the plugin's Manager), SIGKILL after 10 s, check it is gone."""
    pgid = proc.pid  # start_new_session=True: the group id is the leader's pid
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=5)
    end = time.monotonic() + 5
    while _group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        pytest.fail(f"process group {pgid} outlived its leader")


def test_plugin_is_installed_and_registered():
    assert tensorboard.plugin_installed(), "torch-tb-profiler's tensorboard_plugins entry point is missing"


def test_missing_traces_is_a_clear_error(tmp_path, capsys):
    run = write_run(tmp_path / "run", [])
    assert bench_main(["tensorboard", str(run)]) == 2
    assert "no traces folder" in capsys.readouterr().err
    (run / "traces").mkdir()
    assert bench_main(["tensorboard", str(run)]) == 2
    assert "no *.pt.trace.json* files" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_tensorboard_lists_cells_as_runs_and_ranks_as_workers(tmp_path):
    run = write_run(tmp_path / "run", [])
    write_traces(run / "traces", CELLS, ranks=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "tensorboard", str(run), "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        base = _wait_for_url(proc, deadline)
        assert base.startswith("http://127.0.0.1:")
        runs: dict = {"runs": [], "loading": True}
        while time.monotonic() < deadline and (runs["loading"] or sorted(runs["runs"]) != sorted(CELLS)):
            try:
                runs = _get(f"{base}{API}/runs")
            except OSError:  # the server thread may not accept yet, or the plugin is still loading
                pass
            time.sleep(0.3)
        assert sorted(runs["runs"]) == sorted(CELLS), runs
        for cell in CELLS:
            query = urllib.parse.urlencode({"run": cell, "view": "Overview"})
            assert _get(f"{base}{API}/workers?{query}") == ["rank0", "rank1"]
            assert "Trace" in _get(f"{base}{API}/views?{urllib.parse.urlencode({'run': cell})}")
    finally:
        _stop(proc)
    assert proc.poll() is not None
