"""Why B differs from A: kernel classes, the per-configuration breakdown diff and its sentence (bench
compare with traces). Hand-built traces (analyze_fixtures.py) worked on paper; then two real CPU runs that
differ in threads per rank (tests/data/traces/cpu-threads-{1,2}) and the public A100/V100 traces as a pair,
each checked against figures read from the raw trace files here."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analyze_fixtures import CPU_META, GPU_META, cpu_events, gpu_events, write_trace

from bench.analyze import diff
from bench.analyze import kernel_classes as K
from bench.analyze.summary import CLASSES_FILE, SUMMARY_FILE, TraceJob, analyse_tables, analyse_trace_tables
from bench.report.compare_page import write_compare_page

DATA = Path(__file__).parent / "data" / "traces"


def by_class(rows):
    return {r["kernel_class"]: (r["events"], r["time_ms"], r["time_per_step_ms"]) for r in rows}


@pytest.mark.parametrize("name, cls", [
    ("ampere_sgemm_128x64_nn", "GEMM"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>(x)", "GEMM"),
    ("void splitKreduce_kernel<float, float, float, float, true, false, false>(x)", "GEMM"),  # cuBLAS split-K
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false>(x)", "convolution"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(x)", "attention"),
    ("void at::native::vectorized_layer_norm_kernel<float, float>(x)", "normalization"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>(x)", "optimizer"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float>>(x)", "reduction"),
    ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>(x)", "elementwise"),
    ("aten::addmm", "GEMM"), ("aten::add_", "elementwise"), ("aten::log_softmax", "reduction"),
    ("aten::addmm_backward_custom", "other"),  # CPU names are whole aten names, not substrings
    ("void permute_pooled_embs_kernel<float>(x)", "other"),
    ("void fbgemm_gpu::permute_indices_weights_kernel<false, int, decltype(nullptr)>(x)", "other"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 2, 2, false, false>(x)", "GEMM"),
])
def test_class_table_first_match(name, cls):
    assert K.class_of(name) == cls


def test_gpu_classes_keep_hta_memory_and_communication():
    assert K.gpu_kernel_class("ncclKernel_AllReduce_RING_LL_Sum_float(x)", "kernel") == "all-reduce"
    assert K.gpu_kernel_class("ncclKernel_SendRecv_RING_SIMPLE(x)", "kernel") == "other collectives"
    assert K.gpu_kernel_class("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy") == "memcpy/memset"
    assert K.gpu_kernel_class("Stream Sync", "cuda_sync") == "other"  # HTA's OTHER, never compute


def test_self_times_subtract_direct_children():
    # parent [0,10] holds child [2,5] (which holds [3,4]) and child [6,9]
    ts, end = np.array([0.0, 2, 3, 6]), np.array([10.0, 5, 4, 9])
    assert K.self_times(ts, end).tolist() == [10 - 3 - 3, 3 - 1, 1, 3]


def test_gpu_class_times_by_hand(tmp_path):
    # window `all` (2 steps, launches up to 200): GEMM 30 + 50 µs, all-reduce 30, elementwise 20, memcpy 10
    job = TraceJob(write_trace(tmp_path / "g.json", gpu_events(), GPU_META), "g")
    rows = analyse_trace_tables(job)[CLASSES_FILE]
    assert by_class(rows) == {
        "GEMM": (2, pytest.approx(0.080), pytest.approx(0.040)),
        "all-reduce": (1, pytest.approx(0.030), pytest.approx(0.015)),
        "elementwise": (1, pytest.approx(0.020), pytest.approx(0.010)),
        "memcpy/memset": (1, pytest.approx(0.010), pytest.approx(0.005)),
    }


def test_cpu_class_times_by_hand(tmp_path):
    # main thread, self times: aten::linear 200 (GEMM); AddmmBackward0's wrapper [310,500] less the c10d
    # issue [410,440] nested in it: 160 (other); the issue 30 + gloo:barrier 40 = other collectives 70;
    # aten::copy_ 20 + aten::add_ 40 (elementwise); gloo's all-reduce 280
    job = TraceJob(write_trace(tmp_path / "c.json", cpu_events(), CPU_META), "c")
    rows = analyse_trace_tables(job)[CLASSES_FILE]
    assert {k: (n, round(t * 1e3, 6)) for k, (n, t, _) in by_class(rows).items()} == {
        "GEMM": (1, 200), "other": (1, 160), "other collectives": (2, 70), "elementwise": (2, 60),
        "all-reduce": (1, 280)}


def _frames(summary_rows, class_rows):
    return pd.DataFrame(summary_rows), pd.DataFrame(class_rows)


def test_profile_diff_and_sentence_by_hand():
    def run(step, compute, exposed, gemm, steps=2):
        s = [{"cell_id": "c", "trace_file": "f", "step": str(i), "window_ms": step, "compute_ms": compute,
              "exposed_comm_ms": exposed, "memory_ms": 1.0, "idle_ms": 0.5, "cpu_exec_pct": 50.0}
             for i in range(steps)]
        s.append({**s[0], "step": "all", "window_ms": 99.0, "compute_ms": 99.0})  # the all row is not a step
        f = {"cell_id": "c", "trace_file": "f", "n_steps": steps}
        k = [{**f, "kernel_class": "GEMM", "time_ms": gemm},
             {**f, "kernel_class": "elementwise", "time_ms": 2.0}]
        return diff.profile(*_frames(s, k), {"c": "cfg"})

    (pa, ka), (pb, kb) = run(19.0, 12.0, 2.0, 19.2), run(10.0, 5.0, 2.6, 8.0)
    assert pa.set_index("config").loc["cfg", "host_ms"] == pytest.approx(9.5)  # 50 % of 19 ms
    parts, classes = diff.part_diff(pa, pb), diff.class_diff(ka, kb)
    step = parts[parts["part"] == "step_ms"].iloc[0]
    assert (step["a_ms"], step["b_ms"], step["change_ms"]) == (19.0, 10.0, -9.0)
    gemm = classes.iloc[0]  # the largest |change| first: GEMM 9.6 → 4 ms per step (÷ 2 steps)
    assert gemm["kernel_class"] == "GEMM"
    assert (gemm["a_ms"], gemm["b_ms"]) == (pytest.approx(9.6), pytest.approx(4.0))
    assert gemm["ratio_b_over_a"] == pytest.approx(4.0 / 9.6)
    assert diff.sentence("cfg", parts, classes, "A", "B") == (
        "cfg: B is 1.90× faster than A per profiled step (19 → 10 ms); GEMM time fell 2.40× (9.6 → 4 ms), "
        "exposed communication rose 1.30× (2 → 2.6 ms).")


def test_change_words_edges():
    assert diff.change_words("x", 0.0, 2.0) == "x appeared (0 → 2 ms)"
    assert diff.change_words("x", 2.0, 0.0) == "x vanished (2 → 0 ms)"
    assert diff.change_words("x", 2.0, 2.0) == "x unchanged (2 ms)"


# --- real traces -----------------------------------------------------------------------------------------
def _raw_events(path: Path) -> list[dict]:
    return [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]


def _mean_step_ms(paths) -> float:
    """Mean ProfilerStep length (ms) over every step of every file, read from the raw JSON."""
    durs = [e["dur"] for p in paths for e in _raw_events(p) if e["name"].startswith("ProfilerStep#")]
    return float(np.mean(durs)) / 1e3


def _gemm_ms_per_step(path: Path) -> float:
    """Σ duration of the GEMM kernels (cuBLAS sgemm/gemv/gemmk1 and its split-K and epilogue kernels,
    CUTLASS; not fbgemm_gpu's permutes) launched by a runtime call in the trace up to the last step's end,
    per step: the kernel_classes rule restated on the raw events."""
    ev = _raw_events(path)
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    last = max(e["ts"] + e["dur"] for e in steps)
    launch = {e["args"]["correlation"]: e["ts"] for e in ev
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    total = sum(e["dur"] for e in ev if e.get("cat") == "kernel"
                and "fbgemm_gpu::" not in e["name"]
                and any(s in e["name"] for s in ("gemm", "gemv", "cutlass", "splitKreduce", "epilogue::impl"))
                and launch.get(e["args"].get("correlation"), float("inf")) <= last)
    return total / 1e3 / len(steps)


def test_a100_v100_pair():
    """The public A100 (8-rank job, rank 3) and V100 (2-rank job, rank 1) traces of the same model, as two
    "runs" of one configuration."""
    a_file = DATA / "hta" / "a100-8rank-rank3" / "rank3.json.gz"
    b_file = DATA / "hta" / "v100-2rank-rank1" / "rank1.json.gz"
    (ta, ea), (tb, eb) = (analyse_tables([TraceJob(f, f.name)]) for f in (a_file, b_file))
    (sa, ka), (sb, kb) = ((t[SUMMARY_FILE], t[CLASSES_FILE]) for t in (ta, tb))
    assert not ea and not eb
    (pa, ca), (pb, cb) = diff.profile(sa, ka), diff.profile(sb, kb)
    parts, classes = diff.part_diff(pa, pb), diff.class_diff(ca, cb)
    p = parts.set_index("part")
    assert p.loc["step_ms", "a_ms"] == pytest.approx(_mean_step_ms([a_file]))
    assert p.loc["step_ms", "b_ms"] == pytest.approx(_mean_step_ms([b_file]))
    gemm = classes.set_index("kernel_class").loc["GEMM"]
    assert gemm["a_ms"] == pytest.approx(_gemm_ms_per_step(a_file))
    assert gemm["b_ms"] == pytest.approx(_gemm_ms_per_step(b_file))
    # measured: 77.5 → 124 ms per step; GEMM 13.78 → 34.75 ms, the largest change
    assert classes.iloc[0]["kernel_class"] == "GEMM"
    text = diff.sentence(diff.ALL_TRACES, parts, classes, "A100", "V100")
    ratio = p.loc["step_ms", "b_ms"] / p.loc["step_ms", "a_ms"]
    assert text.startswith(f"all traces: V100 is {ratio:.2f}× slower than A100 per profiled step")
    assert f"GEMM time rose {gemm['b_ms'] / gemm['a_ms']:.2f}×" in text
    # the breakdown parts are trace_summary's, per step row: compute's mean over the six ProfilerSteps
    steps_a = sa[sa["step"] != "all"]
    assert p.loc["compute_ms", "a_ms"] == pytest.approx(steps_a["compute_ms"].mean())


def test_compare_cpu_runs_differing_in_threads(tmp_path):
    """Two real cpu-smoke runs (one overlap cell, 2 ranks), threads per rank 1 and 2: compare analyses
    their traces into its own folder (the run folders have no trace_summary.csv) and writes the diff."""
    a, b = DATA / "cpu-threads-1", DATA / "cpu-threads-2"
    threads = [pd.read_csv(d / "results.csv")["threads_per_rank"].tolist() for d in (a, b)]
    assert threads == [[1], [2]]
    write_compare_page([a, b], tmp_path)
    assert not (a / "trace_summary.csv").exists() and (tmp_path / "traces" / "cpu-threads-1" /
                                                       "kernel_classes.csv").is_file()
    parts = pd.read_csv(tmp_path / "tables" / "trace_breakdown_cpu-threads-2.csv").set_index("part")
    for side, run in (("a", a), ("b", b)):
        files = sorted(run.rglob("*.json.gz"))
        assert parts.loc["step_ms", f"{side}_ms"] == pytest.approx(_mean_step_ms(files))
    classes = pd.read_csv(tmp_path / "tables" / "kernel_classes_cpu-threads-2.csv")
    # gloo's all-reduce: Σ gloo:all_reduce durations over both ranks / their 4 profiled steps
    for side, run in (("a", a), ("b", b)):
        files = sorted(run.rglob("*.json.gz"))
        total = sum(e["dur"] for f in files for e in _raw_events(f) if e["name"] == "gloo:all_reduce")
        got = classes.set_index("kernel_class").loc["all-reduce", f"{side}_ms"]
        assert got == pytest.approx(total / 1e3 / 4)
    page = (tmp_path / "summary.md").read_text()
    ratio = parts.loc["step_ms", "b_ms"] / parts.loc["step_ms", "a_ms"]
    word = "slower" if ratio > 1 else "faster"
    factor = max(ratio, 1 / ratio)
    assert f"cpu-threads-2 is {factor:.2f}× {word} than cpu-threads-1 per profiled step" in page
