"""`python -m bench <command>`: run · report · compare · tensorboard · project · analyze · advise · slurm.

Each command is a pair of functions, `<prefix>add_arguments(parser)` and `<prefix>main(args) -> int`, in
the module COMMANDS names; this file only dispatches, so the commands stay independent of each other.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys

# command → (module, prefix of its add_arguments/main functions, help)
COMMANDS = {
    "run": ("bench.run.cli", "run_", "sweep a preset's matrix and write results/<run-id>/"),
    "report": ("bench.report.commands", "report_", "tables, plots and index.html for one run"),
    "compare": ("bench.report.commands", "compare_", "compare two or more runs (e.g. H100 vs A100)"),
    "tensorboard": ("bench.report.commands", "tensorboard_", "serve a run's traces in TensorBoard"),
    "project": ("bench.project.cli", "", "project a run to 8..1,024 GPUs, validated on its own cells"),
    "analyze": ("bench.analyze.cli", "", "per-step GPU/CPU breakdown and bucket timeline from traces"),
    "advise": ("bench.advise.cli", "", "which settings to run at your recipe: speedup over torch DDP's "
                                       "defaults, projected to a target, a config to run"),
    "slurm": ("bench.run.cli", "slurm_", "a run on a SLURM cluster: sbatch script, submit, follow, collect"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    # Import only the command asked for (the report's pandas/matplotlib must not slow down `run`);
    # all of them when there is none, so that --help lists every command with its options.
    chosen = [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)
    mains, parsers = {}, {}
    for name, (module_name, prefix, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        parsers[name] = sub_parser
        if name in chosen:
            module = importlib.import_module(module_name)
            getattr(module, prefix + "add_arguments")(sub_parser)
            mains[name] = getattr(module, prefix + "main")
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage, and the flag a typo was meant to be (not the top-level usage)
        unknown(parsers[args.command], extra)
    return mains[args.command](args)


def unknown(parser: argparse.ArgumentParser, extra: list[str]) -> None:
    """Exit 2 with the command's usage: the arguments it does not take, and its nearest flag to each."""
    flags = [o for action in parser._actions for o in action.option_strings]
    hints = [f"{word.split('=')[0]} → {hint}" for word in extra if word.startswith("-")
             for hint in difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.6)]
    parser.error(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean: {', '.join(hints)}?)"
                                                                 if hints else ""))


if __name__ == "__main__":
    sys.exit(main())
