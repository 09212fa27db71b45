"""The report's commands, `python -m bench report | compare | tensorboard`: for each command a pair
`<command>_add_arguments(parser)` and `<command>_main(args) -> int` (bench/__main__.py dispatches on the
prefix).

Bad input (a missing run folder, rows that break the contract, runs that must not be compared, nothing to
serve) is one line on stderr and exit code 2. Each main imports the page it makes when it runs, so that
`tensorboard` does not load pandas and matplotlib.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def unusable_out(out: Path | None, command: str) -> str | None:
    """Why --out cannot be the page's folder (bench.run_folder.out_problem: a file, or under one; another
    command's part of a run folder; a folder holding files this command did not write there), or None;
    checked again when the page is written (render.page_folder)."""
    from bench.run_folder import out_problem

    return None if out is None else out_problem(out, command, page=True)


def _write_page(command: str, out: Path | None, write: Callable[[], Path], what: str) -> Path | None:
    """`write()`'s index.html, or None once the reason it cannot be written is one line on stderr: an --out
    that cannot be the page's folder, bad input (RunError), or an output folder that cannot be written
    (read-only, full)."""
    from bench.run_folder import RunError

    problem = unusable_out(out, command)
    if problem:
        print(f"bench {command}: {problem}", file=sys.stderr)
        return None
    try:
        return write()
    except RunError as exc:
        print(f"bench {command}: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"bench {command}: --out={str(out)!r}: cannot write {what} ({exc.strerror or exc})",
              file=sys.stderr)
    return None


def report_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a results/<run-id>/ folder")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: reports/<run-id>)")


def report_main(args: argparse.Namespace) -> int:
    """`python -m bench report results/<run-id> [--out reports/<run-id>]`."""
    from bench.report.run_page import write_run_page

    index = _write_page("report", args.out, lambda: write_run_page(args.run_dir, args.out), "the report")
    if index is None:
        return 2
    print(f"report: {index}")
    print(f"summary: {index.parent / 'summary.md'}")
    return 0


def compare_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        type=Path,
        nargs="+",
        help="two or more results/<run-id>/ folders; the first is the baseline",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: reports/compare-<A>-vs-<B>...)"
    )
    parser.add_argument(
        "--allow-mixed-devices",
        action="store_true",
        help="compare CPU runs with GPU runs anyway (refused by default)",
    )


def compare_main(args: argparse.Namespace) -> int:
    """`python -m bench compare results/A results/B [more ...] [--out DIR] [--allow-mixed-devices]`."""
    from bench.report.compare_page import write_compare_page

    def write() -> Path:
        return write_compare_page(args.run_dirs, args.out, args.allow_mixed_devices)

    index = _write_page("compare", args.out, write, "the page")
    if index is None:
        return 2
    from bench.report.comparability import search_warning
    from bench.run_folder import load_run

    warning = search_warning([load_run(d) for d in args.run_dirs])
    if warning:
        print(f"note: {warning}")
    print(f"compare: {index}")
    return 0


def tensorboard_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a results/<run-id>/ folder with traces/")
    parser.add_argument(
        "--port", type=int, default=6006, help="port to serve on (default 6006; 0 = any free)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)",
    )


def tensorboard_main(args: argparse.Namespace) -> int:
    """`python -m bench tensorboard results/<run-id> [--port N] [--host 127.0.0.1]`, until Ctrl-C."""
    from bench.report import tensorboard

    problem = tensorboard.cannot_serve(args.run_dir) or tensorboard.port_problem(args.host, args.port)
    if problem:
        print(f"bench tensorboard: {problem}", file=sys.stderr)
        return 2
    tensorboard.serve(args.run_dir, args.port, args.host)
    return 0
