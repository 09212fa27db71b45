"""`bench advise`: which DDP settings to run at the user's recipe, how much faster than torch DDP's defaults
(with the interval), what to expect on the target cluster, and a config to run.

rank.py takes one recipe (the global batch at the largest measured world size) and ranks its
configurations; baseline.py sets each against torch DDP's defaults; choice.py picks the row the answer
names; answer.py words it from advice.csv's rows; to_run.py writes best.toml and ddp.md; api.py
(`bench.advise.run(run_dir, target, ...) -> Advice`) projects the rows (bench.project.run) and writes the
files; cli.py parses and prints. Reads the run folder; imported by the report, never the reverse.
"""


def __getattr__(name: str):
    """`bench.advise.run`, `Advice` (api.py), imported on first use (they load pandas)."""
    if name in ("run", "Advice", "UsageError"):
        from bench.advise import api

        return getattr(api, name)
    raise AttributeError(f"module 'bench.advise' has no attribute {name!r}")
