"""`bench project` as functions: `run(run_dir, ...)` projects a run's configurations over world sizes and
networks, validates them on the world sizes it measured and writes RUN/projection/; `what_if(keys)` does the
same from a spec with nothing measured (bench/project/spec.py). Both return a `Projection` (data only: the
command, cli.py, prints it; `bench report` draws it). Bad input raises before anything is written:
UsageError / SpecError naming the key and the value, InputError for unreadable inputs, RunError for a folder
that is not a run, run_folder.OutError for an --out that is a file or another command's part of a run
folder (run_folder.out_problem).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.config import MAX_WORLD_SIZE
from bench.project.collectives import ALGORITHMS
from bench.project.evidence import read_evidence
from bench.project.inputs import read_sweep, read_timeline
from bench.project.measured import Measured, fits_table, measured_fits
from bench.project.network import FABRICS, INTER_NODE, custom_network, preset_network
from bench.project.project import (
    configurations,
    median_abs_error,
    projection_table,
    validation_table,
    with_evidence,
)
from bench.run_folder import load_run
from bench.schema import WIRE_DTYPES

MEASURED = "measured"     # the network preset that is the run's own fitted all-reduce probe
DEFAULT_WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_INTER_NETWORK = "ib-ndr400"


class UsageError(ValueError):
    """A bad argument: the message names the key and the value."""


@dataclass
class Projection:
    """What one projection wrote (or would write): projection.csv's rows, and for a run its validation on
    the measured world sizes, the measured network's fits, the caveats (`notes`) and one line per
    configuration saying where its physics terms came from (`physics`)."""

    projection: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    physics: list[str] = field(default_factory=list)
    validation: pd.DataFrame | None = None
    fits: pd.DataFrame | None = None
    configurations: int = 0
    out: Path | None = None
    what_if: bool = False     # from a spec, nothing measured

    def lines(self) -> list[str]:
        """What `bench project` prints once the files are written."""
        out, rows = self.out, self.projection
        predicted = rows["predicted_step_ms"].notna().sum()
        if self.what_if:
            lines = [f"projection: {out / run_folder.PROJECTION} ({predicted} of {len(rows)} rows predicted; "
                     f"what-if, nothing measured)"]
            return lines + [f"  N={int(r['world_size']):5d}  step {r['predicted_step_ms']:9.2f} ms  "
                            f"efficiency {r['efficiency_pct']:5.1f} %  dominant {r['dominant_term']}"
                            for _, r in rows.iterrows() if not pd.isna(r["efficiency_pct"])]
        lines = [f"projection: {out / run_folder.PROJECTION} ({self.configurations} configurations, "
                 f"{predicted} of {len(rows)} rows predicted)"]
        med, validation = median_abs_error(self.validation), out / run_folder.VALIDATION
        if med is None:
            lines.append(f"validation: {validation}: nothing to validate (needs two measured world sizes "
                         f"and a probe)")
        else:
            errors = self.validation["error_pct"].dropna()
            lines.append(f"validation: {validation}: median |error| {med:.1f} % over {len(errors)} cells "
                         f"(signed median {errors.median():+.1f} %)")
        lines.append(f"network fit: {out / run_folder.NETWORK_FIT} ({len(self.fits)} fits)")
        lines += [f"note: {note}" for note in self.notes]
        if self.physics:
            lines.append(f"note: where each configuration's straggler, interference and host-floor terms "
                         f"came from: {out / run_folder.PROJECTION_NOTES} ({len(self.physics)} lines)")
        return lines

    def write(self, out: Path) -> None:
        """projection.csv, notes.txt and, for a run, validation.csv and network_fit.csv into `out`."""
        out.mkdir(parents=True, exist_ok=True)
        self.projection.to_csv(out / run_folder.PROJECTION, index=False)
        if self.validation is not None:
            self.validation.to_csv(out / run_folder.VALIDATION, index=False)
        if self.fits is not None:
            self.fits.to_csv(out / run_folder.NETWORK_FIT, index=False)
        (out / run_folder.PROJECTION_NOTES).write_text("".join(f"{n}\n" for n in self.notes + self.physics))
        self.out = out


def networks_for(names: list[str] | None, world_sizes: list[int], gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                 inter_network: str = DEFAULT_INTER_NETWORK, bw_gbps: float | None = None,
                 latency_us: float | None = None) -> dict:
    """Name → Network for every preset asked for (None for `measured`: the run's own probe), or the one
    custom network of `bw_gbps` and `latency_us`; UsageError naming the flag and its value."""
    custom = bw_gbps is not None or latency_us is not None
    if custom and names is not None:
        raise UsageError(f"--network={','.join(names)!r} and --bw-gbps/--latency-us: give one or the other")
    if custom:
        if bw_gbps is None or latency_us is None:
            raise UsageError(f"--bw-gbps={bw_gbps} --latency-us={latency_us}: give both")
        try:
            return {"custom": custom_network(bw_gbps, latency_us)}
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not 1 <= gpus_per_node <= MAX_WORLD_SIZE:
        raise UsageError(f"--gpus-per-node={gpus_per_node} must lie in [1, {MAX_WORLD_SIZE}]")
    if inter_network not in INTER_NODE:
        raise UsageError(f"--inter-network={inter_network!r} is not one of {list(INTER_NODE)}")
    out = {}
    for name in names or [MEASURED]:
        name = name.strip()
        if name == MEASURED:
            out[name] = None
            continue
        if name not in FABRICS:
            raise UsageError(f"--network={name!r} is not a preset; choose from {[*FABRICS, MEASURED]}")
        net = preset_network(name, gpus_per_node, inter_network)
        for n in world_sizes:
            try:
                net.nodes(n)
            except ValueError:
                raise UsageError(f"--world-sizes: {n} is not a multiple of "
                                 f"--gpus-per-node={gpus_per_node} (network {name})") from None
        out[name] = net
    return out


def run(run_dir: Path | str, networks: list[str] | None = None, world_sizes=DEFAULT_WORLD_SIZES, *,
        gpus_per_node: int = DEFAULT_GPUS_PER_NODE, inter_network: str = DEFAULT_INTER_NETWORK,
        algorithm: str = "auto", bw_gbps: float | None = None, latency_us: float | None = None,
        out: Path | str | None = None, write: bool = True) -> Projection:
    """Project every configuration of the run at `run_dir` to `world_sizes` on each of `networks` (preset
    names, default the run's own probe; or a custom `bw_gbps` + `latency_us`), validate on the world sizes
    it measured, and (with `write`) write RUN/projection/ or `out`."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / run_folder.PROJECTION_DIR
    if write:  # refused before anything is read or written: another command's folder, a file
        run_folder.check_out(out, "project", run_dir)
    if algorithm not in ALGORITHMS:
        raise UsageError(f"--algorithm={algorithm!r} is not one of {list(ALGORITHMS)}")
    world_sizes = sorted(set(world_sizes))
    if not world_sizes or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WORLD_SIZE
                              for n in world_sizes):
        raise UsageError(f"--world-sizes={world_sizes}: must be integers in [1, {MAX_WORLD_SIZE}]")
    presets = networks_for(networks, world_sizes, gpus_per_node, inter_network, bw_gbps, latency_us)
    try:
        run = load_run(run_dir)
    except run_folder.RunError as exc:
        raise run_folder.RunError(f"run={str(run_dir)!r}: {exc}") from None
    timeline, sweep = read_timeline(run_dir), read_sweep(run_dir)
    configs = configurations(run.results, timeline, _layout(run_dir, run.config.get("workload", {})))
    evidence = read_evidence(run_dir)
    configs = [with_evidence(c, evidence) if c.compute is not None else c for c in configs]

    fits, notes = measured_fits(run.results, sweep)
    measured = Measured(fits)
    network_at = {name: measured.network_at if net is None else (lambda n, dtype, net=net: (net, net.label))
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
    projection = Projection(projection=projection_table(configs, network_at, world_sizes, algorithm),
                            notes=notes, physics=physics,
                            validation=validation_table(configs, measured, run.env.get("cpu_cores")),
                            fits=fits_table(fits), configurations=len(configs))
    if write:
        projection.write(out)
    return projection


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


def what_if(keys: dict, out: Path | str | None = None, write: bool = True) -> Projection:
    """The projection of a spec (bench/project/spec.py keys: params or model, step_ms, per_gpu_batch,
    network, world_sizes, ...), nothing measured; written to `out` (default ./projection). SpecError names a
    bad key or value."""
    from bench.project.spec import projection_of, spec_from_keys

    out = Path(out) if out is not None else Path(run_folder.PROJECTION_DIR)
    spec = spec_from_keys(keys)
    if write:
        run_folder.check_out(out, "project")
    notes = [f"what-if from a spec (no run): T1 {spec.step_ms:g} ms, per-GPU batch {spec.per_gpu_batch}, "
             f"backward share {spec.backward_share:.3f}, σ {spec.step_cv:g}, γ {spec.interference:g}, host "
             f"{spec.host_ms:g} ms"]
    projection = Projection(projection=projection_of(spec), notes=notes, configurations=1, what_if=True)
    if write:
        projection.write(out)
    return projection
