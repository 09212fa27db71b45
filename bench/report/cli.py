"""`python -m bench report results/<run-id> [--out reports/<run-id>]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.report.build import build_report, default_out_dir
from bench.report.load import RunError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a results/<run-id>/ folder")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: reports/<run-id>)")


def main(args: argparse.Namespace) -> int:
    try:
        index = build_report(args.run_dir, args.out or default_out_dir(args.run_dir))
    except RunError as exc:
        print(f"bench report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {index}")
    print(f"summary: {index.parent / 'summary.md'}")
    return 0
