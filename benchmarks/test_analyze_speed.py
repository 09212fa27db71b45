"""Benchmark: `bench analyze` on a trace of more than 100 MB, wall time and peak memory.

The trace is the public A100 trace (tests/data/traces/hta/) replicated five times, each copy shifted in
time with its ProfilerStep numbers and correlation ids renumbered: 545,615 real events, 155 MB of JSON,
written to a temporary folder (never committed) as `.json` and as `.json.gz`. Each is analysed by
`python -m bench analyze` in a child process; its wall time and peak resident memory (wait4's rusage of
that child alone) are printed. The trace is built in another child, so that the analysing one does not
start as a fork of a process holding the big event list. Run with `make microbench` (not part of
`make test`); it prints, it does not judge.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "traces" / "hta" / "a100-8rank-rank3" / "rank3.json.gz"
COPIES = 5


def build_big_trace(folder: Path) -> Path:
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc.pop("traceEvents")
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    width = max(times) - min(times) + 1000
    big = []
    for k in range(COPIES):
        for e in events:
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += k * width
            if e.get("name", "").startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 100 * k}"
            if "correlation" in (e.get("args") or {}):
                e["args"] = {**e["args"], "correlation": e["args"]["correlation"] + k * 10_000_000}
            big.append(e)
    path = folder / "rank0.big.json"
    path.write_text(json.dumps({**doc, "traceEvents": big}))
    (folder / "rank0.big.json.gz").write_bytes(gzip.compress(path.read_bytes(), 6))
    return path


def run_child(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process, from its own rusage."""
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, args
    return time.perf_counter() - t0, usage.ru_maxrss / 1024  # Linux: KiB


def test_analyze_big_trace(tmp_path):
    run_child(["-c", f"from benchmarks.test_analyze_speed import build_big_trace as b; "
                     f"from pathlib import Path; b(Path({str(tmp_path)!r}))"])
    big = tmp_path / "rank0.big.json"
    print()
    for path in (big, big.with_name(big.name + ".gz")):
        wall, peak = run_child(["-m", "bench", "analyze", str(path), "--out", str(tmp_path / "out")])
        print(f"bench analyze {path.name}: {path.stat().st_size / 1e6:.1f} MB file "
              f"({big.stat().st_size / 1e6:.0f} MB of JSON), {wall:.1f} s wall, {peak:.0f} MB peak RSS")
        assert (tmp_path / "out" / "trace_summary.csv").is_file()
