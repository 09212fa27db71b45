"""`bench advise`: which measured configuration to run, with its ties and its projection to a target.

rank.py ranks the configurations at the largest measured world size by throughput with intervals,
answer.py writes the sentence from those rows, api.py (`bench.advise.run(run_dir, target) -> Advice`)
projects them (bench.project.run) and writes advice.md and advice.csv, cli.py parses and prints. Reads the
run folder; imported by the report, never the reverse.
"""


def __getattr__(name: str):
    """`bench.advise.run`, `Advice` (api.py), imported on first use (they load pandas)."""
    if name in ("run", "Advice", "UsageError"):
        from bench.advise import api

        return getattr(api, name)
    raise AttributeError(f"module 'bench.advise' has no attribute {name!r}")
