"""`bench project`: what a measured DDP configuration would do on 8 to 1,024 GPUs (docs/design.md).

network      fabrics and networks: published presets, custom, and the run's own fitted probe
collectives  alpha-beta costs: all-reduce ring, tree, hierarchical; all-gather and reduce-scatter rings
fit          least-squares α and β from an all-reduce size sweep, with the fit's residual
measured     the `measured` network: a fit per world size from the sweep, else the rows' probe
inputs       a run's bucket timeline and sweep, read into the engine's terms
layout       bucket sizes rebuilt from a workload on the meta device (when no trace gave them)
terms        the physics: one step as a table of terms (compute and collectives on their streams) and
             the one function that times it (critical path, exposed communication, bottleneck)
simulate     DDP's terms: bucket all-reduces on one communication stream against the synced backward
sharded      a sharded engine's terms (FSDP, FSDP2, ZeRO): per-block all-gathers and reduce-scatters
powersgd     PowerSGD's compressed messages and compression FLOPs
physics      the terms beyond compute and all-reduce: straggler, interference, host floor
columns      projection.csv's and validation.csv's columns; the keys that make rows one configuration
configuration  a run's configurations from its rows (compute side, buckets or blocks), their step at n
buckets      where a DDP configuration's buckets come from: trace, workload layout, row counts; PowerSGD
fixed_costs  a micro-step's fixed cost from two measured per-rank batches, and the note when none was
evidence     the physics terms' parameters from the run: σ from the rows, γ and host floor from traces
project      projection.csv: each configuration over world sizes and networks, anchored where measured
interval     the 90 % interval: model-error bands per regime and basis (model_error.csv), widened by
             the inputs
interval_columns  a projected row's interval columns from its band
protocol     what the user measured (a node; 1 and 2 GPUs): the band validated on it per reach
             (protocol_bands.csv); a micro-step's fixed cost from two batches
protocol_columns  what a row of a validated protocol prints; the node protocol's compute calibration
validation   validation.csv: the model against the run's own larger world sizes
spec         what-if without a run: `project_spec(...)` (also `bench.project.project_spec`)
api          the functions under the command: `run(run_dir, ...)`, `what_if(keys)` → Projection
cli          `python -m bench project`: parses, calls api, prints

Only `layout` imports torch (through bench.workloads and bench.engines, to build a model on the meta
device), and only when a configuration has no bucket timeline; nothing here uses torch.distributed. The
fitted bands are data here; what fits them (the published corpora, their systems, the validation) is the
lab beside the validator, benchmarks/projection_lab/.
"""


def __getattr__(name: str):
    """`bench.project.run`, `what_if`, `Projection`, `NetworkOptions` (api.py) and `project_spec` (spec.py),
    imported on first use (the submodules load pandas; the run mode does not need the spec)."""
    if name == "project_spec":
        from bench.project.spec import project_spec

        return project_spec
    if name in ("run", "what_if", "Projection", "UsageError", "NetworkOptions"):
        from bench.project import api

        return getattr(api, name)
    raise AttributeError(f"module 'bench.project' has no attribute {name!r}")
