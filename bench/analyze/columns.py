"""The two output files' columns, in order: the contract readers (report, projection) rely on.

trace_summary.csv: one row per (trace file, profiler step) and one `step = all` row per file.
bucket_timeline.csv: one row per gradient-bucket all-reduce in a profiled step (docs/design.md).
Empty (NaN) where not measurable, never 0.
"""

from __future__ import annotations

TRACE_SUMMARY_COLUMNS = (
    "cell_id", "trace_file", "rank", "step", "device",
    "span_ms", "busy_ms", "compute_ms", "comm_ms", "memory_ms", "idle_ms", "overlap_ms", "overlap_pct",
    "exposed_comm_ms", "allreduce_ms", "allreduce_share_of_kernel_pct", "gpu_util_pct", "sm_efficiency_pct",
    "achieved_occupancy_pct", "cpu_exec_pct", "comm_bytes", "comm_busbw_gbps",
    "unlaunched_kernels", "unlaunched_ms", "window_ms",
)

BUCKET_TIMELINE_COLUMNS = (
    "cell_id", "trace_file", "rank", "step", "engine", "bucket", "bytes", "ready_ms", "comm_start_ms",
    "comm_end_ms", "backward_ms",
)

# kernel_classes.csv: one row per (trace file, kernel class) over the file's `all` window.
KERNEL_CLASS_COLUMNS = (
    "cell_id", "trace_file", "rank", "device", "n_steps", "kernel_class", "events", "time_ms",
    "time_per_step_ms",
)

ALL_STEPS = "all"  # the `step` of the whole-window row
