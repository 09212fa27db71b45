"""The report's "Why" tables (bench.analyze.tables) on summaries written by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.analyze import tables
from bench.analyze.columns import TRACE_SUMMARY_COLUMNS, WITNESS_COLUMNS


def summary(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(TRACE_SUMMARY_COLUMNS))


def step_row(cell, rank, step, **v):
    return {"cell_id": cell, "trace_file": f"{cell}/rank{rank}", "rank": rank, "step": step, "device": "cuda",
            **v}


RESULTS = pd.DataFrame([
    {"cell_id": "A", "engine": "overlap", "world_size": 2, "grad_accum": 1, "exposed_comm_ms": 1.0,
     "step_time_ms_p50": 10.0, "step_time_ms_p90": 10.4},
    {"cell_id": "B", "engine": "naive", "world_size": 2, "grad_accum": 1, "exposed_comm_ms": 1.0,
     "step_time_ms_p50": 10.0, "step_time_ms_p90": 10.5},
])


def cell(cell_id, ws, batch, exposed, low, high, engine="overlap"):
    return {"cell_id": cell_id, "engine": engine, "world_size": ws, "bucket_cap_mb": 25.0,
            "precision": "fp32", "comm_dtype": "none", "grad_accum": 1, "per_rank_batch": batch,
            "exposed_comm_ms": exposed,
            "exposed_comm_ms_ci95_low": low, "exposed_comm_ms_ci95_high": high}


def test_witnesses_subtract_the_world_size_1_sync_overhead_and_compare_intervals():
    results = pd.DataFrame([
        cell("W1", 1, 4, 2.0, 1.5, 2.5), cell("W1b", 1, 16, 3.0, 2.8, 3.2),
        cell("W2", 2, 4, 10.0, 9.0, 12.0), cell("W3", 2, 8, 10.0, 9.5, 10.5),
        cell("N2", 2, 4, 10.0, 9.0, 11.0, engine="naive"),   # no world-size-1 naive cell
        cell("W4", 2, 4, 10.0, 9.5, 10.5), cell("W5", 2, 10, 10.0, 9.5, 10.5),
        # torch with a comm hook: its compression is work no_sync skips that the plain cell never did
        cell("P2", 2, 4, 50.0, 45.0, 60.0) | {"engine_options": "hpowersgd.r4"},
    ])
    s = summary([
        step_row("W1", 0, "1", exposed_transfer_ms=0.03),
        step_row("W1", 0, "all", exposed_transfer_ms=99.0),   # the whole-window row is not a step
        # the trace's witness is exposed transfer: exposed communication (barriers out) less exposed waiting
        # for the last rank, which the timers cannot see (their compute-only window is the slowest rank's)
        *[step_row("W2", r, st, exposed_transfer_ms=v, exposed_wait_ms=wt,
                   exposed_comm_excl_barrier_ms=v + wt)
          for (r, st), v, wt in zip([(0, "1"), (0, "2"), (1, "1"), (1, "2")], [7.0, 11.0, 8.0, 9.0],
                                    [4.0, 6.0, 0.0, 0.0])],
        step_row("W3", 0, "1", exposed_transfer_ms=5.0),
        step_row("W3", 1, "1", exposed_transfer_ms=5.2),
        step_row("N2", 0, "1", exposed_transfer_ms=1.0),
        step_row("W4", 0, "1", exposed_transfer_ms=8.8),
        step_row("W4", 1, "1", exposed_transfer_ms=12),
        step_row("W5", 0, "1", exposed_transfer_ms=0.0),
        step_row("P2", 0, "1", exposed_transfer_ms=0.1),
    ])
    w = tables.witnesses(s, results)
    assert list(w.columns) == list(WITNESS_COLUMNS)
    assert set(w["cell_id"]) == {"W1", "W2", "W3", "N2", "W4", "W5", "P2"}
    w = w.set_index("cell_id")
    # W1, world size 1: all of step − compute-only is sync overhead; timer 2 − 2 = 0, [1.5 − 2.5, 2.5 − 1.5]
    assert w.loc["W1", "sync_overhead_ms"] == 2.0 and w.loc["W1", "sync_overhead_from"] == "itself"
    assert (w.loc["W1", "timer_exposed_comm_ms"], w.loc["W1", "timer_exposed_comm_ms_low"],
            w.loc["W1", "timer_exposed_comm_ms_high"]) == (0.0, -1.0, 1.0)
    assert w.loc["W1", "trace_exposed_comm_ms"] == 0.03 and not w.loc["W1", "disagree"]
    # W2: overhead from W1 (same batch); timer 10 − 2 = 8 in [9 − 2.5, 12 − 1.5] = [6.5, 10.5]
    assert w.loc["W2", "sync_overhead_from"] == "W1" and w.loc["W2", "step_minus_compute_only_ms"] == 10.0
    assert (w.loc["W2", "timer_exposed_comm_ms"], w.loc["W2", "timer_exposed_comm_ms_low"],
            w.loc["W2", "timer_exposed_comm_ms_high"]) == (8.0, 6.5, 10.5)
    # trace: median 8.5 of the four profiled steps, range [7, 11]: overlaps [6.5, 10.5]; the waits (median 2
    # of 4, 6, 0, 0) beside it, not in it
    assert (w.loc["W2", "trace_exposed_comm_ms"], w.loc["W2", "trace_exposed_comm_ms_low"],
            w.loc["W2", "trace_exposed_comm_ms_high"]) == (8.5, 7.0, 11.0)
    assert w.loc["W2", "trace_exposed_wait_ms"] == 2.0 and w.loc["W2", "trace_steps"] == 4
    assert not w.loc["W2", "disagree"]
    # W3: no world-size-1 cell at batch 8: the nearest (4, not 16); timer 8 in [7, 9]; trace [5, 5.2] below
    assert w.loc["W3", "sync_overhead_from"] == "W1 (per-rank batch 4, none at 8)"
    assert (w.loc["W3", "timer_exposed_comm_ms_low"], w.loc["W3", "timer_exposed_comm_ms_high"]) == (7.0, 9.0)
    assert w.loc["W3", "trace_exposed_comm_ms"] == pytest.approx(5.1) and w.loc["W3", "disagree"]
    assert w.loc["W3", "note"] == "the timers 1.80 ms above the trace beyond both intervals"  # 7 − 5.2
    assert pd.isna(w.loc["W2", "note"])
    # W4: timer [7, 9]; the trace's median 10.4 is above it but its range [8.8, 12] reaches it: agree
    assert w.loc["W4", "trace_exposed_comm_ms"] == pytest.approx(10.4) and not w.loc["W4", "disagree"]
    # W5: batch 10 is as far from 4 as from 16: the larger batch's cell
    assert w.loc["W5", "sync_overhead_from"] == "W1b (per-rank batch 16, none at 10)"
    assert w.loc["W5", "sync_overhead_ms"] == 3.0
    # N2: no overhead to subtract, so no timer witness and no verdict; nor P2: the plain W1 is not its kind
    for c in ("N2", "P2"):
        assert pd.isna(w.loc[c, "timer_exposed_comm_ms"]) and pd.isna(w.loc[c, "disagree"])
        assert w.loc[c, "note"].startswith("no timer witness")


def test_breakdown_parts_add_up_to_the_span():
    s = summary([
        # span 10 = compute alone 4 + hidden 2 + exposed 1 + memory alone 1 + idle 2
        step_row("A", 0, "1", span_ms=10.0, busy_ms=8.0, compute_ms=6.0, comm_ms=3.0, overlap_ms=2.0,
                 exposed_comm_ms=1.0, memory_ms=1.5, idle_ms=2.0, allreduce_share_of_kernel_pct=30.0),
        step_row("A", 1, "1", span_ms=12.0, busy_ms=10.0, compute_ms=6.0, comm_ms=5.0, overlap_ms=1.0,
                 exposed_comm_ms=4.0, memory_ms=0.0, idle_ms=2.0, allreduce_share_of_kernel_pct=50.0),
    ])
    b = tables.breakdown(s, RESULTS).iloc[0]
    assert (b["engine"], b["world_size"], b["n_cells"]) == ("overlap", 2, 1)
    assert b["compute_alone_ms"] == 4.5 and b["hidden_comm_ms"] == 1.5 and b["exposed_comm_ms"] == 2.5
    assert b["memory_alone_ms"] == 0.5 and b["idle_ms"] == 2.0 and b["span_ms"] == 11.0
    assert b["overlap_pct"] == pytest.approx(100 * 3 / 8)     # Σ overlap / Σ comm
    assert b["allreduce_share_pct"] == 40.0


def test_seeds_table_from_whole_window_rows():
    s = summary([
        step_row("A", 0, "all", span_ms=10.0, compute_ms=4.0, exposed_comm_ms=2.0, gpu_util_pct=50.0,
                 sm_efficiency_pct=20.0, achieved_occupancy_pct=30.0, cpu_exec_pct=60.0,
                 allreduce_share_of_kernel_pct=40.0),
        step_row("A", 1, "all", span_ms=20.0, compute_ms=4.0, exposed_comm_ms=6.0, gpu_util_pct=30.0,
                 sm_efficiency_pct=10.0, achieved_occupancy_pct=20.0, cpu_exec_pct=40.0,
                 allreduce_share_of_kernel_pct=20.0),
    ])
    t = tables.seeds_table(s, RESULTS).iloc[0]
    assert list(tables.SEEDS_HEADINGS) == list(t.index[-7:])
    assert t["kernels_pct"] == pytest.approx((40 + 20) / 2)          # 4/10, 4/20 → mean over ranks
    assert t["communication_pct"] == pytest.approx((20 + 30) / 2)    # 2/10, 6/20
    assert (t["gpu_util_pct"], t["cpu_exec_pct"], t["engine"]) == (40.0, 50.0, "overlap")


def test_rank_summary_counts_steps():
    s = summary([step_row("A", 0, "1"), step_row("A", 0, "2"), step_row("A", 0, "all")])
    r = tables.rank_summary(s, RESULTS)
    assert len(r) == 1 and r.loc[0, "n_steps"] == 2 and r.loc[0, "engine"] == "overlap"


def test_why_section_reads_witnesses_csv_and_counts_it(tmp_path):
    """The report shows bench analyze's witnesses.csv as written: its own `disagree`, never recomputed."""
    from bench.report.why_section import why_section

    run, out = tmp_path / "run", tmp_path / "report"
    run.mkdir()
    summary([step_row("X", 0, "1", span_ms=1.0)]).to_csv(run / "trace_summary.csv", index=False)
    results = pd.DataFrame([{"cell_id": "X", "engine": "overlap", "world_size": 2}])
    assert "No witnesses.csv" in "".join(why_section(run, results, out).md)
    rows = [dict.fromkeys(WITNESS_COLUMNS) for _ in range(3)]
    for row, (cell_id, ws, verdict) in zip(rows, [("X", 2, True), ("Y", 1, False), ("Z", 2, None)]):
        # the trace (0) and the timers (9) are far apart in X: only the file's verdict counts
        row.update(cell_id=cell_id, world_size=ws, disagree=verdict, trace_exposed_comm_ms=0.0,
                   timer_exposed_comm_ms=9.0)
    pd.DataFrame(rows).to_csv(run / "witnesses.csv", index=False)
    text = "".join(why_section(run, results, out).md)
    assert "1 of 2 cells (0 at world size 1): X." in text
    assert pd.read_csv(out / "tables" / "why_two_witnesses.csv")["cell_id"].tolist() == ["X", "Y", "Z"]
