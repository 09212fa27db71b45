"""Serve a run's traces in TensorBoard (`python -m bench tensorboard`, in bench.report.commands).

It serves the run's `traces/` with the torch-tb-profiler plugin: each `traces/<cell_id>/` folder is a run,
each `rank<r>.*.pt.trace.json.gz` a worker. The plugin (0.4.3, the last release) is deprecated upstream
but still loads with TensorBoard 2.21; it starts a multiprocessing Manager with the "spawn" method, which
is why this must run from a module with a `__main__` guard (`python -m bench` has one).
"""

from __future__ import annotations

import importlib.metadata
import signal
import sys
import threading
from pathlib import Path

from bench import run_folder
from bench.schema import TRACE_GLOB

PLUGIN_ENTRY_POINT = "torch_profiler"  # torch-tb-profiler's [tensorboard_plugins] entry point
PLUGIN_ROUTE = "pytorch_profiler"  # its plugin_name: the URL fragment and /data/plugin/<name>/ prefix


def check_traces(run_dir: Path) -> str:
    """Why the run's traces cannot be served ('' when they can)."""
    traces = run_dir / run_folder.TRACES
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


def cannot_serve(run_dir: Path) -> str:
    """Why `serve` cannot show this run's traces ('' when it can): no traces, or no plugin to show them."""
    problem = check_traces(run_dir)
    if not problem and not plugin_installed():
        problem = (
            "the torch-tb-profiler plugin is not installed (pip install torch-tb-profiler); without it "
            "TensorBoard cannot show traces."
        )
    return problem


def port_problem(host: str, port: int) -> str | None:
    """Why TensorBoard cannot listen on host:port (out of range, in use, an unknown address), or None."""
    import socket

    if not 0 <= port <= 65535:
        return f"--port={port}: must be between 0 (any free port) and 65535"
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as e:
        return f"--port={port} --host={host!r}: cannot listen there ({e.strerror or e})"
    return None


def serve(run_dir: Path, port: int, host: str) -> None:
    """Serve `run_dir`/traces with TensorBoard on host:port, print the address, and block until Ctrl-C or
    SIGTERM."""
    from tensorboard import program

    traces = run_dir / run_folder.TRACES
    tb = program.TensorBoard()
    # --load_fast=false: traces need no event-file loading, so skip the Rust data-server subprocess.
    argv = [None, "--logdir", str(traces.resolve()), "--port", str(port), "--host", host, "--load_fast=false"]
    tb.configure(argv=argv)
    url = tb.launch()
    cells = sorted({p.parent.relative_to(traces).as_posix() for p in traces.rglob(TRACE_GLOB)})
    print(f"TensorBoard serving {len(cells)} cells of {run_dir} at {url}#{PLUGIN_ROUTE}", flush=True)
    print(
        "PyTorch Profiler tab: pick a cell under Runs and a rank under Workers. Ctrl-C stops it.", flush=True
    )
    # SIGTERM exits like Ctrl-C, so the plugin's atexit clean-up (its Manager process, temp dir) runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
