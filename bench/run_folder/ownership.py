"""Who writes where in a run folder: each part's one writer, and the refusal when a command would write
into a part that is not its own (another command's, or its own part of another run)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.run_folder.layout import (
    ADVICE_DIR,
    ANATOMY,
    BUCKET_TIMELINE,
    CELLS,
    COLLECTIVE_WAIT,
    CONFIG,
    ENV,
    EVENTS,
    IDLE_BREAKDOWN,
    KERNEL_CLASSES,
    LAUNCH_STATS,
    LOCK,
    LOGS,
    PLAN,
    PROJECTION_DIR,
    RANK_TIMELINE,
    RESULTS,
    SBATCH,
    STRAGGLERS,
    SWEEP,
    TRACE_SUMMARY,
    TRACES,
    WITNESSES,
)

# ---- who writes where: no command rewrites what another wrote into a run folder ---------------------------
# Inside a run folder a command writes only where it owns: `bench run` the folder itself (its files) and
# LOGS, TRACES, EVENTS; `bench analyze` its tables at the top level (beside the run's files, under names of
# its own); `bench project` PROJECTION_DIR; `bench advise` ADVICE_DIR (its projection to the target inside
# it). OWNED names each entry's writer (a file's name too: no folder may take it). An --out may also be
# a new folder inside the run under a name no command uses (`--out RUN/my-report`), or any folder outside.
OWNED = {PROJECTION_DIR: "project", ADVICE_DIR: "advise",
         **{name: "run" for name in (CONFIG, ENV, CELLS, RESULTS, SWEEP, ANATOMY, LOCK, LOGS, EVENTS, PLAN,
                                     SBATCH, TRACES)},
         **{name: "analyze" for name in (TRACE_SUMMARY, BUCKET_TIMELINE, IDLE_BREAKDOWN, LAUNCH_STATS,
                                         STRAGGLERS, KERNEL_CLASSES, WITNESSES, COLLECTIVE_WAIT,
                                         RANK_TIMELINE)}}
TOP_LEVEL_WRITERS = ("run", "analyze")
OWN_DIR = {"project": PROJECTION_DIR, "advise": ADVICE_DIR}  # a command's default folder in a run
NEW_RUN = "run"  # `bench run` and `bench slurm`: --out is a new run folder (bench/run/folder.py creates it)


def enclosing_run(path: Path) -> Path | None:
    """The run folder `path` is (or is inside), else None: a folder holding cells.jsonl or results.csv, or
    config.toml beside env.json (what `bench run` writes first)."""
    for folder in (path, *path.parents):
        if (folder / CELLS).is_file() or (folder / RESULTS).is_file() or (
                (folder / CONFIG).is_file() and (folder / ENV).is_file()):
            return folder
    return None



def run_problem(absolute: Path, command: str, source: Path | str | None, shown: str) -> str | None:
    """A part of a run folder another command owns, or this command's own part of another run."""
    run = enclosing_run(absolute)
    if run is None:
        return None
    inside = absolute.relative_to(run).parts
    if command == NEW_RUN:
        return (f"{shown}: is inside the run folder {str(run)!r}; a run folder is never made inside another "
                "(the later commands would read them as one): choose a folder outside it")
    owner = OWNED.get(inside[0]) if inside else TOP_LEVEL_WRITERS[0]
    if owner is None:  # a new folder of the user's inside the run
        return None
    mine = command in TOP_LEVEL_WRITERS if not inside else owner == command
    if mine and _same_run(run, source):
        return None
    where = f"the run folder {str(run)!r} itself" if not inside else f"{str(run / inside[0])!r}"
    whose = (" and ".join(f"`bench {c}`" for c in TOP_LEVEL_WRITERS) + " write" if not inside
             else f"`bench {owner}` writes")
    what = "another command's files"
    if mine:  # this command's part, of another run (or of a run, for a what-if)
        whose += f" for that run, not for {'a what-if' if source is None else repr(str(source))}"
        what = "another run's files"
    own = OWN_DIR.get(command)
    instead = (f"leave --out out (it writes {str(Path(source) / own)!r}) or " if own and source else "") + \
        "choose a new folder (inside the run, one no command writes, or outside it)"
    return f"{shown}: is {where}, which {whose}; `bench {command}` does not rewrite {what}: {instead}"


def _same_run(run: Path, source: Path | str | None) -> bool:
    return source is not None and Path(os.path.abspath(source)) == run


def own_part(out: Path | str, command: str, source: Path | str | None) -> bool:
    """Whether `out` is this command's own part of the run it reads (OWNED): its by the run's contract."""
    absolute = Path(os.path.abspath(out))
    run = enclosing_run(absolute)
    if run is None or not _same_run(run, source):
        return False
    inside = absolute.relative_to(run).parts
    return command in TOP_LEVEL_WRITERS if not inside else OWNED.get(inside[0]) == command
