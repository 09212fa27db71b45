"""`python -m bench advise RUN [--target-gpus N] [--network PRESET] [--memory-gb M] [--out DIR]`.

Prints the short answer first, then writes DIR (default RUN/advice/): advice.md (the answer, the ranking,
the caveats) and advice.csv (one row per configuration at the largest measured world size, ranked, with its
projection to --target-gpus on --network, into DIR/projection/). Exit 2 on bad input, before anything is
written. The work is `bench.advise.run` (api.py); this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import run_folder
from bench.advise.answer import Target
from bench.advise.api import DEFAULT_NETWORK, DEFAULT_TARGET_GPUS, NETWORKS, UsageError, run
from bench.run_folder import OutError, RunError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a results/<run-id>/ folder")
    parser.add_argument("--target-gpus", type=int, default=DEFAULT_TARGET_GPUS,
                        help=f"world size to project the top configurations to "
                             f"(default: {DEFAULT_TARGET_GPUS})")
    parser.add_argument("--network", default=DEFAULT_NETWORK,
                        help=f"network preset for the projection: {', '.join(NETWORKS)} "
                             f"(default: {DEFAULT_NETWORK})")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="exclude configurations whose peak memory (peak_mem_mb) is over this many GiB")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: RUN/{run_folder.ADVICE_DIR})")


def main(args: argparse.Namespace) -> int:
    try:
        advice = run(args.run_dir, Target(args.target_gpus, args.network), args.memory_gb, args.out)
    except (UsageError, RunError, OutError) as exc:
        print(f"bench advise: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the folder cannot be written (read-only, full)
        print(f"bench advise: --out={str(args.out)!r}: cannot write ({exc.strerror or exc})", file=sys.stderr)
        return 2
    print("\n".join(advice.lines()))
    return 0
