"""The output files' columns, in order: the contract readers (report, projection) rely on.

trace_summary.csv: one row per (trace file, profiler step) and one `step = all` row per file.
bucket_timeline.csv: one row per gradient-bucket all-reduce in a profiled step (docs/analysis.md).
Empty (NaN) where not measurable, never 0.
"""

from __future__ import annotations

TRACE_SUMMARY_COLUMNS = (
    "cell_id", "trace_file", "rank", "step", "device",
    "span_ms", "busy_ms", "compute_ms", "comm_ms", "memory_ms", "idle_ms", "overlap_ms", "overlap_pct",
    "exposed_comm_ms", "allreduce_ms", "allreduce_share_of_kernel_pct", "gpu_util_pct", "sm_efficiency_pct",
    "achieved_occupancy_pct", "cpu_exec_pct", "comm_bytes", "comm_busbw_gbps",
    "unlaunched_kernels", "unlaunched_ms", "barrier_ms", "exposed_comm_excl_barrier_ms", "window_ms",
    # FSDP's collectives (all-gather of parameters, reduce-scatter of gradients), like allreduce_ms; a gloo
    # trace whose reduce-scatters ran as all-reduces (classify.REDUCE_SCATTER_ISSUE_OP) leaves
    # reduce_scatter_ms empty (they are in allreduce_ms)
    "allgather_ms", "reduce_scatter_ms",
    # communication other than barriers split by aligning each collective across the job's ranks
    # (bench/analyze/waits.py; empty for a single-rank job): waiting for the last rank, and the rest
    "wait_ms", "transfer_ms", "exposed_wait_ms", "exposed_transfer_ms",
)

BUCKET_TIMELINE_COLUMNS = (
    "cell_id", "trace_file", "rank", "step", "engine", "bucket", "bytes", "ready_ms", "comm_start_ms",
    "comm_end_ms", "backward_ms",
)

# witnesses.csv (a run folder only): per profiled cell, the two witnesses of exposed communication per step,
# their 95 % intervals / ranges and the engine's sync overhead they are corrected for (docs/analysis.md).
WITNESS_COLUMNS = (
    "cell_id", "world_size", "timer_exposed_comm_ms", "trace_exposed_comm_ms", "sync_overhead_ms", "disagree",
    "timer_exposed_comm_ms_low", "timer_exposed_comm_ms_high", "trace_exposed_comm_ms_low",
    "trace_exposed_comm_ms_high", "sync_overhead_ms_low", "sync_overhead_ms_high", "sync_overhead_from",
    "step_minus_compute_only_ms", "trace_exposed_wait_ms", "trace_steps", "note",
)

# kernel_classes.csv: one row per (trace file, kernel class) over the file's `all` window; the overlapped_*
# columns: its kernels that ran under communication and had a twin (same name) that ran alone, their time,
# and the time their alone twins' medians give (kernel_classes.py, the interference witness).
KERNEL_CLASS_COLUMNS = (
    "cell_id", "trace_file", "rank", "device", "n_steps", "kernel_class", "events", "time_ms",
    "time_per_step_ms", "overlapped_events", "overlapped_ms", "overlapped_alone_ms",
)

ALL_STEPS = "all"  # the `step` of the whole-window row

# idle_breakdown.csv (bench/analyze/idle.py): per (trace file, step, stream), HTA's idle-time categories.
IDLE_BREAKDOWN_COLUMNS = (
    "cell_id", "trace_file", "rank", "step", "stream",
    "idle_ms", "host_wait_ms", "kernel_wait_ms", "other_wait_ms", "host_wait_pct",
)

# launch_stats.csv (bench/analyze/launch.py): per (trace file, step), the launches' delay distribution and
# whether the host set the pace; host_busy_ms: the training thread's window outside blocking syncs.
LAUNCH_STATS_COLUMNS = (
    "cell_id", "trace_file", "rank", "step", "launches",
    "launch_delay_us_p50", "launch_delay_us_p90", "launch_delay_us_max",
    "cpu_duration_us_p50", "cpu_duration_us_p90", "cpu_duration_us_max",
    "gpu_duration_us_p50", "gpu_duration_us_p90", "gpu_duration_us_max",
    "short_kernels_pct", "window_ms", "host_us_per_launch", "gpu_busy_pct", "compute_stream", "host_wait_pct",
    "launch_bound", "host_busy_ms",
)

# collective_wait.csv (bench/analyze/waits.py): one row per rank and collective of a job of two or more ranks:
# until the last rank joined (joined_ms), the part of that no earlier collective of the rank waited (wait_ms:
# a rank's rows add up) and its transfer; start_ms on the aligned clock from the step's earliest start.
COLLECTIVE_WAIT_COLUMNS = (
    "cell_id", "job", "trace_file", "rank", "step", "collective", "process_group", "seq", "ordinal", "bytes",
    "start_ms", "joined_ms", "wait_ms", "transfer_ms", "last_rank", "ranks", "clock_offset_ms", "clock",
)

# rank_timeline.csv (bench/analyze/waits.py): one step per multi-rank job, each rank's host window, compute,
# wait and transfer segments on the aligned clock (the report's per-rank timeline figure).
RANK_TIMELINE_COLUMNS = ("cell_id", "job", "rank", "step", "kind", "start_ms", "end_ms")

# stragglers.csv (bench/analyze/waits.py): per (job, step), the rank the others waited for.
STRAGGLER_COLUMNS = ("cell_id", "job", "step", "ranks", "straggler_rank", "late_by_ms", "spread_ms")
