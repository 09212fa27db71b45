"""bench analyze on hand-built traces, each expected value worked out by hand (analyze_fixtures.py)."""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analyze_fixtures import (
    COMM_STREAM,
    CPU_META,
    GPU,
    GPU_META,
    STREAM,
    cpu_events,
    gpu_events,
    kernel,
    runtime,
    write_trace,
    x,
)

from bench.analyze import classify as C
from bench.analyze import cli
from bench.analyze import intervals as iv
from bench.analyze.columns import BUCKET_TIMELINE_COLUMNS, TRACE_SUMMARY_COLUMNS
from bench.analyze.summary import TraceJob, analyse, analyse_tables, analyse_trace
from bench.lifetime import alive


def rows_by_step(path, **kw):
    summary, timeline = analyse_trace(TraceJob(path, path.name, **kw))
    return {r["step"]: r for r in summary}, timeline


def approx(value):
    return pytest.approx(value, rel=1e-9, abs=1e-12)


# ---- intervals ------------------------------------------------------------------------------------------

def test_interval_union_intersect_subtract_clip():
    # [0,3] and [2,4] merge; the empty [20,20] is dropped
    a = iv.union(np.array([0.0, 5, 2, 20]), np.array([3.0, 8, 4, 20]))
    assert a.tolist() == [[0, 4], [5, 8]]
    b = iv.union(np.array([3.0, 7]), np.array([6.0, 10]))                # [3,6], [7,10]
    assert iv.intersect(a, b).tolist() == [[3, 4], [5, 6], [7, 8]]
    assert iv.subtract(a, b).tolist() == [[0, 3], [6, 7]]
    assert iv.clip(a, 1, 6).tolist() == [[1, 4], [5, 6]]
    assert iv.length(a) == 7
    assert iv.intersect(iv.union(np.array([0.0]), np.array([1.0])), iv.union(np.array([1.0]), np.array([2.0]))
                        ).tolist() == []  # touching is not overlapping


def test_weighted_time_caps_the_sum_of_concurrent_values():
    # [0,10) value 0.5, [5,15) value 0.75: 5×0.5 + 5×min(1.25, 1) + 5×0.75 = 2.5 + 5 + 3.75
    assert iv.weighted_time(np.array([0.0, 5]), np.array([10.0, 15]), np.array([0.5, 0.75]), 1.0) == 11.25


# ---- classes --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, cat, expected", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel", C.COMM),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", C.COMM),
    ("void ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "kernel", C.COMM),   # decorated name
    ("rcclGenericKernel<1, false>(ncclDevComm*)", "kernel", C.COMM),
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", C.MEMORY),
    ("Memset (Device)", "gpu_memset", C.MEMORY),
    ("void at::native::vectorized_elementwise_kernel<4>(int)", "kernel", C.COMPUTE),
    # HTA's OTHER: neither compute nor communication nor memory (busy time, non-compute time)
    ("Stream Sync", "cuda_sync", C.OTHER),
    ("void copy_kernel_Memcpy<float>(float*)", "kernel", C.OTHER),
    ("cudaEventSync_helper", "kernel", C.OTHER),
])
def test_gpu_kernel_classes(name, cat, expected):
    assert C.gpu_class(name, cat) == expected


# ---- GPU path -------------------------------------------------------------------------------------------

def test_gpu_step_breakdown_by_hand(tmp_path):
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json.gz", gpu_events(), GPU_META))
    s1 = rows["1"]
    assert s1["device"] == "cuda" and s1["rank"] == 3
    # GPU events launched in step 1: C[10,40] N[30,60] C[50,70] M[80,90]
    assert s1["span_ms"] == approx(80e-3)              # 10 → 90
    assert s1["busy_ms"] == approx(70e-3)              # [10,70] + [80,90]
    assert s1["compute_ms"] == approx(50e-3)           # 30 + 20
    assert s1["comm_ms"] == approx(30e-3)
    assert s1["memory_ms"] == approx(10e-3)
    assert s1["idle_ms"] == approx(10e-3)              # 80 − 70
    assert s1["overlap_ms"] == approx(20e-3)           # [30,40] + [50,60]
    assert s1["overlap_pct"] == approx(100 * 20 / 30)
    assert s1["exposed_comm_ms"] == approx(10e-3)
    assert s1["allreduce_ms"] == approx(30e-3)
    assert s1["allreduce_share_of_kernel_pct"] == approx(100 * 30 / 80)  # kernel durations 30+30+20
    # host window [0,100]: kernels' union [10,70] = 60
    assert s1["gpu_util_pct"] == approx(60)
    # blocks/SM 0.5 on [10,30), 0.75 on [30,40), 0.25 on [40,50), ≥1 on [50,70): 10+7.5+2.5+20 = 40
    assert s1["sm_efficiency_pct"] == approx(40)
    assert s1["achieved_occupancy_pct"] == approx((40 * 30 + 10 * 30 + 80 * 20) / 80)
    # aten::mm [5,15] less its launch [6,8] and the GPU's busy time from 10: [5,6] + [8,10]
    assert s1["cpu_exec_pct"] == approx(3)
    # record_param_comms: 1000 floats, group of 4: busbw = 4000 B × 2·3/4 / 30 µs
    assert s1["comm_bytes"] == 4000
    assert s1["comm_busbw_gbps"] == approx(4000 * 1.5 / 30e-6 / 1e9)


def test_gpu_events_belong_to_the_step_that_launched_them(tmp_path):
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", gpu_events(), GPU_META))
    s2, whole = rows["2"], rows["all"]
    assert s2["span_ms"] == approx(50e-3) and s2["compute_ms"] == approx(50e-3)  # [180,230], launched at 150
    assert s2["comm_ms"] == 0 and s2["overlap_pct"] is None
    assert s2["gpu_util_pct"] == approx(20)              # clipped to [100,200]: 20 of 100
    assert whole["span_ms"] == approx(220e-3) and whole["idle_ms"] == approx(100e-3)
    assert whole["gpu_util_pct"] == approx(100 * 80 / 200)                      # [10,70] + [180,200]


def test_kernels_launched_outside_the_trace_belong_to_no_window(tmp_path):
    # A kernel whose launch is not in the file ran for a step the profiler did not record (HTA drops it):
    # corr 99 at [2,8] has no runtime call. Every breakdown figure is as without it; the all row counts it.
    orphan = kernel("void at::native::vectorized_elementwise_kernel<4>(int)", 2, 6, 99, 1.0, 50)
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", [*gpu_events(), orphan], GPU_META))
    base, _ = rows_by_step(write_trace(tmp_path / "base.json", gpu_events(), GPU_META))
    for step in ("1", "all"):
        for column in ("span_ms", "busy_ms", "compute_ms", "idle_ms"):
            assert rows[step][column] == approx(base[step][column]), (step, column)
    assert rows["all"]["unlaunched_kernels"] == 1 and rows["all"]["unlaunched_ms"] == approx(6e-3)
    assert base["all"]["unlaunched_kernels"] == 0 and base["all"]["unlaunched_ms"] == 0
    assert "unlaunched_kernels" not in rows["1"]  # a whole-trace figure


def test_the_all_row_counts_launches_before_the_first_step_as_hta(tmp_path):
    # HTA keeps every GPU event correlated with a host event up to the last step's end, with no lower
    # bound: a kernel launched at −20 (before ProfilerStep#1 at 0) runs [−15,−5]: in `all`, in no step.
    early = [runtime(-20, 98), kernel("ampere_sgemm_128x64_nn", -15, 10, 98, 1.0, 50)]
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", [*gpu_events(), *early], GPU_META))
    assert rows["all"]["span_ms"] == approx(245e-3)          # −15 → 230
    assert rows["all"]["compute_ms"] == approx((30 + 20 + 50 + 10) * 1e-3)
    assert rows["1"]["span_ms"] == approx(80e-3)             # 10 → 90, as before


def test_ns_resolution_traces_are_rounded_inward_as_hta(tmp_path):
    # Fractional µs (Kineto's ns-resolution traces): HTA rounds each start up and each end down to whole µs
    # (pytorch/pytorch#122425). GEMM [10.4,20.6] → [11,20]: 9 µs; a 0.6 µs kernel [30.2,30.8] → no length;
    # their launches 5.2 and 25.7 → 6 and 26, inside step 1 [0,100).
    events = [
        x("ProfilerStep#1", "user_annotation", 0, 100), x("ProfilerStep#2", "user_annotation", 100, 100),
        runtime(5.2, 1), runtime(25.7, 2),
        kernel("ampere_sgemm_128x64_nn", 10.4, 10.2, 1, 1.0, 50),
        kernel("void at::native::vectorized_elementwise_kernel<4>(int)", 30.2, 0.6, 2, 1.0, 50),
    ]
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", events, GPU_META))
    assert rows["1"]["compute_ms"] == approx(9e-3) and rows["1"]["busy_ms"] == approx(9e-3)
    assert rows["1"]["span_ms"] == approx(19e-3)             # 11 → 30 (the short kernel's end, rounded down)


def test_syncs_on_a_stream_are_busy_but_not_compute(tmp_path):
    # CUPTI's Stream Sync on stream 7 [92,96] (its cudaStreamSynchronize at 91): HTA's OTHER kind, busy
    # and non-compute time. A Context Sync on no stream (tid −1) is not a GPU event.
    syncs = [runtime(91, 97, "cudaStreamSynchronize"),
             x("Stream Sync", "cuda_sync", 92, 4, pid=GPU, tid=STREAM, correlation=97, stream=STREAM),
             runtime(95, 96, "cudaDeviceSynchronize"),
             x("Context Sync", "cuda_sync", 96, 3, pid=GPU, tid=-1, correlation=96, stream=-1)]
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", [*gpu_events(), *syncs], GPU_META))
    s1 = rows["1"]
    assert s1["span_ms"] == approx(86e-3)                    # 10 → 96
    assert s1["busy_ms"] == approx(74e-3)                    # [10,70] + [80,90] + [92,96]
    assert s1["compute_ms"] == approx(50e-3) and s1["memory_ms"] == approx(10e-3)
    assert s1["gpu_util_pct"] == approx(60)                  # kernels only, as the TensorBoard plugin


def test_rocm_trace_is_rocm_and_measured_alike(tmp_path):
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", gpu_events(launch="hipLaunchKernel"), GPU_META))
    assert rows["1"]["device"] == "rocm"
    assert rows["1"]["overlap_ms"] == approx(20e-3)


def test_trace_without_cuda_events_keeps_gpu_columns_empty(tmp_path):
    events = [e for e in gpu_events() if e["cat"] not in ("kernel", "gpu_memcpy", "cuda_runtime")]
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", events, GPU_META))
    s1 = rows["1"]
    assert s1["device"] == "cuda"   # NCCL process group, no CUPTI activity
    for column in ("span_ms", "compute_ms", "comm_ms", "gpu_util_pct", "sm_efficiency_pct"):
        assert column not in s1
    assert s1["cpu_exec_pct"] == approx(100 * 14 / 100)   # [5,15] + [19,23], nothing above them


def test_gpu_bucket_timeline_by_correlation(tmp_path):
    _, timeline = rows_by_step(write_trace(tmp_path / "t.json", gpu_events(), GPU_META), engine="torch")
    assert len(timeline) == 1
    b = timeline[0]
    # backward [18,68]; c10d::allreduce_ issued at 19; its launch (corr 2) ran the NCCL kernel [30,60]
    assert (b["step"], b["bucket"], b["engine"], b["bytes"]) == ("1", 0, "torch", 4000)
    assert b["ready_ms"] == approx(1e-3)
    assert (b["comm_start_ms"], b["comm_end_ms"]) == (approx(12e-3), approx(42e-3))
    assert b["backward_ms"] == approx(50e-3)


# ---- CPU path -------------------------------------------------------------------------------------------

def test_cpu_breakdown_by_hand(tmp_path):
    rows, _ = rows_by_step(write_trace(tmp_path / "rank1.trace.json", cpu_events(), CPU_META))
    s = rows["5"]
    assert s["device"] == "cpu" and s["rank"] == 1   # no distributedInfo.rank: from the file name
    # compute: [100,300] + ([310,500] − c10d [410,440]) + [850,870] + [920,960] = 200+100+60+20+40
    assert s["compute_ms"] == approx(420e-3)
    assert s["comm_ms"] == approx(320e-3)            # barrier [10,50] + all-reduce [420,700]
    assert s["overlap_ms"] == approx(60e-3)          # [440,500]
    assert s["overlap_pct"] == approx(100 * 60 / 320)
    assert s["exposed_comm_ms"] == approx(260e-3)
    assert s["busy_ms"] == approx(680e-3)
    assert s["span_ms"] == approx(950e-3)            # 10 → 960
    assert s["idle_ms"] == approx(270e-3)
    assert s["allreduce_ms"] == approx(280e-3)
    assert s["allreduce_share_of_kernel_pct"] == approx(100 * 280 / (420 + 320))
    # operators on any thread, less communication: 200 + [310,420] + 20 + 40 = 370 of the 1000 µs step
    assert s["cpu_exec_pct"] == approx(37)
    assert s["comm_bytes"] == 4000                   # Input Dims [[1000]] float
    assert s["comm_busbw_gbps"] == approx(4000 * 1.0 / 320e-6 / 1e9)   # sole group of 2: factor 2·1/2
    for column in ("memory_ms", "gpu_util_pct", "sm_efficiency_pct", "achieved_occupancy_pct"):
        assert column not in s
    # the witness leaves the profiled pass's barrier out: all-reduce [420,700] less compute [440,500] = 220
    assert s["barrier_ms"] == approx(40e-3)           # gloo:barrier [10,50]
    assert s["exposed_comm_excl_barrier_ms"] == approx(220e-3)


def test_gpu_barrier_kernel_is_not_the_witness_communication(tmp_path):
    """NCCL runs a barrier as a one-element all-reduce: only its launch inside c10d::barrier tells."""
    nccl = "ncclDevKernel_AllReduce_Sum_u8_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    events = gpu_events() + [
        x("c10d::barrier", "cpu_op", 1, 3), runtime(2, 9),
        kernel(nccl, 2, 6, 9, 0.1, 1, stream=COMM_STREAM),          # [2,8]: before any compute, all exposed
        runtime(40, 10), kernel(nccl, 95, 3, 10, 0.1, 1, stream=COMM_STREAM),  # launched outside: counts
    ]
    rows, _ = rows_by_step(write_trace(tmp_path / "t.json", events, GPU_META))
    s1 = rows["1"]
    # communication [2,8] + [30,60] + [95,98]; compute [10,40] + [50,70]
    assert s1["comm_ms"] == approx(39e-3) and s1["exposed_comm_ms"] == approx(19e-3)  # HTA's: barrier in
    assert s1["barrier_ms"] == approx(6e-3)
    assert s1["exposed_comm_excl_barrier_ms"] == approx(13e-3)   # [40,50] + [95,98]


def test_cpu_bucket_timeline_matches_gloo_events_in_order(tmp_path):
    _, timeline = rows_by_step(write_trace(tmp_path / "rank1.json", cpu_events(), CPU_META))
    (b,) = timeline
    # backward [300,900]; bucket launched at 400; gloo all-reduce [420,700] with 1000 floats
    assert (b["bucket"], b["bytes"]) == (0, 4000)
    assert (b["ready_ms"], b["comm_start_ms"], b["comm_end_ms"], b["backward_ms"]) == (
        approx(0.1), approx(0.12), approx(0.4), approx(0.6))


def test_trace_without_profiler_steps_has_one_whole_window_row(tmp_path):
    summary, timeline = analyse_trace(TraceJob(write_trace(tmp_path / "t.json", cpu_events(False)), "t"))
    assert [r["step"] for r in summary] == ["all"]
    assert summary[0]["rank"] is None
    assert summary[0]["compute_ms"] == approx(420e-3)   # the window is the host events' span: nothing clipped
    assert timeline[0]["step"] == "all"


def test_per_rank_figures_do_not_depend_on_the_ranks_clocks(tmp_path):
    a = analyse_trace(TraceJob(write_trace(tmp_path / "a.json", gpu_events(), GPU_META), "a"))
    b = analyse_trace(TraceJob(write_trace(tmp_path / "b.json", gpu_events(), GPU_META, shift=1.7e9), "b"))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "trace_file"} for r in rows]
    for u, y in zip(strip(a[0]) + strip(a[1]), strip(b[0]) + strip(b[1])):
        assert u.keys() == y.keys()
        for k in u:
            assert u[k] == y[k] or (isinstance(u[k], float) and math.isclose(u[k], y[k], abs_tol=1e-6)), k


# ---- bad files and the command --------------------------------------------------------------------------

def test_a_bad_file_gives_one_error_and_the_others_are_analysed(tmp_path):
    good = write_trace(tmp_path / "rank0.json.gz", cpu_events(), CPU_META)
    truncated = tmp_path / "rank1.json.gz"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    corrupt = tmp_path / "rank2.json.gz"
    corrupt.write_bytes(b"\x1f\x8b" + b"not a gzip stream at all")
    not_json = tmp_path / "rank3.json"
    not_json.write_text('{"traceEvents": [')
    no_events = tmp_path / "rank4.json"
    no_events.write_text('{"schemaVersion": 1}')
    jobs = [TraceJob(p, p.name) for p in (good, truncated, corrupt, not_json, no_events)]
    summary, timeline, errors = analyse(jobs)
    assert list(summary.columns) == list(TRACE_SUMMARY_COLUMNS)
    assert list(timeline.columns) == list(BUCKET_TIMELINE_COLUMNS)
    assert set(summary["trace_file"]) == {"rank0.json.gz"}
    assert len(errors) == 4
    assert "rank1.json.gz" in errors[0] and "truncated" in errors[0]
    assert "rank2.json.gz" in errors[1] and "gzip" in errors[1]
    assert "rank3.json" in errors[2] and "JSON" in errors[2]
    assert "rank4.json" in errors[3] and "traceEvents" in errors[3]


def run_cli(path, out=None) -> int:
    return cli.main(argparse.Namespace(path=path, out=out, workers=None))


def test_cli_folder_of_traces(tmp_path, capsys):
    write_trace(tmp_path / "in" / "rank0.json.gz", cpu_events(), CPU_META)
    (tmp_path / "in" / "rank1.json.gz").write_bytes(gzip.compress(b"{")[:-4])  # truncated
    assert run_cli(tmp_path / "in", tmp_path / "out") == 1
    assert "rank1.json.gz" in capsys.readouterr().err
    summary = pd.read_csv(tmp_path / "out" / "trace_summary.csv")
    assert list(summary.columns) == list(TRACE_SUMMARY_COLUMNS)
    assert summary["step"].astype(str).tolist() == ["5", "all"]
    assert summary["memory_ms"].isna().all()                   # empty, never 0, on a CPU trace


def test_cli_bad_path_exits_2_and_writes_nothing(tmp_path, capsys):
    assert run_cli(tmp_path / "missing", tmp_path / "out") == 2
    assert "missing" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert run_cli(tmp_path / "notes.txt", tmp_path / "out") == 2
    (tmp_path / "empty").mkdir()
    assert run_cli(tmp_path / "empty", tmp_path / "out") == 2
    assert not (tmp_path / "out").exists()


def test_bare_event_array_and_metadata_after_the_events(tmp_path):
    bare = tmp_path / "rank2.json"
    bare.write_text(json.dumps(cpu_events()))
    rows, _ = rows_by_step(bare)
    assert rows["5"]["rank"] == 2 and rows["5"]["compute_ms"] == approx(420e-3)
    late = tmp_path / "t.json"
    late.write_text('{"traceEvents": ' + json.dumps(gpu_events()) + ', "distributedInfo": {"rank": 3}}')
    rows, _ = rows_by_step(late)
    assert rows["1"]["rank"] == 3 and rows["1"]["overlap_ms"] == approx(20e-3)


def test_gpu_bucket_timeline_from_the_engines_label(tmp_path):
    # ddp_core's label around the launch [19,24] wraps c10d's op: the label is the issue, counted once
    events = gpu_events() + [{"ph": "X", "cat": "user_annotation", "name": "ddp_core.allreduce.bucket0",
                              "pid": 1, "tid": 1, "ts": 18.5, "dur": 5.5, "args": {}}]
    _, timeline = rows_by_step(write_trace(tmp_path / "t.json", events, GPU_META), engine="overlap")
    (b,) = timeline
    assert (b["engine"], b["bytes"], b["ready_ms"]) == ("overlap", 4000, approx(0.5e-3))
    assert (b["comm_start_ms"], b["comm_end_ms"]) == (approx(12e-3), approx(42e-3))


def test_bench_main_dispatches_analyze(tmp_path):
    from bench.__main__ import main as bench_main

    trace = write_trace(tmp_path / "rank0.json", cpu_events(), CPU_META)
    assert bench_main(["analyze", str(trace), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "bucket_timeline.csv").is_file()


def test_workers_give_the_same_tables_and_a_bad_count_exits_2(tmp_path, capsys):
    # two ranks' traces analysed in two worker processes, and in this one: the same rows, in the same order
    folder = tmp_path / "in"
    for rank in (0, 1):
        write_trace(folder / f"rank{rank}.json", cpu_events(), CPU_META, shift=rank * 7.0)
    jobs = [TraceJob(p, p.name) for p in sorted(folder.iterdir())]
    one, _ = analyse_tables(jobs, workers=1)
    seen = []
    two, _ = analyse_tables(jobs, workers=2, progress=lambda done, total: seen.append((done, total)))
    for name in one:
        pd.testing.assert_frame_equal(one[name], two[name], check_dtype=False)
    assert seen == [(1, 2), (2, 2)]
    assert cli.main(argparse.Namespace(path=folder, out=tmp_path / "out", workers=0)) == 2
    assert "--workers 0" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert cli.main(argparse.Namespace(path=folder, out=tmp_path / "out", workers=2)) == 0
    assert "bench analyze: 2/2 trace files" in capsys.readouterr().err


def test_no_worker_outlives_the_command(tmp_path):
    # four copies of the public A100 trace (most of a second each): `bench analyze` is killed while its two
    # worker processes run; each dies with it (prctl's parent-death signal, bench/lifetime.py)
    source = Path(__file__).parent / "data" / "traces" / "hta" / "a100-8rank-rank3" / "rank3.json.gz"
    for rank in range(4):
        shutil.copy(source, tmp_path / f"rank{rank}.json.gz")
    proc = subprocess.Popen([sys.executable, "-m", "bench", "analyze", str(tmp_path), "--out",
                             str(tmp_path / "out"), "--workers", "2"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    kids: list[int] = []
    deadline = time.monotonic() + 20
    while len(kids) < 2 and time.monotonic() < deadline and proc.poll() is None:
        kids = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
                if _ppid(p) == proc.pid]
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert len(kids) == 2, "the workers never started"
    deadline = time.monotonic() + 5
    while any(alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(k) for k in kids)


def _ppid(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
