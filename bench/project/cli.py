"""`python -m bench project RUN [--network P[,P...] | --bw-gbps X --latency-us Y] [--world-sizes LIST]
[--gpus-per-node 8] [--nics-per-node N] [--inter-network ib-ndr400] [--algorithm auto] [--measured-on P]
[--out DIR]`.

Writes DIR (default RUN/projection/): projection.csv, validation.csv, network_fit.csv and notes.txt — data
only; `bench report RUN` draws the figure and renders the section. Exit 2 on bad input (one line naming the
key and value), before anything is written.

What-if without a run (bench/project/spec.py): `python -m bench project --spec FILE.toml` or
`--model NAME[:SIZE] | --params N` with `--step-ms T1 --per-gpu-batch B [--precision P] [--network PRESET]
[--world-sizes ...]`: projection.csv (same columns) and notes.txt in --out (default ./projection/).

The work is `bench.project.run` / `bench.project.what_if` (api.py); this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from bench.config import MAX_WORLD_SIZE
from bench.project.api import (
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_INTER_NETWORK,
    DEFAULT_WORLD_SIZES,
    MEASURED,
    NetworkOptions,
    UsageError,
    run,
    what_if,
)
from bench.project.collectives import ALGORITHMS
from bench.project.inputs import InputError
from bench.project.network import FABRICS, INTER_NODE, flat_note
from bench.project.spec import SpecError
from bench.run_folder import OutError, RunError

WORLD_SIZES_TEXT = ",".join(map(str, DEFAULT_WORLD_SIZES))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, nargs="?", default=None,
                        help="a results/<run-id>/ folder (or a what-if: --spec / --model / --params)")
    parser.add_argument("--network", default=None,
                        help=f"preset(s), comma-separated: {', '.join([*FABRICS, MEASURED])} "
                             f"(default: {MEASURED}, the run's own probe)")
    parser.add_argument("--bw-gbps", type=float, default=None,
                        help="custom network: bus bandwidth in GB/s at every size (with --latency-us)")
    parser.add_argument("--latency-us", type=float, default=None,
                        help="custom network: latency per ring step in µs (with --bw-gbps)")
    parser.add_argument("--world-sizes", default=WORLD_SIZES_TEXT,
                        help=f"comma-separated, or a doubling range like 8,16,...,1024 "
                             f"(default: {WORLD_SIZES_TEXT})")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help=f"ranks sharing an NVLink preset's node (default: {DEFAULT_GPUS_PER_NODE})")
    parser.add_argument("--nics-per-node", type=int, default=None,
                        help="NICs per node between nodes (default: one per GPU; DGX-1: 4)")
    parser.add_argument("--inter-network", default=DEFAULT_INTER_NETWORK,
                        help=f"fabric between nodes for NVLink presets: {', '.join(INTER_NODE)} "
                             f"(default: {DEFAULT_INTER_NETWORK})")
    parser.add_argument("--algorithm", default="auto",
                        help=f"all-reduce algorithm: {', '.join(ALGORITHMS)} (default: auto, the cheapest "
                             f"per message; the measured network is ring only)")
    parser.add_argument("--measured-on", default=None,
                        help="the --network preset that describes the GPUs the run measured on: its "
                             "projections are anchored to the run's measured world sizes, as the run's own "
                             "network's always are (docs/projection.md)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: RUN/projection; what-if: ./projection)")
    what_if_flags = parser.add_argument_group("what-if without a run (docs/projection.md)")
    what_if_flags.add_argument("--spec", type=Path, default=None, help="a TOML file of spec keys")
    for flag, kind, words in SPEC_FLAGS:
        what_if_flags.add_argument(flag, type=kind, default=None, help=words)


def parse_world_sizes(text: str) -> list[int]:
    """'1,2,4' or a range '8,16,...,1024' (first two give the ratio; the last must be reached exactly)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        if "..." in parts:
            if len(parts) != 4 or parts[2] != "...":
                raise ValueError
            a, b, last = int(parts[0]), int(parts[1]), int(parts[3])
            if a < 1 or b <= a or b % a:
                raise ValueError
            sizes = [a]
            while sizes[-1] < last:
                sizes.append(sizes[-1] * (b // a))
            if sizes[-1] != last:
                raise ValueError
        else:
            sizes = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"--world-sizes={text!r}: expected positive integers like 1,2,4 or a range like "
                         f"8,16,...,1024") from None
    if any(n < 1 or n > MAX_WORLD_SIZE for n in sizes):
        raise UsageError(f"--world-sizes={text!r}: world sizes must lie in [1, {MAX_WORLD_SIZE}]")
    return sorted(set(sizes))


def main(args: argparse.Namespace) -> int:
    if args.spec is not None or any(getattr(args, _dest(f)) is not None for f, _, _ in SPEC_FLAGS):
        return spec_main(args)
    if args.run_dir is None:
        print("bench project: run_dir=None: give a results/<run-id>/ folder, or --spec / --model / --params "
              "for a what-if", file=sys.stderr)
        return 2
    return _printed(lambda: _run_lines(args), (UsageError, InputError, RunError, OutError), args.out)


def _printed(lines: Callable[[], list[str]], refused: tuple[type[Exception], ...], out: Path | None) -> int:
    """Print what `lines` gives, exit 0; or the one line saying why not, exit 2: a `refused` error (bad
    input, named key and value), or an OSError (the folder cannot be written: read-only, full)."""
    try:
        printed = lines()
    except refused as exc:
        print(f"bench project: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"bench project: --out={str(out)!r}: cannot write ({exc.strerror or exc})", file=sys.stderr)
        return 2
    print("\n".join(printed))
    return 0


def _run_lines(args: argparse.Namespace) -> list[str]:
    """The projection of a run (api.run) and what it prints."""
    networks = None if args.network is None else args.network.split(",")
    per_node = DEFAULT_GPUS_PER_NODE if args.gpus_per_node is None else args.gpus_per_node
    options = NetworkOptions(gpus_per_node=per_node, inter_network=args.inter_network,
                             nics_per_node=args.nics_per_node, bw_gbps=args.bw_gbps,
                             latency_us=args.latency_us, algorithm=args.algorithm,
                             measured_on=args.measured_on)
    projection = run(args.run_dir, networks, parse_world_sizes(args.world_sizes), options=options,
                     out=args.out)
    return [*projection.lines(), *flat_notes(networks or [], args.gpus_per_node)]


def flat_notes(networks: list[str], gpus_per_node: int | None) -> list[str]:
    """network.flat_note for each flat preset given with --gpus-per-node."""
    return [n for n in (flat_note(name, gpus_per_node) for name in networks) if n]


# what-if flags: (flag, type, help); each maps to the spec key of its name (--step-ms → step_ms)
SPEC_FLAGS = (
    ("--model", str, "built-in workload NAME[:SIZE] (its layout is built on the meta device)"),
    ("--params", str, "or a trainable parameter count: 360M, 1.5B, 1e9 (torch DDP's bucket layout)"),
    ("--step-ms", float, "the 1-GPU step time T1 in ms"),
    ("--per-gpu-batch", int, "samples per GPU per micro-step"),
    ("--precision", str, "fp32, tf32, bf16 or fp16 (recorded; gradients are fp32 unless --comm-dtype)"),
    ("--comm-dtype", str, "none, fp16 or bf16 on the wire"),
    ("--grad-accum", str, "micro-steps per all-reduce"),
    ("--bucket-cap-mb", str, "DDP bucket cap (default 25)"),
    ("--step-cv", float, "per-rank step-time spread σ (default: the corpus fit)"),
    ("--interference", float, "compute slowdown per ms of overlapped all-reduce γ (default: the corpus fit)"),
    ("--host-ms", float, "host floor: the step cannot be shorter (default 0)"),
)
# flags that take a comma-separated list, compared in one call (spec.LIST_KEYS): each item's type
LIST_FLAGS = {"--bucket-cap-mb": float, "--comm-dtype": str, "--grad-accum": int, "--precision": str}


def _listed(flag: str, text: str):
    """A LIST_FLAGS value: one item, or a list of them ('1,25,100'); SpecError naming the flag and value."""
    kind = LIST_FLAGS[flag]
    try:
        items = [kind(x.strip()) for x in text.split(",")]
    except ValueError:
        raise SpecError(f"{flag}={text!r}: expected {kind.__name__} values, comma-separated") from None
    return items if len(items) > 1 else items[0]


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def spec_main(args: argparse.Namespace) -> int:
    """The what-if: projection.csv and notes.txt from a spec, nothing measured."""
    return _printed(lambda: _spec_lines(args), (SpecError, UsageError, OutError), args.out)


def _spec_lines(args: argparse.Namespace) -> list[str]:
    """The what-if of the spec file and flags (api.what_if) and what it prints."""
    from bench.project.spec import read_spec

    if args.run_dir is not None:
        raise SpecError(f"run_dir={str(args.run_dir)!r}: a what-if (--spec/--model/--params) takes "
                        f"no run folder")
    if args.measured_on is not None:
        raise SpecError(f"--measured-on={args.measured_on!r}: a what-if measured nothing to anchor to")
    if args.bw_gbps is not None or args.latency_us is not None:
        raise SpecError(f"--bw-gbps={args.bw_gbps} --latency-us={args.latency_us}: a what-if takes a "
                        f"--network preset")
    keys = read_spec(args.spec) if args.spec is not None else {}
    for flag, _, _ in SPEC_FLAGS:
        value = getattr(args, _dest(flag))
        if value is not None:
            keys[_dest(flag)] = _listed(flag, value) if flag in LIST_FLAGS else value
    if args.model is not None:
        keys["model"], _, keys["size"] = args.model.partition(":")
    if args.network is not None:  # several, comma-separated: one what-if per network
        names = args.network.split(",")
        keys["network"] = names if len(names) > 1 else names[0]
    if args.world_sizes != WORLD_SIZES_TEXT or "world_sizes" not in keys:
        keys["world_sizes"] = parse_world_sizes(args.world_sizes)
    if args.gpus_per_node is not None:
        keys.setdefault("gpus_per_node", args.gpus_per_node)
    keys.setdefault("inter_network", args.inter_network)
    if args.nics_per_node is not None:
        keys.setdefault("nics_per_node", args.nics_per_node)
    keys.setdefault("algorithm", args.algorithm)
    projection = what_if(keys, out=args.out)
    networks = keys.get("network", [])
    return [*projection.lines(), *flat_notes(networks if isinstance(networks, list) else
                                             str(networks).split(","), args.gpus_per_node)]
