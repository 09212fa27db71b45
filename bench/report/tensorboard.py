"""`python -m bench tensorboard results/<run-id> [--port N] [--host 127.0.0.1]`.

Serves the run's `traces/` with the torch-tb-profiler plugin: each `traces/<cell_id>/` folder is a run,
each `rank<r>.*.pt.trace.json.gz` a worker. The plugin (0.4.3, the last release) is deprecated upstream
but still loads with TensorBoard 2.21; it starts a multiprocessing Manager with the "spawn" method, which
is why this must run from a module with a `__main__` guard (`python -m bench` has one).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import signal
import sys
import threading
from pathlib import Path

from bench.schema import TRACE_GLOB

PLUGIN_ENTRY_POINT = "torch_profiler"  # torch-tb-profiler's [tensorboard_plugins] entry point
PLUGIN_ROUTE = "pytorch_profiler"  # its plugin_name: the URL fragment and /data/plugin/<name>/ prefix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a results/<run-id>/ folder with traces/")
    parser.add_argument(
        "--port", type=int, default=6006, help="port to serve on (default 6006; 0 = any free)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)",
    )


def check_traces(run_dir: Path) -> str:
    """Why the run's traces cannot be served ('' when they can)."""
    traces = run_dir / "traces"
    if not traces.is_dir():
        return (
            f"{traces}: no traces folder. Was the run profiled ([profile] in the preset)? "
            f"Traces are written to results/<run-id>/traces/<cell_id>/rank<r>.*.pt.trace.json.gz."
        )
    if not any(traces.rglob(TRACE_GLOB)):
        return f"{traces}: no {TRACE_GLOB} files in it (every profiled cell may have failed)."
    return ""


def plugin_installed() -> bool:
    """Whether TensorBoard will find torch-tb-profiler (it discovers plugins through entry points)."""
    return any(
        ep.name == PLUGIN_ENTRY_POINT for ep in importlib.metadata.entry_points(group="tensorboard_plugins")
    )


def main(args: argparse.Namespace) -> int:
    problem = check_traces(args.run_dir)
    if problem:
        print(f"bench tensorboard: {problem}", file=sys.stderr)
        return 2
    if not plugin_installed():
        print(
            "bench tensorboard: the torch-tb-profiler plugin is not installed "
            "(pip install torch-tb-profiler); without it TensorBoard cannot show traces.",
            file=sys.stderr,
        )
        return 2
    from tensorboard import program

    tb = program.TensorBoard()
    # --load_fast=false: traces need no event-file loading, so skip the Rust data-server subprocess.
    tb.configure(
        argv=[
            None,
            "--logdir",
            str((args.run_dir / "traces").resolve()),
            "--port",
            str(args.port),
            "--host",
            args.host,
            "--load_fast=false",
        ]
    )
    url = tb.launch()
    cells = sorted(
        {
            p.parent.relative_to(args.run_dir / "traces").as_posix()
            for p in (args.run_dir / "traces").rglob(TRACE_GLOB)
        }
    )
    print(f"TensorBoard serving {len(cells)} cells of {args.run_dir} at {url}#{PLUGIN_ROUTE}", flush=True)
    print(
        "PyTorch Profiler tab: pick a cell under Runs and a rank under Workers. Ctrl-C stops it.", flush=True
    )
    # SIGTERM exits like Ctrl-C, so the plugin's atexit clean-up (its Manager process, temp dir) runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    return 0
