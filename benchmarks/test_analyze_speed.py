"""Benchmark: `bench analyze` beside HolisticTraceAnalysis on the same files, wall time and peak memory; and
`bench analyze` alone on a 64-rank job.

Files: the public V100 trace of 3 MB (tests/data/traces/hta/v100-2rank-many-kernels, 216k events), and a
trace of more than 100 MB made from real events: the public A100 trace (tests/data/traces/hta/
a100-8rank-rank3) replicated eight times, each copy shifted in time past the previous one, its
ProfilerStep numbers and correlation ids renumbered (872,984 events, 248 MB of JSON), written to a
temporary folder (never committed) as `.json` and as `.json.gz`, each alone in its own folder (HTA reads a
folder and takes each file as a rank).

The job: the same A100 trace as ranks 0-63 of a 64-rank job (`distributedInfo.rank`, `world_size` 64), eight
hosts of eight ranks (`host_name` node0-node7), each host's clock shifted by its own offset (host k: +k·1.7 s
and a few µs): 64 `.json.gz` files, 31 MB of JSON each. Every rank recorded the same events, so once the
clocks are aligned no rank waits for another: `bench analyze` must find the injected offsets (to 1 µs) from
the collectives' ends and every wait 0 — a check of the alignment at scale besides the time and memory.
Its peak memory is that of the whole process tree (the analysing processes and their workers): the sum of
their proportional set sizes (/proc/<pid>/smaps_rollup `Pss`, which counts a page shared by the forked
workers once), sampled every 50 ms.

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

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
HTA_DATA = ROOT / "tests" / "data" / "traces" / "hta"
SOURCE = HTA_DATA / "a100-8rank-rank3" / "rank3.json.gz"
SMALL = HTA_DATA / "v100-2rank-many-kernels"
COPIES = 8
JOB_RANKS, RANKS_PER_HOST = 64, 8
HOST_SHIFT_US = 1.7e6 + 3.25  # host k's clock runs k × this ahead (a fraction of a µs to catch rounding)

HTA_SCRIPT = """
import sys, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
ta.get_temporal_breakdown(visualize=False).to_csv(sys.argv[2], index=False)
ta.get_comm_comp_overlap(visualize=False)
ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
"""
# bench analyze's `all` row beside HTA's temporal breakdown (tests/test_analyze_real.py's pairs), in µs
SAME_FIGURES = {"span_ms": "kernel_time(us)", "compute_ms": "compute_time(us)", "idle_ms": "idle_time(us)"}


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


def build_job(folder: Path) -> None:
    """folder/rank<r>.json.gz for the 64 ranks of the synthesised job (see the module docstring)."""
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc.pop("traceEvents")
    folder.mkdir(parents=True)
    for rank in range(JOB_RANKS):
        host = rank // RANKS_PER_HOST
        shift = host * HOST_SHIFT_US
        moved = [{**e, "ts": e["ts"] + shift} if isinstance(e.get("ts"), (int, float)) else e for e in events]
        meta = {**doc, "host_name": f"node{host}",
                "distributedInfo": {**doc["distributedInfo"], "rank": rank, "world_size": JOB_RANKS}}
        (folder / f"rank{rank}.json.gz").write_bytes(
            gzip.compress(json.dumps({**meta, "traceEvents": moved}).encode(), 6))


def pss_mb(root: int) -> float:
    """Σ Pss (MB) of process `root` and its descendants, now."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in (Path("/proc") / str(pid) / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += float(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def run_tree(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak Σ Pss MB over the process tree) of one child process and its workers."""
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    peak = 0.0
    while child.poll() is None:
        peak = max(peak, pss_mb(child.pid))
        time.sleep(0.05)
    assert child.returncode == 0, args
    return time.perf_counter() - t0, peak


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
        ref = run_child(["-c", HTA_SCRIPT, str(folder), str(tmp_path / "hta.csv")])
        print(f"{name:<34} {'HTA':<14} {ref[0]:>7.1f} {ref[1]:>8.0f}")
        print(f"{'':<34} {'HTA / ours':<14} {ref[0] / ours[0]:>6.1f}× {ref[1] / ours[1]:>7.1f}×")
        mine = pd.read_csv(tmp_path / "out" / "trace_summary.csv").query("step == 'all'").iloc[0]
        theirs = pd.read_csv(tmp_path / "hta.csv").iloc[0]
        gaps = [abs(mine[m] * 1e3 - theirs[h]) for m, h in SAME_FIGURES.items()]
        print(f"{'':<34} {'same figures':<14} span, compute, idle within {max(gaps):.1f} µs of HTA's")


def test_analyze_a_64_rank_job(tmp_path):
    run_child(["-c", f"from benchmarks.test_analyze_speed import build_job as b; "
                     f"from pathlib import Path; b(Path({str(tmp_path / 'job')!r}))"])
    size = sum(p.stat().st_size for p in (tmp_path / "job").iterdir()) / 1e6
    print(f"\n{JOB_RANKS} ranks, {size:.0f} MB of .json.gz ({os.cpu_count()} CPUs)")
    print(f"{'workers':<22} {'wall s':>7} {'peak MB (Σ Pss)':>16}")
    for workers in ("default", "1"):
        out = tmp_path / f"out-{workers}"
        extra = [] if workers == "default" else ["--workers", workers]
        wall, peak = run_tree(["-m", "bench", "analyze", str(tmp_path / "job"), "--out", str(out), *extra])
        print(f"{workers:<22} {wall:>7.1f} {peak:>16.0f}")
    waits = pd.read_csv(tmp_path / "out-default" / "collective_wait.csv")
    offsets = waits.groupby("rank")["clock_offset_ms"].first()
    injected = pd.Series([(r // RANKS_PER_HOST) * HOST_SHIFT_US / 1e3 for r in offsets.index], offsets.index)
    error_us = (offsets - injected).abs().max() * 1e3
    print(f"collective_wait.csv: {len(waits)} rows; largest offset error {error_us:.3f} µs; "
          f"largest wait {waits['wait_ms'].max():.6f} ms")
