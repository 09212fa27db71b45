"""`python -m bench analyze PATH [--out DIR] [--workers N]`: trace_summary.csv, bucket_timeline.csv,
idle_breakdown.csv, launch_stats.csv, kernel_classes.csv, collective_wait.csv, stragglers.csv and
rank_timeline.csv (summary.TABLES) from Kineto traces, each file in a worker process of its own, and for a
run folder witnesses.csv (the two witnesses of exposed communication, bench.analyze.tables).

PATH is a run folder (results/<run-id>: its results.csv maps each cell's `trace_dir` to cell_id and
engine), a folder of traces, or one trace file; any `*.json` / `*.json.gz` Chrome trace is accepted. The
outputs go to --out, else to the run folder, else to the current folder. A file that cannot be read gets
one error line and the others are still analysed (exit status 1); bad arguments exit 2 before anything is
written. The work is `bench.analyze.run` (api.py); this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.analyze.api import AnalyzeInputError, run
from bench.run_folder import OutError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path,
                        help="a results/<run-id>/ folder, a folder of traces, or one trace file")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: the run folder, else the current folder)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes analysing trace files side by side, one file each at a time "
                             "(default: one per usable CPU, at most one per file)")


class Progress:
    """`bench analyze: k/N trace files, s` on stderr as files finish, at most one line every PROGRESS_S
    (and the last file always), for a folder of many traces; nothing for a single file."""

    PROGRESS_S = 2.0  # a line every 2 s: a thousand files leave a readable log, a stalled one shows

    def __init__(self):
        self.t0 = self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if total > 1 and (now - self.last >= self.PROGRESS_S or done == total):
            self.last = now
            print(f"bench analyze: {done}/{total} trace files, {now - self.t0:.1f} s", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    try:
        analysis = run(args.path, args.out, args.workers, Progress())
    except (AnalyzeInputError, OutError) as exc:
        print(f"bench analyze: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the folder cannot be written (read-only, full): nothing of it was replaced
        out = args.out if args.out is not None else args.path
        print(f"bench analyze: --out={str(out)!r}: cannot write ({exc.strerror or exc}); nothing was written",
              file=sys.stderr)
        return 2
    for line in analysis.errors:
        print(f"bench analyze: {line}", file=sys.stderr)
    print("\n".join(analysis.lines()))
    return 1 if analysis.errors else 0
