"""The report's "Why" tables (bench.analyze.tables) on summaries written by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.analyze import tables
from bench.analyze.columns import TRACE_SUMMARY_COLUMNS


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


def test_two_witnesses_noise_rule():
    s = summary([
        step_row("A", 0, "1", exposed_comm_ms=1.0), step_row("A", 0, "2", exposed_comm_ms=2.0),
        step_row("A", 1, "1", exposed_comm_ms=3.0), step_row("A", 1, "2", exposed_comm_ms=4.0),
        step_row("A", 0, "all", exposed_comm_ms=99.0),  # the whole-window row is not a step
        step_row("B", 0, "1", exposed_comm_ms=5.0), step_row("B", 1, "1", exposed_comm_ms=5.0),
    ])
    w = tables.two_witnesses(s, RESULTS).set_index("cell_id")
    # A: trace median 2.5, range 3; timer 1.0 ± 0.4 → |1.5| ≤ 3.4: agree
    assert w.loc["A", "trace_exposed_comm_ms"] == 2.5 and w.loc["A", "trace_noise_ms"] == 3.0
    assert w.loc["A", "timer_noise_ms"] == pytest.approx(0.4)
    assert w.loc["A", "difference_ms"] == 1.5 and not w.loc["A", "disagree"]
    # B: trace 5 ± 0; timer 1.0 ± 0.5 → |4| > 0.5: disagree
    assert w.loc["B", "difference_ms"] == 4.0 and w.loc["B", "disagree"]


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
