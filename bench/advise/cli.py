"""`python -m bench advise RUN [--global-batch B] [--precision P] [--baseline KEY=VALUE,…] [--target-gpus N]
[--network P] [--gpus-per-node G] [--inter-network I] [--memory-gb M] [--out DIR]`.

Prints the answer first, then writes DIR (default RUN/advice/): advice.md (the answer, the ranking, what
did not make it), advice.csv (one row per configuration of the recipe: its speedup over torch DDP's
defaults with the interval, its projection to the target, into DIR/projection/), best.toml (a ddpbench
config of the advised configuration and its baseline at the target) and ddp.md (the settings for your own
script, the launch lines). Exit 2 on bad input, before anything is written. The work is
`bench.advise.run` (api.py); this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import run_folder
from bench.advise.answer import Target
from bench.advise.api import (
    DEFAULT_NETWORK,
    DEFAULT_TARGET_GPUS,
    NETWORKS,
    TRAINING_PRECISIONS,
    UsageError,
    run,
)
from bench.advise.baseline import BASELINE_KEYS
from bench.project.api import DEFAULT_GPUS_PER_NODE, DEFAULT_INTER_NETWORK
from bench.project.network import INTER_NODE, flat_note
from bench.run_folder import OutError, RunError

TARGET_HELP = ("the cluster the advice is projected to. An NVLink preset (h100-nvlink, a100-nvlink, "
               "b200-nvlink, v100-dgx*) is the fabric inside nodes of --gpus-per-node GPUs, with "
               "--inter-network between them: 4 nodes of 8 H100 on NDR InfiniBand is --target-gpus 32 "
               "--network h100-nvlink --gpus-per-node 8 --inter-network ib-ndr400. A network preset "
               "(ib-ndr400, eth-100g) alone is flat: every GPU on its own NIC, no NVLink. measured: the "
               "run's own all-reduce probe")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a results/<run-id>/ folder")
    parser.add_argument("--global-batch", type=int, default=None, metavar="B",
                        help="the recipe: samples per optimizer step (results.csv global_batch) at the "
                             "largest measured world size (default: the one with the most configurations)")
    parser.add_argument("--precision", default=None, metavar="P",
                        help=f"the precision you train in: the answer compares configurations at it "
                             f"(default: the first of {', '.join(TRAINING_PRECISIONS)} the recipe was "
                             f"measured at; the answer says which it measured)")
    parser.add_argument("--baseline", default=None, metavar="KEY=VALUE,...",
                        help=f"what the speedups are against (default: torch DDP's defaults: engine=torch, "
                             f"no engine options, comm_dtype=none, bucket_cap_mb=25 or the nearest, the "
                             f"least accumulation, each row's precision); keys: {', '.join(BASELINE_KEYS)}")
    target = parser.add_argument_group("target", TARGET_HELP)
    target.add_argument("--target-gpus", type=int, default=DEFAULT_TARGET_GPUS,
                        help=f"GPUs (ranks) of the target (default: {DEFAULT_TARGET_GPUS})")
    target.add_argument("--network", default=DEFAULT_NETWORK,
                        help=f"{', '.join(NETWORKS)} (default: {DEFAULT_NETWORK})")
    target.add_argument("--gpus-per-node", type=int, default=None,
                        help=f"GPUs in a node of an NVLink preset (default: {DEFAULT_GPUS_PER_NODE})")
    target.add_argument("--inter-network", default=DEFAULT_INTER_NETWORK,
                        help=f"between the nodes of an NVLink preset: {', '.join(INTER_NODE)} "
                             f"(default: {DEFAULT_INTER_NETWORK})")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="leave out configurations over this many GiB per GPU: device_used_mb (what the "
                             "GPU holds for the process), else peak_reserved_mb, else peak_mem_mb (CPU: RSS)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: RUN/{run_folder.ADVICE_DIR})")


def main(args: argparse.Namespace) -> int:
    per_node = DEFAULT_GPUS_PER_NODE if args.gpus_per_node is None else args.gpus_per_node
    target = Target(args.target_gpus, args.network, per_node, args.inter_network)
    try:
        advice = run(args.run_dir, target, args.memory_gb, args.out, global_batch=args.global_batch,
                     baseline=args.baseline, precision=args.precision)
    except (UsageError, RunError, OutError) as exc:
        print(f"bench advise: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the folder cannot be written (read-only, full)
        print(f"bench advise: --out={str(args.out)!r}: cannot write ({exc.strerror or exc})", file=sys.stderr)
        return 2
    note = flat_note(args.network, args.gpus_per_node)
    print("\n".join([*advice.lines(), *([note] if note else [])]))
    return 0
