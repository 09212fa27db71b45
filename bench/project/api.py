"""`bench project` as functions: `run(run_dir, ...)` projects a run's configurations over world sizes and
networks, validates them on the world sizes it measured and writes RUN/projection/; `what_if(keys)` does the
same from a spec with nothing measured (bench/project/spec.py). Both return a `Projection` (data only: the
command, cli.py, prints it; `bench report` draws it). Bad input raises before anything is written:
UsageError / SpecError naming the key and the value, InputError for unreadable inputs, RunError for a folder
that is not a run, run_folder.OutError for an --out that is a file or another command's part of a run
folder (run_folder.out_problem).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.config import MAX_WORLD_SIZE
from bench.project import interval, protocol
from bench.project.collectives import ALGORITHMS
from bench.project.configuration import Configuration
from bench.project.evidence import read_evidence, with_evidence
from bench.project.fixed_costs import fixed_cost_needed
from bench.project.inputs import read_sweep, read_timeline
from bench.project.measured import Measured, fits_table, measured_fits
from bench.project.network import FABRICS, INTER_NODE, custom_network, preset_network
from bench.project.physics import DEFAULT_INTERFERENCE, DEFAULT_STEP_CV
from bench.project.project import cells_table, projection_table
from bench.project.run_configurations import configurations, workload_shapes
from bench.project.validation import median_abs_error, validation_table
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
    # a what-if over lists of settings: (the settings of one combination, its projection), in order
    compared: list[tuple[dict, Projection]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What `bench project` prints once the files are written."""
        out, rows = self.out, self.projection
        predicted = rows["predicted_step_ms"].notna().sum()
        if self.compared:
            lines = [f"projection: {out / run_folder.PROJECTION} ({len(self.compared)} what-ifs: "
                     f"{' × '.join(self.compared[0][0])})"]
            for settings, part in self.compared:
                lines.append("  " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in settings.items()))
                lines += part.lines()[1:]
            return lines
        if self.what_if:
            lines = [f"projection: {out / run_folder.PROJECTION} ({predicted} of {len(rows)} rows predicted; "
                     f"what-if, nothing measured)"]
            return lines + [f"  N={int(r['world_size']):5d}  step {r['predicted_step_ms']:9.2f} ms  "
                            f"efficiency {r['efficiency_pct']:5.1f} % (90 % interval "
                            f"{r['efficiency_pct_low']:.1f}–{r['efficiency_pct_high']:.1f})  "
                            f"dominant {r['dominant_term']}"
                            for _, r in rows.iterrows() if not pd.isna(r["efficiency_pct"])]
        anchored = rows["anchor_world_size"].notna().sum()
        lines = [f"projection: {out / run_folder.PROJECTION} ({self.configurations} configurations, "
                 f"{predicted} of {len(rows)} rows predicted, {anchored} anchored to a measured world size)"]
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
            lines.append("note: where each configuration's straggler, interference, host-floor and "
                         f"fixed-cost terms came from: {out / run_folder.PROJECTION_NOTES} "
                         f"({len(self.physics)} lines)")
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

    def save(self, out: Path, source: Path | None = None) -> None:
        """write() into `out` by the rule of every command that writes (run_folder.writing): its files
        replace only `bench project`'s own; OutError, `out` untouched, otherwise."""
        with run_folder.writing(out, "project", source, FILES) as stage:
            self.write(stage)
        self.out = out


# what `bench project` writes into its folder
FILES = (run_folder.PROJECTION, run_folder.VALIDATION, run_folder.NETWORK_FIT, run_folder.PROJECTION_NOTES)


@dataclass(frozen=True)
class NetworkOptions:
    """How the networks of a projection are built and used, beside their preset names: a preset's node
    layout (`gpus_per_node`, the fabric between nodes and its NICs per node, None: one per GPU), or one
    custom flat network (`bw_gbps` and `latency_us`, both or neither); the all-reduce `algorithm`; and
    `measured_on`, the preset that describes the GPUs the run measured on (anchored as the run's own
    network is: project.anchor_of)."""

    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    inter_network: str = DEFAULT_INTER_NETWORK
    nics_per_node: int | None = None
    bw_gbps: float | None = None
    latency_us: float | None = None
    algorithm: str = "auto"
    measured_on: str | None = None


def networks_for(names: list[str] | None, world_sizes: list[int], options: NetworkOptions = NetworkOptions()
                 ) -> dict:
    """Name → Network for every preset asked for (None for `measured`: the run's own probe), or the one
    custom network of `options.bw_gbps` and `options.latency_us`; UsageError naming the flag and its
    value."""
    bw_gbps, latency_us, gpus_per_node = options.bw_gbps, options.latency_us, options.gpus_per_node
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
    if options.inter_network not in INTER_NODE:
        raise UsageError(f"--inter-network={options.inter_network!r} is not one of {list(INTER_NODE)}")
    if options.nics_per_node is not None and options.nics_per_node < 1:
        raise UsageError(f"--nics-per-node={options.nics_per_node} must be >= 1")
    out = {}
    for name in names or [MEASURED]:
        name = name.strip()
        if name == MEASURED:
            out[name] = None
            continue
        if name not in FABRICS:
            raise UsageError(f"--network={name!r} is not a preset; choose from {[*FABRICS, MEASURED]}")
        net = preset_network(name, gpus_per_node, options.inter_network, options.nics_per_node)
        for n in world_sizes:
            try:
                net.nodes(n)
            except ValueError:
                raise UsageError(f"--world-sizes: {n} is not a multiple of "
                                 f"--gpus-per-node={gpus_per_node} (network {name})") from None
        out[name] = net
    return out


def run(run_dir: Path | str, networks: list[str] | None = None, world_sizes=DEFAULT_WORLD_SIZES, *,
        options: NetworkOptions = NetworkOptions(), cells: list[str] | None = None,
        out: Path | str | None = None, write: bool = True) -> Projection:
    """Project every configuration of the run at `run_dir` to `world_sizes` on each of `networks` (preset
    names, default the run's own probe; or the custom network of `options`), validate on the world sizes
    it measured, and (with `write`) write RUN/projection/ or `out`. The run's own network is anchored to
    the world sizes it measured (project.anchor_of), and so is `options.measured_on`: one of `networks`,
    the preset that describes the GPUs the run measured on. With `cells` (cell ids), projection.csv holds
    those cells only, each from its own batch (configuration.from_cell: its global batch kept where it
    divides among the ranks, else its per-rank batch held), as `bench advise` needs them.

    A CPU run projected to a GPU network (a preset or custom) takes σ and γ at their GPU defaults
    (physics.py): its own step-time spread and gloo's interference describe a loaded host, not GPUs (a
    2-core CPU's σ, 6-8× the GPU corpus's, made the slowest rank the loss at 32 GPUs); a note says so."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / run_folder.PROJECTION_DIR
    if write:  # refused before anything is read or written: another command's folder, a file, a user's
        run_folder.check_out(out, "project", run_dir, FILES)
    world_sizes, presets = _checked(networks, world_sizes, options)
    try:
        run = load_run(run_dir)
    except run_folder.RunError as exc:
        raise run_folder.RunError(f"run={str(run_dir)!r}: {exc}") from None
    if options.measured_on is not None and run.device != "cuda":
        raise UsageError(f"--measured-on={options.measured_on!r}: the run measured on {run.device!r}, not on "
                         f"the GPUs of a preset")
    timeline, sweep = read_timeline(run_dir), read_sweep(run_dir)
    configs = _configurations(run_dir, run, timeline)
    fits, notes = measured_fits(run.results, sweep)
    measured = Measured(fits)
    network_at = {name: measured.network_at if net is None else (lambda n, dtype, net=net: (net, net.label))
                  for name, net in presets.items()}
    notes += _input_notes(run.device, [n for n in presets if n != MEASURED], configs, timeline is not None)
    # one line per configuration: notes.txt keeps them all, the printout only says where they are
    physics = [f"{run_folder.PHYSICS_NOTE}{c.base['cell_id']}: "
               + "; ".join(x for x in (c.physics_source, c.fixed_source) if x)
               for c in configs if c.physics_source or c.fixed_source]
    gpu_configs = [gpu_physics(c) for c in configs] if run.device == "cpu" else configs
    anchored = (MEASURED, options.measured_on or MEASURED)
    tables = []
    for name, at in network_at.items():
        mine = configs if name == MEASURED else gpu_configs
        if cells is None:
            tables.append(projection_table(mine, {name: at}, world_sizes, options.algorithm,
                                           anchored=anchored))
        else:
            chosen = run.results[run.results["cell_id"].isin(cells)]
            tables.append(cells_table(mine, chosen, {name: at}, world_sizes, options.algorithm,
                                      anchored=anchored))
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    notes += _table_notes(configs, table)
    projection = Projection(projection=table, notes=notes, physics=physics,
                            validation=validation_table(configs, measured, run.env.get("cpu_cores")),
                            fits=fits_table(fits), configurations=len(configs))
    if write:
        projection.save(out, run_dir)
    return projection


def _configurations(run_dir: Path, run, timeline: pd.DataFrame | None) -> list[Configuration]:
    """The run's configurations (run_configurations.py), each with the physics its evidence gives."""
    workload = run.config.get("workload", {})
    configs = configurations(run.results, timeline, _layout(run_dir, workload), workload_shapes(workload))
    evidence = read_evidence(run_dir)
    return [with_evidence(c, evidence) if c.compute is not None else c for c in configs]


def _checked(networks: list[str] | None, world_sizes, options: NetworkOptions) -> tuple[list[int], dict]:
    """(the world sizes, sorted, and the networks by name) of a request; UsageError naming the flag and its
    value before anything is read."""
    if options.algorithm not in ALGORITHMS:
        raise UsageError(f"--algorithm={options.algorithm!r} is not one of {list(ALGORITHMS)}")
    world_sizes = sorted(set(world_sizes))
    if not world_sizes or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WORLD_SIZE
                              for n in world_sizes):
        raise UsageError(f"--world-sizes={world_sizes}: must be integers in [1, {MAX_WORLD_SIZE}]")
    presets = networks_for(networks, world_sizes, options)
    measured_on = options.measured_on
    if measured_on is not None and (measured_on == MEASURED or measured_on not in presets):
        raise UsageError(f"--measured-on={measured_on!r} is not one of the --network presets "
                         f"{[n for n in presets if n != MEASURED]} (the run's own network is always "
                         f"anchored)")
    return world_sizes, presets


def _input_notes(device: str, gpu_networks: list[str], configs: list[Configuration], has_timeline: bool
                 ) -> list[str]:
    """The caveats the run's inputs give: a CPU run projected to GPUs, no bucket timeline."""
    notes = []
    if device == "cpu" and gpu_networks:
        notes.append("compute measured on CPU, network of GPUs: a what-if, not a prediction for a GPU "
                     "cluster")
        notes.append(f"CPU run on {', '.join(gpu_networks)}: σ {DEFAULT_STEP_CV:g} and γ "
                     f"{DEFAULT_INTERFERENCE:g}, the GPU defaults (bench/project/physics.py), replace this "
                     f"host's own ({cpu_physics_words(configs)}), which a loaded CPU's jitter and gloo's "
                     f"threads set, not a GPU's")
    if not has_timeline:
        notes.append("no bucket_timeline.csv (run `bench analyze` on a profiled run): buckets are assumed "
                     "ready uniformly over backward")
    return notes


def _table_notes(configs: list[Configuration], table: pd.DataFrame) -> list[str]:
    """The caveats the projected rows give: how wide their intervals are, the protocols they print, a
    batch changed with no fixed cost measured."""
    notes = interval.width_notes(table["interval_regime"].dropna())
    notes += protocol.notes(table["protocol"].dropna())
    if needed := [why for c in configs if (why := fixed_cost_needed(c, table))]:
        notes.append(needed[0] + (f" (and {len(needed) - 1} more configurations like it)" if len(needed) > 1
                                  else ""))
    return notes


def gpu_physics(config: Configuration) -> Configuration:
    """A CPU-measured configuration with σ and γ at their GPU defaults (the host floor is 0 on CPU)."""
    if config.physics is None:
        return config
    return replace(config, physics=replace(config.physics, step_cv=DEFAULT_STEP_CV,
                                           interference_factor=DEFAULT_INTERFERENCE))


def cpu_physics_words(configs: list[Configuration]) -> str:
    """The range of σ and γ the run's own evidence gave, in words."""
    own = [c.physics for c in configs if c.physics is not None]
    if not own:
        return "none measured"
    sigma, gamma = [p.step_cv for p in own], [p.interference_factor for p in own]
    return f"σ {min(sigma):.3g}–{max(sigma):.3g}, γ {min(gamma):.3g}–{max(gamma):.3g}"


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
    network, world_sizes, ...), nothing measured; written to `out` (default ./projection). A key of
    spec.LIST_KEYS given as a list compares its values in one call: one what-if per combination
    (spec.spec_grid), every one checked before anything is written, their rows in one projection.csv.
    SpecError names a bad key or value."""
    from bench.project.spec import LIST_KEYS, spec_grid

    out = Path(out) if out is not None else Path(run_folder.PROJECTION_DIR)
    if write:
        run_folder.check_out(out, "project", None, FILES)
    grid = spec_grid(keys)
    made = [_what_if_one(k) for k in grid]
    if len(made) == 1:
        projection = made[0]
    else:
        listed = [k for k in LIST_KEYS if isinstance(keys.get(k), (list, tuple))]
        compared = [({k: g[k] for k in listed}, m) for g, m in zip(grid, made)]
        projection = Projection(projection=pd.concat([m.projection for m in made], ignore_index=True),
                                notes=[n for m in made for n in m.notes], configurations=len(made),
                                what_if=True, compared=compared)
    if write:
        projection.save(out)
        for _, m in projection.compared:
            m.out = out
    return projection


def _what_if_one(keys: dict) -> Projection:
    from bench.project.spec import projection_of, spec_from_keys

    spec = spec_from_keys(keys)
    notes = [f"what-if from a spec (no run): T1 {spec.step_ms:g} ms, per-GPU batch {spec.per_gpu_batch}, "
             f"backward share {spec.backward_share:.3f}, σ {spec.step_cv:g}, γ {spec.interference:g}, host "
             f"{spec.host_ms:g} ms"]
    table = projection_of(spec)
    notes += interval.width_notes(table["interval_regime"].dropna())
    return Projection(projection=table, notes=notes, configurations=1, what_if=True)
