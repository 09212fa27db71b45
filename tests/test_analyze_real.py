"""bench analyze on real traces: HolisticTraceAnalysis as the second witness on public A100 traces, and a run
folder this suite wrote on CPU (tests/data/traces/README.md says where each file comes from)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench import run_folder
from bench.analyze import cli, tables
from bench.analyze.columns import WITNESS_COLUMNS
from bench.analyze.load import find_trace_files
from bench.analyze.stragglers import persistent_stragglers
from bench.analyze.summary import TraceJob, analyse, analyse_tables

DATA = Path(__file__).parent / "data" / "traces"


def whole_rows(folder: Path) -> pd.DataFrame:
    summary, _, errors = analyse(TraceJob(p, p.name) for p in find_trace_files(folder))
    assert errors == []
    return summary[summary["step"] == "all"].set_index("rank")


# Every GPU trace of HTA's own test data (tests/data/traces/README.md) that has a ProfilerStep window and
# that HTA 0.5 itself can analyse, except triton_example (below): bench analyze's `all` row must give HTA's
# figures. Left out, with the reason: rank_unavailable/rank_not_found (HTA raises IndexError on it: no GPU
# kernel), triton_example (HTA counts a host `cpu_op` that carries a `stream` argument, Triton's launcher, as
# a 94 µs GPU kernel; we count GPU activity only), and the traces without ProfilerStep marks.
HTA_GPU_TRACES = [
    "a100-8rank-rank3", "sampled-2rank", "v100-2rank-rank1", "v100-2rank-many-kernels", "a100-2rank-rank0",
    "a100-16rank-rank0", "v100-1rank-ns", "mi250-1rank", "a100-event-sync", "tiny-2step-base",
    "tiny-2step-test",
]
ROCM_TRACES = {"mi250-1rank"}
WITHIN = 0.01  # compute, communication, idle and span within 1 % of HTA's figure; overlap within 1 point


def near(ours_us: float, ref_us: float) -> bool:
    return abs(ours_us - ref_us) <= WITHIN * abs(ref_us) + 1.0  # + 1 µs: HTA's whole microseconds


@pytest.fixture(scope="module", params=HTA_GPU_TRACES)
def hta_trace(request):
    """(folder, HTA's TraceAnalysis of it): module-scoped, so pytest groups the tests by trace and HTA
    parses each one once."""
    hta = pytest.importorskip("hta.trace_analysis")
    folder = request.param
    return folder, hta.TraceAnalysis(trace_dir=str(DATA / "hta" / folder), include_last_profiler_step=True)


@pytest.mark.filterwarnings("ignore::Warning:hta.*")  # HTA 0.5's own pandas deprecation warnings
def test_gpu_breakdown_agrees_with_holistic_trace_analysis(hta_trace):
    folder, ta = hta_trace
    ours = whole_rows(DATA / "hta" / folder)
    temporal = ta.get_temporal_breakdown(visualize=False)
    overlap = ta.get_comm_comp_overlap(visualize=False)
    assert len(temporal) == len(ours)
    if len(ours) > 1:  # several ranks: matched by rank
        temporal, overlap = temporal.set_index("rank"), overlap.set_index("rank")
        pairs = [(ours.loc[rank], ref, overlap.loc[rank]) for rank, ref in temporal.iterrows()]
    else:
        pairs = [(ours.iloc[0], temporal.iloc[0], overlap.iloc[0] if len(overlap) else None)]
    for mine, ref, ov in pairs:
        assert near(mine["span_ms"] * 1e3, ref["kernel_time(us)"]), (mine["span_ms"], ref["kernel_time(us)"])
        assert near(mine["compute_ms"] * 1e3, ref["compute_time(us)"]), (mine["compute_ms"], ref)
        assert near(mine["idle_ms"] * 1e3, ref["idle_time(us)"]), (mine["idle_ms"], ref)
        # HTA's non-compute time is the busy time outside compute kernels: our busy − compute
        assert near((mine["busy_ms"] - mine["compute_ms"]) * 1e3, ref["non_compute_time(us)"])
        if ov is not None and pd.notna(mine["overlap_pct"]):
            assert abs(mine["overlap_pct"] - ov["comp_comm_overlap_pctg"]) <= 1.0
    # The kernel-type breakdown (summed over ranks): HTA sums durations, we take unions; the same here,
    # where no two kernels of a class run at once.
    kinds, _ = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    for kind, column in (("COMMUNICATION", "comm_ms"), ("MEMORY", "memory_ms")):
        ref_us = kinds[kinds["kernel_type"].str.contains(kind)]["sum"].sum()
        assert near(ours[column].sum() * 1e3, ref_us), (kind, ours[column].sum() * 1e3, ref_us)


@pytest.mark.filterwarnings("ignore::Warning:hta.*")
def test_idle_breakdown_and_launch_stats_agree_with_holistic_trace_analysis(hta_trace):
    folder, ta = hta_trace
    frames, errors = analyse_tables(TraceJob(p, p.name) for p in find_trace_files(DATA / "hta" / folder))
    assert errors == []
    ranks = sorted(ta.t.get_ranks())
    # idle: per rank, stream and category, HTA's get_idle_time_breakdown (consecutive_kernel_delay = 30 µs)
    ref, _ = ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
    ref = ref.pivot_table(index=["rank", "stream"], columns="idle_category", values="idle_time",
                          aggfunc="sum").reindex(columns=["host_wait", "kernel_wait", "other"]).fillna(0.0)
    idle = frames["idle_breakdown.csv"]
    idle = idle[idle["step"] == "all"].assign(rank=lambda d: d["rank"].fillna(ranks[0]).astype(int),
                                              stream=lambda d: d["stream"].astype(int))
    mine = idle.set_index(["rank", "stream"])[["host_wait_ms", "kernel_wait_ms", "other_wait_ms"]] * 1e3
    mine.columns = [f"{kind}_ours" for kind in ref.columns]
    both = ref.join(mine, how="outer").fillna(0.0)  # a stream with one event: HTA lists zeros, we no row
    for kind in ref.columns:
        for theirs, ours in zip(both[kind], both[f"{kind}_ours"]):
            assert near(ours, theirs), (folder, kind, ours, theirs)
    # launch statistics: HTA's per-launch table, summarised as ours on the `all` row
    launch = frames["launch_stats.csv"].query("step == 'all'")
    for rank, df in ta.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False).items():
        row = launch[launch["rank"].fillna(ranks[0]) == rank]
        if not len(df):  # HTA knows CUDA's launch calls only; we also count HIP's (the MI250 trace: 14)
            assert row.empty or folder in ROCM_TRACES
            continue
        row = row.iloc[0]
        assert row["launches"] == len(df), (folder, rank)
        for ours, theirs in (("launch_delay_us", "launch_delay"), ("cpu_duration_us", "cpu_duration"),
                             ("gpu_duration_us", "gpu_duration")):
            p50, p90 = np.percentile(df[theirs], [50, 90])
            for q, value in (("p50", p50), ("p90", p90), ("max", df[theirs].max())):
                assert near(row[f"{ours}_{q}"], value), (folder, ours, q, row[f"{ours}_{q}"], value)
        assert near(row["short_kernels_pct"], 100 * (df["gpu_duration"] < 10).mean())


@pytest.mark.filterwarnings("ignore::Warning:hta.*")
def test_straggler_matches_holistic_trace_analysis_on_the_two_rank_job():
    hta = pytest.importorskip("hta.trace_analysis")
    folder = DATA / "hta" / "sampled-2rank"
    frames, _ = analyse_tables(TraceJob(p, p.name) for p in find_trace_files(folder))
    ours = persistent_stragglers(frames["stragglers.csv"]).iloc[0]
    # ours: the collectives aligned across the two ranks (tests/test_analyze_waits.py): rank 1 held the
    # others longest in steps 551 and 552
    assert (ours["straggler_rank"], ours["steps_last"], ours["steps"]) == (1, 2, 2)
    assert not ours["persistent"]  # two steps of two ranks: by chance half the time (chance_p 0.5)
    ta = hta.TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    assert ta.get_potential_stragglers(num_candidates=1) == [ours["straggler_rank"]]


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
    assert cli.main(argparse.Namespace(path=run, out=None, workers=None)) == 0
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
    witnesses = pd.read_csv(run / run_folder.WITNESSES)     # a run folder also gets the two witnesses
    assert list(witnesses.columns) == list(WITNESS_COLUMNS)
    # stragglers: every cell's two ranks compared in each profiled step; CPU traces have no kernels
    stragglers = pd.read_csv(run / "stragglers.csv")
    assert len(stragglers) == 3 * 2 and (stragglers["ranks"] == 2).all()
    assert stragglers["straggler_rank"].isin([0, 1]).all() and (stragglers["late_by_ms"] >= 0).all()
    assert pd.read_csv(run / "idle_breakdown.csv").empty and pd.read_csv(run / "launch_stats.csv").empty
    assert set(witnesses["cell_id"]) == set(results["cell_id"])
    # the profiled pass's per-step barrier is in every profiled step (gloo:barrier inside ProfilerStep) and
    # counts as communication in HTA's columns, not in the witness's
    steps = summary[summary["step"] != "all"]
    assert (steps["barrier_ms"] > 0).all()
    assert (steps["exposed_comm_excl_barrier_ms"] < steps["exposed_comm_ms"]).all()
    parts = tables.breakdown(summary, results)
    stacked = parts[["compute_alone_ms", "hidden_comm_ms", "exposed_comm_ms", "idle_ms"]].sum(axis=1)
    assert stacked.to_numpy() == pytest.approx(parts["span_ms"].to_numpy())


def test_run_folder_cell_without_traces_is_reported(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(DATA / "ddpbench-cpu-run", run)
    naive = pd.read_csv(run / "results.csv").query("engine == 'naive'")["trace_dir"].iloc[0]
    shutil.rmtree(run / naive)
    assert cli.main(argparse.Namespace(path=run, out=None, workers=None)) == 1
    assert "naive" in capsys.readouterr().err
    assert len(pd.read_csv(run / "trace_summary.csv")) == 4 * 3   # the other two cells still analysed
