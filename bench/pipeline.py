"""After a sweep (`bench run --report`): analyze → project → advise → report, called as functions.

Each step is the command's own module (its `add_arguments` and `main`, with the command's defaults), not
`bench.__main__` re-entered by a command string. A step that fails says so and the next goes on: the
sweep's results are complete whatever the later stages do. Imported lazily by run_cli: pandas and
matplotlib load only when a report is asked for.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

# (command, module): analyze first, project reads its bucket_timeline.csv, advise ranks and projects to its
# default target; the report leads with advise's answer
STEPS = (("analyze", "bench.analyze.cli"), ("project", "bench.project.cli"), ("advise", "bench.advise.cli"))


def _defaults(module, run_dir: Path) -> argparse.Namespace:
    """The command's arguments for `run_dir` with every option at its default."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args([str(run_dir)])


def after_run(run_dir: Path) -> int:
    """The steps on the run folder, then the report; 0 when the report was written."""
    for name, module_name in STEPS:
        module = importlib.import_module(module_name)
        if module.main(_defaults(module, run_dir)) != 0:
            print(f"`bench {name} {run_dir}` failed (above); the report goes on without it", file=sys.stderr)
    from bench.report import build_report

    try:
        index = build_report(run_dir)
    except Exception as e:  # a report bug must not hide that the sweep's results are complete
        print(f"report failed ({type(e).__name__}: {e}); results are in {run_dir}", file=sys.stderr)
        return 1
    print(f"report: {index}")
    return 0
