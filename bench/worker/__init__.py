"""Inside every rank: `python -m bench.worker --plan PLAN [--events FILE]`, started by torchrun or srun.

Everything in this package runs in the rank processes; everything outside it (config, matrix, launch,
results, report) runs in the launcher. Read top to bottom:

- main.py          a rank's life: the process set up, its launch context, the groups, the profiled passes
- context.py       Launch: what one rank knows of its launch, built once by main and handed down
- launch_groups.py the launch's groups one after another, and the events each writes (launch and plan mode)
- watch.py         the one thread that hears another rank's failure while a group runs
- groups.py        the plan's cells in groups side by side (engine groups, race groups, what fits in memory)
- cell.py          the order of one group's phases (each returning a typed result), and the measured row
- warmup.py        the warm-up (compiled cells until recompiling stops) and where it really ended
- rounds.py        the grid's timed rounds and their budget; the compute-only rounds
- racing.py        a race's timed rounds: candidates eliminated at pre-set looks
- row_values.py    the columns a result row is made of, from what the phases measured
- trainer.py       one cell's training state and one optimizer step (with its Precision and instruments)
- measure.py       what a cell measures: timed windows, rank reductions, parity, probe, memory, work per step
- parity.py        the parity gates against torch DDP's gradient
- guard.py         one cell's failure kept to itself; a failure on some ranks only (Peers)
- steady.py        the changepoint test for the warm-up's end, and Tukey's outliers
- profiling.py     the profiled pass (never timed)
- plan_mode.py     what a rank does when the user's own torchrun or srun runs the plan
- process.py       ranks, threads, CPUs, device and process group of the rank's process
- hangs.py         a rank's stack and its timed-out collective, for the launcher's watchdog
- events.py        the JSON-lines events rank 0 (and a failing rank) write for the launcher
"""
