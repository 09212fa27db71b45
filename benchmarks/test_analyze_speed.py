"""Benchmark: `bench analyze` beside HolisticTraceAnalysis on the same files, wall time and peak memory.

Files: the public V100 trace of 3 MB (tests/data/traces/hta/v100-2rank-many-kernels, 216k events), and a
trace of more than 100 MB made from real events: the public A100 trace (tests/data/traces/hta/
a100-8rank-rank3) replicated five times, each copy shifted in time past the previous one, its
ProfilerStep numbers and correlation ids renumbered (545,615 events, 155 MB of JSON), written to a
temporary folder (never committed) as `.json` and as `.json.gz`, each alone in its own folder (HTA reads a
folder and takes each file as a rank).

Each tool runs in a child process of its own, so each peak resident memory (wait4's rusage of that child
alone, ru_maxrss) is that tool's: `python -m bench analyze FOLDER --out DIR` (every output file), and
HTA 0.5 with its default parser, `TraceAnalysis(trace_dir=FOLDER, include_last_profiler_step=True)` then
get_temporal_breakdown, get_comm_comp_overlap and get_gpu_kernel_breakdown(include_memory_kernels=True):
the figures bench analyze's breakdown reproduces (tests/test_analyze_real.py). HTA is skipped where it is
not installed. The big trace is built in another child, so that no measured child starts as a fork of a
process holding the big event list. Run with `make microbench` (not part of `make test`); it prints, it
does not judge.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTA_DATA = ROOT / "tests" / "data" / "traces" / "hta"
SOURCE = HTA_DATA / "a100-8rank-rank3" / "rank3.json.gz"
SMALL = HTA_DATA / "v100-2rank-many-kernels"
COPIES = 5

HTA_SCRIPT = """
import sys, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
ta.get_temporal_breakdown(visualize=False)
ta.get_comm_comp_overlap(visualize=False)
ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
"""


def build_big_trace(folder: Path) -> Path:
    """folder/json/rank3.json (155 MB) and folder/gz/rank3.json.gz; returns the first."""
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
    (folder / "json").mkdir(parents=True)
    (folder / "gz").mkdir()
    path = folder / "json" / "rank3.json"
    path.write_text(json.dumps({**doc, "traceEvents": big}))
    (folder / "gz" / "rank3.json.gz").write_bytes(gzip.compress(path.read_bytes(), 6))
    return path


def run_child(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process, from its own rusage."""
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, args
    return time.perf_counter() - t0, usage.ru_maxrss / 1024  # Linux: KiB


def test_analyze_beside_hta(tmp_path):
    run_child(["-c", f"from benchmarks.test_analyze_speed import build_big_trace as b; "
                     f"from pathlib import Path; b(Path({str(tmp_path)!r}))"])
    has_hta = importlib.util.find_spec("hta") is not None
    print(f"\n{'file':<34} {'tool':<14} {'wall s':>7} {'peak MB':>8}")
    for folder in (SMALL, tmp_path / "json", tmp_path / "gz"):
        (trace,) = [p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz"))]
        name = f"{trace.name} ({trace.stat().st_size / 1e6:.1f} MB)"
        ours = run_child(["-m", "bench", "analyze", str(folder), "--out", str(tmp_path / "out")])
        assert (tmp_path / "out" / "trace_summary.csv").is_file()
        print(f"{name:<34} {'bench analyze':<14} {ours[0]:>7.1f} {ours[1]:>8.0f}")
        if not has_hta:
            print(f"{name:<34} {'HTA':<14} {'skipped: hta not installed':>16}")
            continue
        ref = run_child(["-c", HTA_SCRIPT, str(folder)])
        print(f"{name:<34} {'HTA':<14} {ref[0]:>7.1f} {ref[1]:>8.0f}")
        print(f"{'':<34} {'HTA / ours':<14} {ref[0] / ours[0]:>6.1f}× {ref[1] / ours[1]:>7.1f}×")
