"""`bench analyze`: why a cell scales as it does, computed from its Kineto traces on GPU and CPU.

load (one trace file → columns) → classify (kernel and event classes) → steps (profiler-step windows)
→ gpu / cpu (one window's breakdown) → summary (trace_summary.csv rows) and timeline
(bucket_timeline.csv rows) → tables (the report's DataFrames). Definitions: docs/analysis.md.
Reads JSON and CSV only: nothing here imports torch.

The function under the command: `bench.analyze.run(path, out=None) -> Analysis` (api.py).
"""


def __getattr__(name: str):
    """`bench.analyze.run` and `Analysis`, imported on first use (the submodules load pandas)."""
    if name in ("run", "Analysis", "AnalyzeInputError"):
        from bench.analyze import api

        return getattr(api, name)
    raise AttributeError(f"module 'bench.analyze' has no attribute {name!r}")
