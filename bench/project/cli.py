"""`python -m bench project RUN [--network P[,P...] | --bw-gbps X --latency-us Y] [--world-sizes LIST]
[--gpus-per-node 8] [--nics-per-node N] [--inter-network ib-ndr400] [--algorithm auto] [--out DIR]`.

Writes DIR (default RUN/projection/): projection.csv, validation.csv, network_fit.csv and notes.txt — data
only; `bench report RUN` draws the figure and renders the section. Exit 2 on bad input (one line naming the
key and value), before anything is written.

What-if without a run (bench/project/spec.py): `python -m bench project --spec FILE.toml` or
`--model NAME[:SIZE] | --params N` with `--step-ms T1 --per-gpu-batch B [--precision P] [--network PRESET]
[--world-sizes ...]`: projection.csv (same columns) and notes.txt in --out (default ./projection/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.project.collectives import ALGORITHMS
from bench.project.evidence import read_evidence
from bench.project.inputs import InputError, read_sweep, read_timeline
from bench.project.measured import Measured, fits_table, measured_fits
from bench.project.network import FABRICS, INTER_NODE, custom_network, preset_network
from bench.project.project import (
    configurations,
    median_abs_error,
    projection_table,
    validation_table,
    with_evidence,
    workload_shapes,
)
from bench.run_folder import RunError, load_run
from bench.schema import WIRE_DTYPES

MEASURED = "measured"
DEFAULT_WORLD_SIZES = "1,2,4,8,16,32,64,128,256,512,1024"


class UsageError(ValueError):
    """A bad argument: the message names the key and the value."""


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
    parser.add_argument("--world-sizes", default=DEFAULT_WORLD_SIZES,
                        help=f"comma-separated, or a doubling range like 8,16,...,1024 "
                             f"(default: {DEFAULT_WORLD_SIZES})")
    parser.add_argument("--gpus-per-node", type=int, default=8,
                        help="ranks sharing an NVLink preset's node (default: 8)")
    parser.add_argument("--nics-per-node", type=int, default=None,
                        help="NICs per node between nodes (default: one per GPU; DGX-1: 4)")
    parser.add_argument("--inter-network", default="ib-ndr400",
                        help=f"fabric between nodes for NVLink presets: {', '.join(INTER_NODE)} "
                             f"(default: ib-ndr400)")
    parser.add_argument("--algorithm", default="auto",
                        help=f"all-reduce algorithm: {', '.join(ALGORITHMS)} (default: auto, the cheapest "
                             f"per message; the measured network is ring only)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: RUN/projection; what-if: ./projection)")
    what_if = parser.add_argument_group("what-if without a run (docs/projection.md)")
    what_if.add_argument("--spec", type=Path, default=None, help="a TOML file of spec keys")
    for flag, kind, words in SPEC_FLAGS:
        what_if.add_argument(flag, type=kind, default=None, help=words)


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
    if any(n < 1 for n in sizes):
        raise UsageError(f"--world-sizes={text!r}: world sizes must be >= 1")
    return sorted(set(sizes))


def _networks(args, world_sizes: list[int]) -> dict:
    """Name → Network for every preset asked for (the measured one is added by main)."""
    custom = args.bw_gbps is not None or args.latency_us is not None
    if custom and args.network is not None:
        raise UsageError(f"--network={args.network!r} and --bw-gbps/--latency-us: give one or the other")
    if custom:
        if args.bw_gbps is None or args.latency_us is None:
            raise UsageError(f"--bw-gbps={args.bw_gbps} --latency-us={args.latency_us}: give both")
        try:
            return {"custom": custom_network(args.bw_gbps, args.latency_us)}
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node={args.gpus_per_node} must be >= 1")
    if args.inter_network not in INTER_NODE:
        raise UsageError(f"--inter-network={args.inter_network!r} is not one of {list(INTER_NODE)}")
    if args.nics_per_node is not None and args.nics_per_node < 1:
        raise UsageError(f"--nics-per-node={args.nics_per_node} must be >= 1")
    out = {}
    for name in (args.network or MEASURED).split(","):
        name = name.strip()
        if name == MEASURED:
            out[name] = None
            continue
        if name not in FABRICS:
            raise UsageError(f"--network={name!r} is not a preset; choose from {[*FABRICS, MEASURED]}")
        net = preset_network(name, args.gpus_per_node, args.inter_network, args.nics_per_node)
        for n in world_sizes:
            try:
                net.nodes(n)
            except ValueError:
                raise UsageError(f"--world-sizes: {n} is not a multiple of "
                                 f"--gpus-per-node={args.gpus_per_node} (network {name})") from None
        out[name] = net
    return out


def main(args: argparse.Namespace) -> int:
    if args.spec is not None or any(getattr(args, _dest(f)) is not None for f, _, _ in SPEC_FLAGS):
        return spec_main(args)
    if args.run_dir is None:
        print("bench project: run_dir=None: give a results/<run-id>/ folder, or --spec / --model / --params "
              "for a what-if", file=sys.stderr)
        return 2
    try:
        if args.algorithm not in ALGORITHMS:
            raise UsageError(f"--algorithm={args.algorithm!r} is not one of {list(ALGORITHMS)}")
        world_sizes = parse_world_sizes(args.world_sizes)
        presets = _networks(args, world_sizes)
        run = load_run(args.run_dir)
        timeline, sweep = read_timeline(args.run_dir), read_sweep(args.run_dir)
        workload = run.config.get("workload", {})
        configs = configurations(run.results, timeline, _layout(args.run_dir, workload),
                                 workload_shapes(workload))
        evidence = read_evidence(args.run_dir)
        configs = [with_evidence(c, evidence) if c.compute is not None else c for c in configs]
    except (UsageError, InputError) as exc:
        print(f"bench project: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"bench project: run={str(args.run_dir)!r}: {exc}", file=sys.stderr)
        return 2

    fits, notes = measured_fits(run.results, sweep)
    measured = Measured(fits)
    networks = {name: measured.network_at if net is None else (lambda n, dtype, net=net: (net, net.label))
                for name, net in presets.items()}
    if run.device == "cpu" and any(n in FABRICS for n in presets):
        notes.append("compute measured on CPU, network of GPUs: a what-if, not a prediction for a GPU "
                     "cluster")
    if timeline is None:
        notes.append("no bucket_timeline.csv (run `bench analyze` on a profiled run): buckets are assumed "
                     "ready uniformly over backward")
    # one line per configuration: notes.txt keeps them all, the printout only says where they are
    physics = [f"{run_folder.PHYSICS_NOTE}{c.base['cell_id']}: {c.physics_source}"
               for c in configs if c.physics_source]
    projection = projection_table(configs, networks, world_sizes, args.algorithm)
    validation = validation_table(configs, measured, run.env.get("cpu_cores"))

    out = args.out or args.run_dir / run_folder.PROJECTION_DIR
    out.mkdir(parents=True, exist_ok=True)
    projection.to_csv(out / run_folder.PROJECTION, index=False)
    validation.to_csv(out / "validation.csv", index=False)
    fits_df = fits_table(fits)
    fits_df.to_csv(out / "network_fit.csv", index=False)
    # data only: `bench report` draws the figure and renders the section from these files
    (out / run_folder.PROJECTION_NOTES).write_text("".join(f"{note}\n" for note in notes + physics))

    predicted = projection["predicted_step_ms"].notna().sum()
    print(f"projection: {out / run_folder.PROJECTION} ({len(configs)} configurations, {predicted} of "
          f"{len(projection)} rows predicted)")
    med = median_abs_error(validation)
    if med is None:
        print(f"validation: {out / 'validation.csv'}: nothing to validate (needs two measured world sizes "
              f"and a probe)")
    else:
        signed = validation["error_pct"].dropna().median()
        print(f"validation: {out / 'validation.csv'}: median |error| {med:.1f} % over "
              f"{validation['error_pct'].notna().sum()} cells (signed median {signed:+.1f} %)")
    print(f"network fit: {out / 'network_fit.csv'} ({len(fits)} fits)")
    for note in notes:
        print(f"note: {note}")
    if physics:
        print(f"note: where each configuration's straggler, interference and host-floor terms came from: "
              f"{out / run_folder.PROJECTION_NOTES} ({len(physics)} lines)")
    return 0


def _layout(run_dir: Path, workload_table: dict):
    """Each configuration's bucket sizes on the wire: the layout its cell recorded (cells.jsonl
    `bucket_sizes_bytes`, as the engine reported it; no torch needed), else — a run folder written before
    cells recorded it — rebuilt from the workload (bench.project.layout imports torch), cached."""
    records = run_folder.read_records(run_dir)
    recorded = {r["cell_id"]: r["bucket_sizes_bytes"] for r in records if r.get("bucket_sizes_bytes")}
    cache: dict = {}

    def sizes(base) -> list[int]:
        if base["cell_id"] in recorded:
            return [WIRE_DTYPES[base["comm_dtype"]].on_wire(s) for s in recorded[base["cell_id"]]]
        from bench.project.layout import engine_bucket_sizes, workload_options

        cap = None if base["bucket_cap_mb"] != base["bucket_cap_mb"] else float(base["bucket_cap_mb"])
        key = (base["engine"], base["model"], base["model_size"], cap, base["comm_dtype"])
        if key not in cache:
            cache[key] = engine_bucket_sizes(*key, workload_options(workload_table))
        return cache[key]

    return sizes


# what-if flags: (flag, type, help); each maps to the spec key of its name (--step-ms → step_ms)
SPEC_FLAGS = (
    ("--model", str, "built-in workload NAME[:SIZE] (its layout is built on the meta device)"),
    ("--params", int, "or a trainable parameter count (torch DDP's bucket layout)"),
    ("--step-ms", float, "the 1-GPU step time T1 in ms"),
    ("--per-gpu-batch", int, "samples per GPU per micro-step"),
    ("--precision", str, "fp32, tf32, bf16 or fp16 (recorded; gradients are fp32 unless --comm-dtype)"),
    ("--comm-dtype", str, "none, fp16 or bf16 on the wire"),
    ("--grad-accum", int, "micro-steps per all-reduce"),
    ("--bucket-cap-mb", float, "DDP bucket cap (default 25)"),
    ("--step-cv", float, "per-rank step-time spread σ (default: the corpus fit)"),
    ("--interference", float, "compute slowdown per ms of overlapped all-reduce γ (default: the corpus fit)"),
    ("--host-ms", float, "host floor: the step cannot be shorter (default 0)"),
)


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def spec_main(args: argparse.Namespace) -> int:
    """The what-if: projection.csv and notes.txt from a spec, nothing measured."""
    from bench.project.spec import SpecError, projection_of, read_spec, spec_from_keys

    try:
        if args.run_dir is not None:
            raise SpecError(f"run_dir={str(args.run_dir)!r}: a what-if (--spec/--model/--params) takes "
                            f"no run folder")
        if args.bw_gbps is not None or args.latency_us is not None:
            raise SpecError(f"--bw-gbps={args.bw_gbps} --latency-us={args.latency_us}: a what-if takes a "
                            f"--network preset")
        keys = read_spec(args.spec) if args.spec is not None else {}
        for flag, _, _ in SPEC_FLAGS:
            value = getattr(args, _dest(flag))
            if value is not None:
                keys[_dest(flag)] = value
        if args.model is not None:
            keys["model"], _, keys["size"] = args.model.partition(":")
        if args.network is not None:
            keys["network"] = args.network
        if args.world_sizes != DEFAULT_WORLD_SIZES or "world_sizes" not in keys:
            keys["world_sizes"] = parse_world_sizes(args.world_sizes)
        keys.setdefault("gpus_per_node", args.gpus_per_node)
        keys.setdefault("inter_network", args.inter_network)
        if args.nics_per_node is not None:
            keys.setdefault("nics_per_node", args.nics_per_node)
        keys.setdefault("algorithm", args.algorithm)
        spec = spec_from_keys(keys)
        projection = projection_of(spec)
    except (SpecError, UsageError) as exc:
        print(f"bench project: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(run_folder.PROJECTION_DIR)
    out.mkdir(parents=True, exist_ok=True)
    projection.to_csv(out / run_folder.PROJECTION, index=False)
    notes = [f"what-if from a spec (no run): T1 {spec.step_ms:g} ms, per-GPU batch {spec.per_gpu_batch}, "
             f"backward share {spec.backward_share:.3f}, σ {spec.step_cv:g}, γ {spec.interference:g}, host "
             f"{spec.host_ms:g} ms"]
    (out / run_folder.PROJECTION_NOTES).write_text("".join(f"{note}\n" for note in notes))
    print(f"projection: {out / run_folder.PROJECTION} ({projection['predicted_step_ms'].notna().sum()} of "
          f"{len(projection)} rows predicted; what-if, nothing measured)")
    for _, r in projection.iterrows():
        if not pd.isna(r["efficiency_pct"]):
            print(f"  N={int(r['world_size']):5d}  step {r['predicted_step_ms']:9.2f} ms  efficiency "
                  f"{r['efficiency_pct']:5.1f} % (90 % interval {r['efficiency_pct_low']:.1f}–"
                  f"{r['efficiency_pct_high']:.1f})  dominant {r['dominant_term']}")
    return 0
