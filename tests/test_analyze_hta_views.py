"""Idle-time breakdown, launch statistics and stragglers on hand-built traces (hta_views_fixtures.py); each
expected value is worked out next to its assertion. HTA itself is the second witness on public traces in
tests/test_analyze_real.py."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest
from analyze_fixtures import COMM_STREAM, GPU_META, STREAM, write_trace
from hta_views_fixtures import gpu_bound_events, host_bound_events, idle_events, two_rank_events

from bench.analyze import cli, waits
from bench.analyze.columns import IDLE_BREAKDOWN_COLUMNS, LAUNCH_STATS_COLUMNS, STRAGGLER_COLUMNS
from bench.analyze.stragglers import chance_last, persistent_stragglers, straggler_rows
from bench.analyze.summary import TraceJob, analyse_tables, analyse_trace_tables


def tables(path):
    return analyse_trace_tables(TraceJob(path, path.name))


def by(rows, **keys):
    hit = [r for r in rows if all(r[k] == v for k, v in keys.items())]
    assert len(hit) == 1, (keys, rows)
    return hit[0]


def test_idle_breakdown_by_hand(tmp_path):
    idle = tables(write_trace(tmp_path / "t.json", idle_events(), GPU_META))["idle_breakdown.csv"]
    s1 = by(idle, step="1", stream=STREAM)
    # K1 ends 20, K2 (launched at 5, before 20) starts 25: a 5 µs gap under 30 µs → kernel wait;
    # K2 ends 30, K3 (launched at 8) starts 80: 50 µs → other
    assert (s1["idle_ms"], s1["host_wait_ms"], s1["kernel_wait_ms"], s1["other_wait_ms"]) == pytest.approx(
        (0.055, 0.0, 0.005, 0.050))
    s2 = by(idle, step="2", stream=STREAM)
    # K3 ends 90, K4 launched at 120 (after 90), starts 125: 35 µs host wait
    assert (s2["idle_ms"], s2["host_wait_ms"], s2["kernel_wait_ms"], s2["other_wait_ms"]) == pytest.approx(
        (0.035, 0.035, 0.0, 0.0))
    whole = by(idle, step="all", stream=STREAM)
    assert (whole["idle_ms"], whole["host_wait_ms"]) == pytest.approx((0.090, 0.035))
    assert whole["host_wait_pct"] == pytest.approx(100 * 35 / 90)
    assert [r for r in idle if r["stream"] == COMM_STREAM] == []   # one event on it: no gap
    assert set(IDLE_BREAKDOWN_COLUMNS) == set(whole)


def test_launch_statistics_by_hand(tmp_path):
    launch = tables(write_trace(tmp_path / "t.json", idle_events(), GPU_META))["launch_stats.csv"]
    s1 = by(launch, step="1")
    # delay = kernel start − end of its launch call (start + 2): K1 10−4, K2 25−7, K3 80−10, NCCL 40−11
    assert s1["launches"] == 4
    assert s1["launch_delay_us_p50"] == pytest.approx((18 + 29) / 2)   # of 6, 18, 29, 70
    assert s1["launch_delay_us_max"] == 70
    assert s1["cpu_duration_us_p50"] == 2
    assert s1["gpu_duration_us_p50"] == 10 and s1["gpu_duration_us_max"] == 35   # 10, 5, 10, 35
    assert s1["short_kernels_pct"] == 25                                # K2: 5 µs < 10
    # the compute stream is the one with the most compute time, not the busier NCCL stream (35 µs > 25)
    assert s1["compute_stream"] == STREAM and s1["window_ms"] == 0.1
    assert s1["host_us_per_launch"] == 25                               # 100 µs / 4
    assert s1["gpu_busy_pct"] == pytest.approx(10 + 5 + 35 + 10)       # [10,20] [25,30] [40,75] [80,90]
    # K4's host-wait gap [90,125] (stream empty, K4 not yet launched) counts by time, clipped to each step:
    # 10 µs of step 1 and 25 of step 2
    assert s1["host_wait_pct"] == pytest.approx(10) and s1["launch_bound"] is False
    assert by(launch, step="2")["host_wait_pct"] == pytest.approx(25)
    assert by(launch, step="all")["launches"] == 5
    assert set(LAUNCH_STATS_COLUMNS) - set(s1) == {"cell_id", "trace_file", "rank"} - set(s1)


def test_host_bound_step_is_flagged_and_gpu_bound_is_not(tmp_path):
    host = by(tables(write_trace(tmp_path / "h.json", host_bound_events(), GPU_META))["launch_stats.csv"],
              step="1")
    # kernel i−1 ends at 10i, kernel i is launched at 10i+1 and starts at 10i+9: 9 gaps of 9 µs host wait
    assert host["host_wait_pct"] == pytest.approx(81) and host["launch_bound"] is True
    assert host["gpu_busy_pct"] == pytest.approx(10)
    assert host["launch_delay_us_p50"] == 6                 # starts at 10i+9, its call ended at 10i+3
    gpu = by(tables(write_trace(tmp_path / "g.json", gpu_bound_events(), GPU_META))["launch_stats.csv"],
             step="1")
    # back to back from 5: no gap at all; kernel i waits 3 + 8i µs behind the others
    assert gpu["host_wait_pct"] == 0 and gpu["launch_bound"] is False
    assert gpu["launch_delay_us_max"] == 3 + 8 * 9


def test_stragglers_align_ranks_on_the_collective_ends(tmp_path):
    folder = tmp_path / "job"
    # rank 1's clock is 1.7e9 µs ahead: raw timestamps would make it "last" in every step
    paths = [write_trace(folder / "rank0.json", two_rank_events(0), GPU_META | {"distributedInfo": {}}),
             write_trace(folder / "rank1.json", two_rank_events(1), {"distributedInfo": {}}, shift=1.7e9)]
    frames, errors = analyse_tables(TraceJob(p, f"job/{p.name}") for p in paths)
    assert errors == []
    s = frames["stragglers.csv"].set_index("step")
    assert list(frames["stragglers.csv"].columns) == list(STRAGGLER_COLUMNS)
    # step 1: the last all-reduce ends at 90 on both; rank 0 starts it at 55, rank 1 at 75: rank 1, by 20 µs
    assert s.loc["1", "straggler_rank"] == 1 and s.loc["1", "late_by_ms"] == pytest.approx(0.020)
    # step 2: rank 0 at −20, rank 1 at −28; step 3: −40 and −10
    assert s.loc["2", "straggler_rank"] == 0 and s.loc["2", "late_by_ms"] == pytest.approx(0.008)
    assert s.loc["3", "straggler_rank"] == 1 and s.loc["3", "spread_ms"] == pytest.approx(0.030)
    assert (s["ranks"] == 2).all() and (s["job"] == "job").all()
    who = persistent_stragglers(frames["stragglers.csv"]).iloc[0]
    assert (who["straggler_rank"], who["steps_last"], who["steps"]) == (1, 2, 3)
    assert who["late_by_ms_p50"] == pytest.approx((0.020 + 0.030) / 2)
    # but with two ranks someone is last in 2 of 3 steps every time: 2 · P(Bin(3, 1/2) ≥ 2) = 2 · 4/8 ≥ 1
    assert who["chance_p"] == 1.0 and not who["persistent"]
    # last in one step of two, or in the only one, is no evidence either
    for few in (frames["stragglers.csv"].iloc[:2], frames["stragglers.csv"].iloc[:1]):
        assert not persistent_stragglers(few).iloc[0]["persistent"]


def test_a_persistent_straggler_is_one_chance_cannot_explain():
    # by hand, r · P(Bin(n, 1/r) ≥ k): two ranks, 6 of 6 steps: 2 / 64; 5 of 6: 2 · 7/64; eight ranks,
    # 3 of 3: 8 / 512
    assert chance_last(6, 6, 2) == pytest.approx(2 / 64) and chance_last(5, 6, 2) == pytest.approx(14 / 64)
    assert chance_last(3, 3, 8) == pytest.approx(8 / 512)
    steps = pd.DataFrame({"cell_id": "c", "job": "c", "step": [str(i) for i in range(6)], "ranks": 2,
                          "straggler_rank": [1] * 6, "late_by_ms": 20.0, "spread_ms": 20.0})
    assert persistent_stragglers(steps).iloc[0]["persistent"]                 # 6 of 6: 3 % by chance
    assert not persistent_stragglers(steps.assign(straggler_rank=[1] * 5 + [0])).iloc[0]["persistent"]
    assert persistent_stragglers(steps.iloc[:3].assign(ranks=8)).iloc[0]["persistent"]   # 3 of 3 of 8


def instances(starts_ms: list[float], end_ms: float, **kw) -> pd.DataFrame:
    """One all-reduce on ranks 0..n-1 of one host (a shared clock), from starts_ms to end_ms."""
    n = len(starts_ms)
    return pd.DataFrame({"cell_id": "c", "trace_file": [f"t/rank{r}.json" for r in range(n)],
                         "rank": range(n), "host": "h", "world_size": n, "step": "1",
                         "collective": "allreduce", "process_group": None, "seq": None, "bytes": None,
                         "ordinal": 0, "barrier": False,
                         "start_us": [1e3 * s for s in starts_ms], "end_us": 1e3 * end_ms} | kw)


def test_straggler_is_late_by_its_margin_over_the_next_rank():
    # three ranks join an all-reduce (ending at 50) at 10, 30 and 45 ms: rank 2 is last, 15 ms after
    # rank 1 (what the job waited for it alone); the spread is 35 ms
    row = straggler_rows(waits.align(instances([10.0, 30.0, 45.0], 50.0))).iloc[0]
    assert (row["straggler_rank"], row["late_by_ms"], row["spread_ms"], row["ranks"]) == (2, 15, 35, 3)


def test_a_collective_missing_on_a_rank_is_not_matched(tmp_path):
    # rank 1's trace lost step 1's second all-reduce (its launch and kernel): rank 0's has no partner, so
    # its wait is unknown and step 1 names no straggler (the first all-reduce starts at 30 on both ranks)
    folder = tmp_path / "job"
    short = [e for e in two_rank_events(1) if not (e["ts"] in (51, 75) and e["name"] != "c10d::allreduce_")]
    paths = [write_trace(folder / "rank0.json", two_rank_events(0)),
             write_trace(folder / "rank1.json", short)]
    frames, _ = analyse_tables(TraceJob(p, f"job/{p.name}") for p in paths)
    w = frames["collective_wait.csv"].set_index(["rank", "step", "ordinal"])
    assert pd.isna(w.loc[(0, "1", 1), "wait_ms"]) and w.loc[(0, "1", 1), "ranks"] == 1
    s = frames["stragglers.csv"].set_index("step")
    assert pd.isna(s.loc["1", "straggler_rank"])
    assert s.loc["2", "straggler_rank"] == 0


def test_cli_writes_the_new_tables(tmp_path):
    folder = tmp_path / "job"
    write_trace(folder / "rank0.json", two_rank_events(0))
    write_trace(folder / "rank1.json", two_rank_events(1))
    assert cli.main(argparse.Namespace(path=folder, out=tmp_path / "out", workers=None)) == 0
    for name, columns in (("idle_breakdown.csv", IDLE_BREAKDOWN_COLUMNS),
                          ("launch_stats.csv", LAUNCH_STATS_COLUMNS), ("stragglers.csv", STRAGGLER_COLUMNS)):
        assert tuple(pd.read_csv(tmp_path / "out" / name).columns) == columns


def test_run_folder_views_in_the_why_section(tmp_path):
    from bench.analyze import hta_tables
    from bench.report.why_section import why_section

    run = tmp_path / "run"
    write_trace(run / "traces" / "c1" / "rank0.json", two_rank_events(0))
    write_trace(run / "traces" / "c1" / "rank1.json", two_rank_events(1))
    write_trace(run / "traces" / "c2" / "rank0.json", host_bound_events())
    results = pd.DataFrame({"cell_id": ["c1", "c2"], "trace_dir": ["traces/c1", "traces/c2"],
                            "engine": "torch", "world_size": [2, 1], "exposed_comm_ms": 0.1,
                            "step_time_ms_p50": 1.0, "step_time_ms_p90": 1.1,
                            "slowest_rank": [1, None], "rank_skew_ms_p50": [0.02, None]})
    results.to_csv(run / "results.csv", index=False)
    assert cli.main(argparse.Namespace(path=run, out=None, workers=None)) == 0
    launch = hta_tables.launch_table(pd.read_csv(run / "launch_stats.csv", dtype={"cell_id": str}))
    c2 = launch.set_index("cell_id").loc["c2"]
    assert (c2["launch_bound_steps"], c2["steps"], c2["launches"]) == (1, 1, 10)
    idle = hta_tables.idle_table(pd.read_csv(run / "idle_breakdown.csv", dtype={"cell_id": str}))
    assert idle.set_index("cell_id").loc["c2", "host_wait_ms"] == pytest.approx(0.081)   # 9 gaps of 9 µs
    (tmp_path / "report" / "plots").mkdir(parents=True)   # the page builder makes it
    sec = why_section(run, results, tmp_path / "report")
    text = "\n".join(sec.md)
    assert "1 of 2 profiled cells have launch-bound steps: c2" in text
    # c1's rank 1 is last in 2 of 3 steps, which one of two ranks always is: not named
    assert "No rank is last in more steps than chance would make it." in text
    table = pd.read_csv(tmp_path / "report" / "tables" / "why_stragglers.csv").iloc[0]
    assert (table["straggler_rank"], table["steps_last"], table["slowest_rank"]) == (1, 2, 1)
    host = hta_tables.host_bound_cells(pd.read_csv(run / "launch_stats.csv", dtype={"cell_id": str}))
    assert host.set_index("cell_id")["host_bound"].to_dict() == {"c1": True, "c2": True}  # tiny fixtures
    assert "Host-bound: 2 of 2 profiled cells kept the GPU busy under 70 % of the step (c1 " in text
    for name in ("why_idle.csv", "why_launch.csv", "why_stragglers.csv"):
        assert (tmp_path / "report" / "tables" / name).is_file()


def test_per_cell_tables_sum_streams_and_average_steps():
    from bench.analyze import hta_tables

    # one cell, one file, two steps; step 1 waits on two streams (1 + 3 ms host, 2 ms other), step 2 on one
    idle = pd.DataFrame({"cell_id": "c", "trace_file": "f", "step": ["1", "1", "2", "all"],
                         "stream": [7, 20, 7, 7], "idle_ms": [3.0, 3.0, 2.0, 99.0],
                         "host_wait_ms": [1.0, 3.0, 2.0, 99.0], "kernel_wait_ms": 0.0,
                         "other_wait_ms": [2.0, 0.0, 0.0, 0.0]})
    row = hta_tables.idle_table(idle).iloc[0]
    # per step: (6, 4, 0, 2) and (2, 2, 0, 0); mean (4, 3, 0, 1); the `all` row is not a step
    assert (row["idle_ms"], row["host_wait_ms"], row["other_wait_ms"]) == (4, 3, 1)
    assert row["host_wait_pct"] == 75
    launch = pd.DataFrame({"cell_id": "c", "trace_file": "f", "step": ["1", "2", "3", "all"],
                           "launches": [10, 20, 30, 60], "launch_delay_us_p50": [1.0, 5.0, 100.0, 4.0],
                           "short_kernels_pct": 50.0, "host_us_per_launch": 20.0, "gpu_busy_pct": 10.0,
                           "host_wait_pct": [80.0, 20.0, None, 50.0],
                           "launch_bound": [True, False, None, True]})
    row = hta_tables.launch_table(launch).iloc[0]
    assert (row["launches"], row["launch_delay_us_p50"]) == (20, 5)      # mean of steps; median of p50s
    assert (row["launch_bound_steps"], row["steps"]) == (1, 3)           # an empty flag is not a flagged step
    # host-bound: GPU busy below 70 % of the step (mean over steps and ranks); 69.9 is, 70 is not
    two = pd.concat([launch.assign(cell_id="a", gpu_busy_pct=69.9),
                     launch.assign(cell_id="b", gpu_busy_pct=70.0)])
    flags = hta_tables.host_bound_cells(two).set_index("cell_id")["host_bound"].to_dict()
    assert flags == {"a": True, "b": False}
