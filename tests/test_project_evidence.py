"""The physics terms from a run's own traces: the interference witness and host time in `bench analyze`'s
tables (kernel_classes.csv overlapped_*, launch_stats.csv host_busy_ms) and bench/project/evidence.py's
γ and host floor from them; every figure worked out by hand next to its assertion."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analyze_fixtures import COMM_STREAM, GPU_META, kernel, runtime, write_trace, x

from bench import run_folder
from bench.analyze import intervals as iv
from bench.analyze.summary import CLASSES_FILE, LAUNCH_FILE, TraceJob, analyse_trace_tables
from bench.project.configuration import Configuration
from bench.project.evidence import TraceEvidence, host_ms_of, interference_of, read_evidence, with_evidence
from bench.project.physics import DEFAULT_INTERFERENCE
from bench.project.project import project
from bench.project.simulate import Buckets, Compute

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"
GEMM = "ampere_sgemm_128x64_nn"


def test_covered_reads_the_cumulative_length():
    # set [10,20) ∪ [30,40): [0,15) is covered 5, [15,35) 5 + 5 = 10, [40,50) 0, [12,18) 6
    a = np.array([[10.0, 20.0], [30.0, 40.0]])
    assert iv.covered(a, np.array([0.0, 15, 40, 12]), np.array([15.0, 35, 50, 18])).tolist() == [5, 10, 0, 6]
    assert iv.covered(iv.EMPTY, np.array([0.0]), np.array([1.0])).tolist() == [0]


def interference_trace() -> list[dict]:
    # One step [0, 200), an all-reduce [100,160). The GEMM runs alone at [10,20) and [30,44) (10 and 14 µs:
    # median 12), then under the all-reduce: fully at [110,128) (18 µs) and at [150,170) (10 of its 20 µs
    # covered: at least half, overlapped); at [158,180) only 2 of 22 µs are covered: neither alone nor
    # overlapped. An elementwise kernel [60,70) runs alone only.
    events = [x("ProfilerStep#1", "user_annotation", 0, 200)]
    kernels = [(GEMM, 10, 10), (GEMM, 30, 14), ("vectorized_elementwise_kernel", 60, 10), (GEMM, 110, 18),
               (GEMM, 150, 20), (GEMM, 158, 22)]
    for corr, (name, ts, dur) in enumerate(kernels, start=1):
        events += [runtime(ts - 5, corr), kernel(name, ts, dur, corr, 1.0, 50)]
    events += [runtime(95, 99), kernel(NCCL, 100, 60, 99, 0.1, 5, stream=COMM_STREAM)]
    return events


def test_kernel_classes_split_overlapped_kernels_from_their_lone_twins(tmp_path):
    job = TraceJob(write_trace(tmp_path / "g.json", interference_trace(), GPU_META), "g")
    rows = {r["kernel_class"]: r for r in analyse_trace_tables(job)[CLASSES_FILE]}
    # overlapped GEMMs: 18 + 20 = 38 µs; their alone twins' median 12 µs each: 24 µs
    gemm = rows["GEMM"]
    assert (gemm["overlapped_events"], gemm["overlapped_ms"], gemm["overlapped_alone_ms"]) == (
        2, pytest.approx(0.038), pytest.approx(0.024))
    assert rows["elementwise"]["overlapped_events"] == 0
    assert rows["all-reduce"]["overlapped_ms"] == 0.0


def test_host_busy_leaves_out_the_calls_that_wait_for_the_gpu(tmp_path):
    # step [0,100): a cudaStreamSynchronize [60,90) (by name) and a cudaMemcpyAsync [20,30) whose copy
    # [22,28) ended before the call returned (synchronous): 30 + 10 µs waited. Launches [40,42) and [10,12)
    # whose kernels end after they return are host work at their usual cost; the launch [92,99) took 7 µs
    # against the launches' median of 2: 5 µs waiting for room in the GPU's queue. 100 − 30 − 10 − 5 = 55.
    events = [x("ProfilerStep#1", "user_annotation", 0, 100), x("aten::mm", "cpu_op", 1, 2),
              x("cudaStreamSynchronize", "cuda_runtime", 60, 30),
              x("cudaMemcpyAsync", "cuda_runtime", 20, 10, correlation=7),
              x("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 22, 6, pid=0, tid=7, correlation=7),
              runtime(40, 8), kernel(GEMM, 45, 10, 8, 1.0, 50),
              runtime(10, 9), kernel(GEMM, 13, 5, 9, 1.0, 50),
              x("cudaLaunchKernel", "cuda_runtime", 92, 7, correlation=10),
              kernel(GEMM, 99.5, 0.3, 10, 1.0, 50)]
    job = TraceJob(write_trace(tmp_path / "h.json", events, GPU_META), "h")
    step = [r for r in analyse_trace_tables(job)[LAUNCH_FILE] if r["step"] == "1"][0]
    assert step["host_busy_ms"] == pytest.approx(0.055)


def evidence() -> TraceEvidence:
    # cell "b" (2 ranks): GEMM overlapped 3.0 ms vs 2.0 alone on rank 0, 2.5 vs 2.0 on rank 1, elementwise
    # 0.6 vs 0.5; overlap_ms 4 + 6 = 10 ms over both files. γ = (3 + 2.5 + 0.6 − 2 − 2 − 0.5) / 10 = 0.16.
    k = pd.DataFrame([
        dict(cell_id="b", trace_file="r0", kernel_class="GEMM", overlapped_ms=3.0, overlapped_alone_ms=2.0),
        dict(cell_id="b", trace_file="r1", kernel_class="GEMM", overlapped_ms=2.5, overlapped_alone_ms=2.0),
        dict(cell_id="b", trace_file="r1", kernel_class="elementwise", overlapped_ms=0.6,
             overlapped_alone_ms=0.5)])
    s = pd.DataFrame([dict(cell_id="b", trace_file="r0", step="all", overlap_ms=4.0),
                      dict(cell_id="b", trace_file="r1", step="all", overlap_ms=6.0),
                      dict(cell_id="b", trace_file="r1", step="3", overlap_ms=99.0)])  # a step: not summed
    # base cell "a": host busy 30, 34, 40 ms over three steps (median 34); its `all` row is not a step
    launch = pd.DataFrame([dict(cell_id="a", step=str(i), host_busy_ms=v) for i, v in enumerate((30, 40, 34))]
                          + [dict(cell_id="a", step="all", host_busy_ms=104.0)])
    return TraceEvidence(k, s, launch)


def test_interference_and_host_from_the_tables():
    gamma, words = interference_of(evidence(), ["b"])
    assert gamma == pytest.approx(0.16) and "traces of b" in words
    assert host_ms_of(evidence(), "a", "cuda")[0] == pytest.approx(34.0)
    # no traces, no communicating cell with evidence, a CPU run: the defaults, each saying why
    assert interference_of(TraceEvidence(None, None, None), ["b"])[0] == DEFAULT_INTERFERENCE
    gamma, words = interference_of(evidence(), ["zz"])
    assert gamma == DEFAULT_INTERFERENCE and words.startswith("default")
    host, words = host_ms_of(evidence(), "a", "cpu")
    assert host == 0.0 and "CPU" in words
    assert host_ms_of(TraceEvidence(None, None, None), "a", "cuda")[0] == 0.0


def test_too_little_overlap_measures_no_interference():
    # 0.013 ms of overlapped communication (a compiled CPU cell): γ would be (0.040 − 0.007) / 0.013 = 2.5
    k = pd.DataFrame([dict(cell_id="c", trace_file="r0", overlapped_ms=0.040, overlapped_alone_ms=0.007)])
    s = pd.DataFrame([dict(cell_id="c", trace_file="r0", step="all", overlap_ms=0.013)])
    gamma, words = interference_of(TraceEvidence(k, s, None), ["c"])
    assert gamma == DEFAULT_INTERFERENCE and "at least 1 ms" in words
    ev = evidence()
    both = TraceEvidence(pd.concat([k, ev.kernel_classes]), pd.concat([s, ev.trace_summary]), None)
    assert interference_of(both, ["c", "b"])[0] == pytest.approx(0.16)  # the next cell with enough overlap


def test_faster_overlapped_twins_are_no_negative_interference():
    k = pd.DataFrame([dict(cell_id="b", trace_file="r0", overlapped_ms=1.0, overlapped_alone_ms=2.0)])
    s = pd.DataFrame([dict(cell_id="b", trace_file="r0", step="all", overlap_ms=4.0)])
    assert interference_of(TraceEvidence(k, s, None), ["b"])[0] == 0.0


def test_run_evidence_reaches_the_projection():
    # base cell a (1 rank, 100 ms: F 20, B 60, O 20), cell b at 2 ranks with the traces above: γ 0.16,
    # host 34 ms, σ 0 (no spread measured). One 60 MB bucket ready at the start of backward on 1 GB/s:
    # ring on 2 ranks = 2·1/2 · 6e7 B / 1e6 B/ms = 60 ms, exactly backward: hidden, so interference =
    # 0.16 · 60 = 9.6 ms and the step 100 + 9.6 = 109.6 ms; the 34 ms floor does not bind. With a host of
    # 150 ms measured instead, the floor adds 150 − 109.6 = 40.4 ms.
    from bench.project.network import custom_network

    base = pd.Series(dict(cell_id="a", engine="torch", model="m", model_size="s", bucket_cap_mb=25,
                          precision="fp32", comm_dtype="none", grad_accum=1, scaling="weak", world_size=1,
                          per_rank_batch=8, device="cuda", step_time_ms_p50=100.0,
                          step_time_ms_p90=float("nan"), rank_skew_ms_p50=float("nan")))
    rows = pd.DataFrame([base, pd.Series(base.to_dict() | dict(cell_id="b", world_size=2))])
    config = Configuration(base, rows, Compute(20.0, 60.0, 20.0, 1, 8), Buckets((60_000_000,), (0.0,), "t"))
    config = with_evidence(config, evidence())
    assert (config.physics.interference_factor, config.physics.host_ms) == pytest.approx((0.16, 34.0))
    net = custom_network(1.0, 0.0)
    [row] = project(config, "c", lambda n, d: (net, "c"), [2], "ring")
    assert row["interference_ms"] == pytest.approx(9.6)
    assert row["predicted_step_ms"] == pytest.approx(109.6)
    assert row["host_floor_ms"] == 0.0
    slow_host = TraceEvidence(evidence().kernel_classes, evidence().trace_summary,
                              pd.DataFrame([dict(cell_id="a", step="1", host_busy_ms=150.0)]))
    [row] = project(with_evidence(config, slow_host), "c", lambda n, d: (net, "c"), [2], "ring")
    assert (row["host_floor_ms"], row["predicted_step_ms"]) == pytest.approx((40.4, 150.0))


def test_read_evidence_of_a_run_folder_without_traces(tmp_path):
    ev = read_evidence(tmp_path)
    assert (ev.kernel_classes, ev.trace_summary, ev.launch_stats) == (None, None, None)
    (tmp_path / run_folder.LAUNCH_STATS).write_text("cell_id,step,host_busy_ms\na,1,5\n")
    assert read_evidence(tmp_path).launch_stats["host_busy_ms"].tolist() == [5]


def test_the_interference_default_is_the_mean_measured_on_the_public_traces(tmp_path):
    # physics.DEFAULT_INTERFERENCE is not fitted: it is the mean of γ that `bench analyze` + interference_of
    # measure on the two public GPU traces with much overlapped communication (V100, 2 ranks: 0.155; A100,
    # 8 ranks: 0.425). A loose trace folder has no cell id; its tables are one cell's.
    from bench.__main__ import main as bench_main

    traces = Path(__file__).parent / "data" / "traces" / "hta"
    measured = {}
    for name in ("v100-2rank-rank1", "a100-8rank-rank3"):
        out = tmp_path / name
        assert bench_main(["analyze", str(traces / name), "--out", str(out)]) == 0
        ev = read_evidence(out)
        one_cell = TraceEvidence(ev.kernel_classes.assign(cell_id="x"), ev.trace_summary.assign(cell_id="x"),
                                 None)
        measured[name] = interference_of(one_cell, ["x"])[0]
    assert measured["v100-2rank-rank1"] == pytest.approx(0.155, abs=0.001)
    assert measured["a100-8rank-rank3"] == pytest.approx(0.425, abs=0.001)
    assert DEFAULT_INTERFERENCE == pytest.approx(sum(measured.values()) / 2, abs=0.005)
