"""`bench analyze`: why a cell scales as it does, computed from its Kineto traces on GPU and CPU.

load (one trace file → columns) → classify (kernel and event classes) → steps (profiler-step windows)
→ gpu / cpu (one window's breakdown) → summary (trace_summary.csv rows) and timeline
(bucket_timeline.csv rows) → tables (the report's DataFrames). Definitions: docs/design.md, "bench analyze".
Reads JSON and CSV only: nothing here imports torch.
"""
