"""`python -m bench <command>`: run · report · compare · tensorboard.

Each command lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`; this file
only dispatches, so the commands stay independent of each other.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "run": ("bench.run_cli", "sweep a preset's matrix and write results/<run-id>/"),
    "report": ("bench.report.cli", "tables, plots and index.html for one run"),
    "compare": ("bench.report.compare_cli", "compare two or more runs (e.g. H100 vs A100)"),
    "tensorboard": ("bench.report.tensorboard", "serve a run's traces in TensorBoard"),
    "analyze": ("bench.analyze.cli", "per-step GPU/CPU breakdown and bucket timeline from a run's traces"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    # Import only the command asked for (the report's pandas/matplotlib must not slow down `run`);
    # all of them when there is none, so that --help lists every command with its options.
    chosen = [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)
    modules = {}
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name in chosen:
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(sub_parser)
    args = parser.parse_args(argv)
    return modules[args.command].main(args)


if __name__ == "__main__":
    sys.exit(main())
