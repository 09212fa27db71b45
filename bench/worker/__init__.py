"""Inside every rank: `python -m bench.worker --plan PLAN [--events FILE]`, started by torchrun or srun.

Everything in this package runs in the rank processes; everything outside it (config, matrix, launch,
results, report) runs in the launcher. Read top to bottom:

- main.py        the process: ranks, threads, device, process group, the loop over the plan's cells, events
- cell.py        the order of one cell's phases, and the measured part of its result row
- trainer.py     one cell's training state and one optimizer step (with its Precision and instruments)
- measure.py     what a cell measures: timed windows, rank reductions, parity, probe, memory, work per step
- profiling.py   the profiled pass (never timed)
- events.py      the JSON-lines events rank 0 (and a failing rank) write for the launcher
"""
