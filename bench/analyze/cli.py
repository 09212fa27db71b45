"""`python -m bench analyze PATH [--out DIR]`: trace_summary.csv, bucket_timeline.csv, idle_breakdown.csv,
launch_stats.csv, stragglers.csv and kernel_classes.csv (summary.TABLES) from Kineto traces, and for a run
folder witnesses.csv (the two witnesses of exposed communication, bench.analyze.tables).

PATH is a run folder (results/<run-id>: its results.csv maps each cell's `trace_dir` to cell_id and
engine), a folder of traces, or one trace file; any `*.json` / `*.json.gz` Chrome trace is accepted. The
outputs go to --out, else to the run folder, else to the current folder. A file that cannot be read gets
one error line and the others are still analysed (exit status 1); bad arguments exit 2 before anything is
written. The work is `bench.analyze.run` (api.py); this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.analyze.api import AnalyzeInputError, run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path,
                        help="a results/<run-id>/ folder, a folder of traces, or one trace file")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: the run folder, else the current folder)")


def main(args: argparse.Namespace) -> int:
    try:
        analysis = run(args.path, args.out)
    except AnalyzeInputError as exc:
        print(f"bench analyze: {exc}", file=sys.stderr)
        return 2
    for line in analysis.errors:
        print(f"bench analyze: {line}", file=sys.stderr)
    print("\n".join(analysis.lines()))
    return 1 if analysis.errors else 0
