"""bench analyze on real traces: HolisticTraceAnalysis as the second witness on public A100 traces, and a run
folder this suite wrote on CPU (tests/data/traces/README.md says where each file comes from)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bench.analyze import cli, tables
from bench.analyze.load import find_trace_files
from bench.analyze.summary import TraceJob, analyse

DATA = Path(__file__).parent / "data" / "traces"
TOLERANCE = 0.02  # "within a few percent": 2 % of the rank's GPU span, or 2 points of a percentage


def whole_rows(folder: Path) -> pd.DataFrame:
    summary, _, errors = analyse(TraceJob(p, p.name) for p in find_trace_files(folder))
    assert errors == []
    return summary[summary["step"] == "all"].set_index("rank")


@pytest.mark.filterwarnings("ignore::Warning:hta.*")  # HTA 0.5's own pandas deprecation warnings
@pytest.mark.parametrize("folder", ["a100-8rank-rank3", "sampled-2rank"])
def test_gpu_breakdown_agrees_with_holistic_trace_analysis(folder):
    hta = pytest.importorskip("hta.trace_analysis")
    ours = whole_rows(DATA / "hta" / folder)
    ta = hta.TraceAnalysis(trace_dir=str(DATA / "hta" / folder), include_last_profiler_step=True)
    temporal = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    assert sorted(temporal.index) == sorted(ours.index)
    for rank, ref in temporal.iterrows():
        mine = ours.loc[rank]
        span_us = ref["kernel_time(us)"]
        assert mine["span_ms"] * 1e3 == pytest.approx(span_us, rel=TOLERANCE)
        assert abs(mine["compute_ms"] * 1e3 - ref["compute_time(us)"]) <= TOLERANCE * span_us
        assert abs(mine["idle_ms"] * 1e3 - ref["idle_time(us)"]) <= TOLERANCE * span_us
        # HTA's non-compute time is the busy time outside compute kernels: our busy − compute
        assert abs((mine["busy_ms"] - mine["compute_ms"]) * 1e3 - ref["non_compute_time(us)"]) \
            <= TOLERANCE * span_us
        assert abs(mine["overlap_pct"] - overlap.loc[rank, "comp_comm_overlap_pctg"]) <= 100 * TOLERANCE
    # The kernel-type breakdown (summed over ranks): each class's union includes its overlaps with others.
    kinds, _ = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    classes = (("COMPUTATION", "compute_ms"), ("COMMUNICATION", "comm_ms"), ("MEMORY", "memory_ms"))
    for kind, column in classes:
        ref_us = kinds[kinds["kernel_type"].str.contains(kind)]["sum"].sum()
        assert abs(ours[column].sum() * 1e3 - ref_us) <= TOLERANCE * ours["span_ms"].sum() * 1e3, kind


def test_real_cpu_only_trace():
    row = whole_rows(DATA / "hta" / "cpu-only").loc[34]
    # one ProfilerStep of 210.1 ms; gloo all-reduces on two worker threads, clipped to it; no main-thread op
    assert row["device"] == "cpu"
    assert row["compute_ms"] == 0 and row["comm_ms"] == pytest.approx(row["span_ms"])
    # the two all-reduces that start inside the step: 321271 + 2082411 floats
    assert row["comm_bytes"] == (321271 + 2082411) * 4
    assert pd.isna(row["comm_busbw_gbps"])   # 11 process groups: which one ran them is not recorded


def test_run_folder_bucket_timeline_matches_the_engines_buckets(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(DATA / "ddpbench-cpu-run", run)
    assert cli.main(argparse.Namespace(path=run, out=None)) == 0
    results = pd.read_csv(run / "results.csv")
    summary = pd.read_csv(run / "trace_summary.csv")
    timeline = pd.read_csv(run / "bucket_timeline.csv")
    assert len(summary) == 6 * 3                              # 6 files × (2 profiled steps + all)
    assert set(summary["cell_id"]) == set(results["cell_id"]) and set(summary["device"]) == {"cpu"}
    for cell in results.itertuples():
        rows = timeline[timeline["cell_id"] == cell.cell_id]
        assert set(rows["engine"]) == {cell.engine}
        for _, step in rows.groupby(["rank", "step"]):
            assert sorted(step["bucket"]) == list(range(cell.n_buckets))
            assert step["bytes"].max() == cell.allreduce_bytes       # the largest bucket, as the probe used
            assert step["bytes"].sum() == cell.n_params * 4          # every fp32 gradient once
            assert step["ready_ms"].is_monotonic_increasing
            assert (step["comm_start_ms"] >= step["ready_ms"]).all()
            assert (step["comm_end_ms"] > step["comm_start_ms"]).all()
            assert (step["ready_ms"] <= step["backward_ms"]).all()
    witnesses = tables.two_witnesses(summary, results)
    assert set(witnesses["cell_id"]) == set(results["cell_id"])
    parts = tables.breakdown(summary, results)
    stacked = parts[["compute_alone_ms", "hidden_comm_ms", "exposed_comm_ms", "idle_ms"]].sum(axis=1)
    assert stacked.to_numpy() == pytest.approx(parts["span_ms"].to_numpy())


def test_run_folder_cell_without_traces_is_reported(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(DATA / "ddpbench-cpu-run", run)
    naive = pd.read_csv(run / "results.csv").query("engine == 'naive'")["trace_dir"].iloc[0]
    shutil.rmtree(run / naive)
    assert cli.main(argparse.Namespace(path=run, out=None)) == 1
    assert "naive" in capsys.readouterr().err
    assert len(pd.read_csv(run / "trace_summary.csv")) == 4 * 3   # the other two cells still analysed
