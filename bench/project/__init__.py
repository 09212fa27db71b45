"""`bench project`: what a measured DDP configuration would do on 8 to 1,024 GPUs (docs/design.md).

network      fabrics and networks: published presets, custom, and the run's own fitted probe
collectives  alpha-beta all-reduce costs: ring, tree, hierarchical (NCCL's tuning model for latencies)
fit          least-squares α and β from an all-reduce size sweep, with the fit's residual
measured     the `measured` network: a fit per world size from the sweep, else the rows' probe
inputs       a run's bucket timeline and sweep, read into the engine's terms
layout       bucket sizes rebuilt from a workload on the meta device (when no trace gave them)
simulate     one step: bucket all-reduces on one communication stream against backward
project      configurations of a run, their projection over world sizes and the validation
plot, summary, cli   the efficiency figure, the Markdown section and `python -m bench project`

Only `layout` imports torch (through bench.workloads and bench.engines, to build a model on the meta
device), and only when a configuration has no bucket timeline; nothing here uses torch.distributed.
"""
