"""After a sweep (`bench run --report`): analyze → project → advise → report, each called through its
function (`bench.analyze.run`, `bench.project.run`, `bench.advise.run`, `bench.report.build_report`) with the
command's defaults, never through a command line. A step that fails says so and the next goes on: the sweep's
results are complete whatever the later stages do. Imported lazily by the sweep: pandas and matplotlib load
only when a report is asked for.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

# what --report runs before the report, in order: analyze first (project reads its bucket_timeline.csv),
# project, then advise (it ranks and projects to its default target); the report leads with advise's answer
STEPS = ("analyze", "project", "advise")


def commands(run_dir: Path) -> str:
    """The command lines that do what `after_run` does, for a run without --report."""
    return " && ".join(f"python -m bench {name} {shlex.quote(str(run_dir))}" for name in (*STEPS, "report"))


def _analyze(run_dir: Path) -> list[str]:
    from bench.analyze.api import NoTraces, run

    try:
        analysis = run(run_dir)
    except NoTraces:  # not a failure: said once, plainly
        return [f"bench analyze: no traces to analyse in {run_dir} (no profiled cell wrote one: "
                "profile.enabled, profile.cells); the report goes on without the traces' breakdown"]
    for line in analysis.errors:
        print(f"bench analyze: {line}", file=sys.stderr)
    return analysis.lines()


def _project(run_dir: Path) -> list[str]:
    from bench.project.api import run

    return run(run_dir).lines()


def _advise(run_dir: Path) -> list[str]:
    from bench.advise.api import run

    return run(run_dir).lines()


def after_run(run_dir: Path) -> int:
    """The steps on the run folder, then the report; 0 when the report was written."""
    for name, step in (("analyze", _analyze), ("project", _project), ("advise", _advise)):
        try:
            said = step(run_dir)  # what the command would print
        except Exception as e:  # noqa: BLE001 - a stage's failure must not hide the sweep's results
            print(f"`bench {name} {run_dir}` failed ({type(e).__name__}: {e}); the report goes on without it",
                  file=sys.stderr)
        else:
            print("\n".join(said))
    from bench.report import build_report

    try:
        index = build_report(run_dir)
    except Exception as e:  # a report bug must not hide that the sweep's results are complete
        print(f"report failed ({type(e).__name__}: {e}); results are in {run_dir}", file=sys.stderr)
        return 1
    print(f"report: {index}")
    return 0
