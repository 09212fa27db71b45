"""A run folder (results/<run-id>/, docs/design.md "Run folder"): the name of every file in it, and the one
reader of its rows, env.json and config.toml. The runner writes it (bench/run/);
analyze, project and report read it through here. Nothing here imports torch; pandas only where a table is
read.

Rows: strings stay strings ("" when empty); every other column is numeric with NaN for "not measured". A
value that breaks the contract (an unknown status, text in a number column, an empty comm_dtype) is an
error naming the column; a comm_dtype alias ("fp32", bench.schema.COMM_DTYPE_ALIASES) is read as what it
stands for ("none"), so the rest of the report sees the runner's spelling only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench.schema import (
    COMM_DTYPE_ALIASES,
    COMM_DTYPES,
    CONTRACT_COLUMNS,
    RESULT_COLUMNS,
    STATUSES,
    STRING_COLUMNS,
)

if TYPE_CHECKING:
    import pandas as pd

# ---- the files of a run folder ---------------------------------------------------------------------------
CONFIG = "config.toml"            # the resolved configuration (--resume compares against it)
ENV = "env.json"                  # machine and software fingerprint
CELLS = "cells.jsonl"             # append-only records, the source of truth
RESULTS = "results.csv"           # derived from cells.jsonl after every cell
SWEEP = "allreduce_sweep.csv"     # the probe's size sweep, derived with results.csv
ANATOMY = "anatomy.json"          # where the last `bench run` into it spent its time (schema.ANATOMY_PARTS)
LOCK = ".lock"                    # held by the run writing into the folder
LOGS = "logs"                     # launch plans, commands, outputs, events, NCCL logs
EVENTS = "events"                 # the workers' events of a run launched by the user's own torchrun/srun
NODE_ENV_GLOB = "env-*.json"      # per node of such a run (its worker's local rank 0), merged by --collect
PLAN = "plan.json"                # `bench run --plan-only`: the cells for the user's own torchrun/srun
SBATCH = "job.sbatch"             # `bench slurm`: the job script it wrote (and submitted, with --submit)
SLURM_JOB_ID = "slurm-job-id"     # under LOGS: the job `bench slurm --submit` follows
SLURM_OUTPUT = "slurm-%j.out"     # under LOGS: the job's output (sbatch --output; %j is the job id)
TRACES = "traces"                 # traces/<cell_id>/rank<r>.<ts>.pt.trace.json.gz
# under LOGS, per launch k of `bench run` (bench/run/launch.py): launch-<k>.<part>
LAUNCH_PARTS = (PLAN, "events.jsonl", "cmd", "out", "err", "pid")


def node_env(host: str) -> str:
    """The file a node's local rank 0 writes in a plan run: env-<host>.json."""
    return f"env-{host}.json"


def nccl_log_file(k: int) -> str:
    """Under LOGS: launch k's NCCL_DEBUG_FILE pattern (%h host, %p pid: one file per rank)."""
    return f"nccl-launch-{k}.%h.%p.log"


def nccl_plan_log_file(world_size: int | str) -> str:
    """Under LOGS: a plan run's NCCL_DEBUG_FILE pattern for its world size (`bench slurm`'s script sets it;
    `--collect` reads it): one file per rank."""
    return f"nccl-ws{world_size}.%h.%p.log"


def launch_file(k: int | str, part: str) -> str:
    """Launch k's file under LOGS: launch-<k>.<part>, part one of LAUNCH_PARTS (k "*": a glob of all)."""
    if part not in LAUNCH_PARTS:
        raise ValueError(f"part={part!r}: not one of {LAUNCH_PARTS}")
    return f"launch-{k}.{part}"


# written by `bench analyze RUN` (bench.analyze.summary.TABLES has their columns)
TRACE_SUMMARY = "trace_summary.csv"
BUCKET_TIMELINE = "bucket_timeline.csv"
IDLE_BREAKDOWN = "idle_breakdown.csv"
LAUNCH_STATS = "launch_stats.csv"
STRAGGLERS = "stragglers.csv"
KERNEL_CLASSES = "kernel_classes.csv"
WITNESSES = "witnesses.csv"
COLLECTIVE_WAIT = "collective_wait.csv"  # each rank's collectives split into wait and transfer
RANK_TIMELINE = "rank_timeline.csv"      # one step per multi-rank job: each rank's compute, wait, transfer
# written by `bench project RUN`, under PROJECTION_DIR
PROJECTION_DIR = "projection"
PROJECTION = "projection.csv"
PROJECTION_NOTES = "notes.txt"    # the caveats `bench project` printed, one a line
VALIDATION = "validation.csv"     # the projection against the world sizes the run measured
NETWORK_FIT = "network_fit.csv"   # the measured network's α-β fits
# notes.txt lines starting with this name where one configuration's straggler, interference and host-floor
# terms came from (one per configuration: a table in the report, not part of the printed or advised caveats)
PHYSICS_NOTE = "physics of "
# written by `bench advise RUN`, under ADVICE_DIR (its projection to the target in ADVICE_DIR/projection)
ADVICE_DIR = "advice"
ADVICE_MD = "advice.md"           # the short answer, the caveats, the ranking
ADVICE_CSV = "advice.csv"         # one row per configuration of the recipe, ranked, with its speedup
BEST_TOML = "best.toml"           # a ddpbench config: the advised configuration, its baseline, at the target
DDP_MD = "ddp.md"                 # the advised settings for the user's own script, and the launch lines


class RunError(ValueError):
    """A run folder that cannot be reported: missing files or rows that break the contract."""


# ---- who writes where: no command rewrites what another wrote into a run folder ---------------------------
# Inside a run folder a command writes only where it owns: `bench run` the folder itself (its files) and
# LOGS, TRACES, EVENTS; `bench analyze` its tables at the top level (beside the run's files, under names of
# its own); `bench project` PROJECTION_DIR; `bench advise` ADVICE_DIR (its projection to the target inside
# it). OWNED names each entry's writer (a file's name too: no folder may take it). An --out may also be
# a new folder inside the run under a name no command uses (`--out RUN/my-report`), or any folder outside.
OWNED = {PROJECTION_DIR: "project", ADVICE_DIR: "advise",
              **{name: "run" for name in (CONFIG, ENV, CELLS, RESULTS, SWEEP, ANATOMY, LOCK, LOGS, EVENTS,
                                          PLAN, SBATCH, TRACES)},
              **{name: "analyze" for name in (TRACE_SUMMARY, BUCKET_TIMELINE, IDLE_BREAKDOWN, LAUNCH_STATS,
                                              STRAGGLERS, KERNEL_CLASSES, WITNESSES, COLLECTIVE_WAIT,
                                              RANK_TIMELINE)}}
TOP_LEVEL_WRITERS = ("run", "analyze")
OWN_DIR = {"project": PROJECTION_DIR, "advise": ADVICE_DIR}  # a command's default folder in a run


class OutError(ValueError):
    """An --out a command must not write into; the message names --out and its value (exit 2)."""


# ---- every command that writes: one rule (docs/design.md "Where a command writes") ----------------------
# A folder outside a run's own parts is a command's only where it wrote it: MARKER, which every command
# that writes there keeps, lists per command the files it wrote ({command: [relative paths]}). A command
# overwrites (or, for a page, deletes) only the files MARKER lists under its own name, never a file because
# it has the name the command would write; inside the run it reads, its own part (OWNED) is its by the run
# folder's contract. Everything is written into a STAGE folder inside --out first and moved into place
# only when every file is there and none would replace a file the command does not own: a command that
# fails (a full disk, a refusal) leaves --out as it was.
MARKER = ".ddpbench-written"
STAGE_PREFIX = ".ddpbench-stage-"   # + pid: a command's files while it writes them
# Folders no command writes into or under (a system's own), and folders that are only a parent of others'
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin",
                  "/sys", "/usr")
SYSTEM_PARENTS = ("/", "/home", "/media", "/mnt", "/opt", "/run", "/srv", "/var", "/var/lib", "/var/log")
NEW_RUN = "run"  # `bench run` and `bench slurm`: --out is a new run folder (bench/run/folder.py creates it)


def enclosing_run(path: Path) -> Path | None:
    """The run folder `path` is (or is inside), else None: a folder holding cells.jsonl or results.csv, or
    config.toml beside env.json (what `bench run` writes first)."""
    for folder in (path, *path.parents):
        if (folder / CELLS).is_file() or (folder / RESULTS).is_file() or (
                (folder / CONFIG).is_file() and (folder / ENV).is_file()):
            return folder
    return None


def written_by(out: Path) -> dict[str, list[str]]:
    """MARKER's lists in `out`: command → the files it wrote there ({} without a readable one)."""
    marker = Path(out) / MARKER
    if marker.is_symlink() or not marker.is_file():
        return {}
    try:
        data = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return {k: [str(f) for f in v] for k, v in data.items() if isinstance(v, list)} \
        if isinstance(data, dict) else {}


def _name_problem(out: Path, shown: str) -> str | None:
    """A part of `out` longer than the filesystem allows (ENAMETOOLONG), said before anything is made."""
    existing = next(f for f in (out, *out.parents, Path(".")) if os.path.lexists(f))
    try:
        name_max = os.pathconf(existing if existing.is_dir() else existing.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = max(out.parts, key=lambda p: len(os.fsencode(p)))
    if len(os.fsencode(longest)) > name_max:
        return f"{shown[:80]}…: a name of {len(os.fsencode(longest))} bytes; this filesystem allows " \
            f"{name_max}"
    if len(os.fsencode(os.path.abspath(out))) + 64 > 4096:  # + a stage folder and a file name
        return f"{shown[:80]}…: a path of {len(os.fsencode(os.path.abspath(out)))} bytes is too long"
    return None


def _system_problem(out: Path, shown: str) -> str | None:
    """A system folder, or a folder that only holds other folders (/, /home, /var), named or reached
    through a link."""
    for path in {os.path.abspath(out), os.path.realpath(out)}:
        if any(path == f or path.startswith(f + "/") for f in SYSTEM_FOLDERS) or path in SYSTEM_PARENTS:
            return (f"{shown}: {path!r} is a system folder; no command writes there: choose a folder of "
                    "your own")
    return None


def _symlink_problem(out: Path, shown: str, names: tuple[str, ...]) -> str | None:
    """--out, or an entry in it the command writes, is a symbolic link: writing would go where it points."""
    for path in (out, *(out / n for n in names)):
        if path.is_symlink():
            return (f"{shown}: {str(path)!r} is a symbolic link (to {os.readlink(path)!r}); no command "
                    "writes through one: give the folder it points to, or a new one")
    return None


def _run_problem(absolute: Path, command: str, source: Path | str | None, shown: str) -> str | None:
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


def _files_under(folder: Path) -> list[str]:
    """Every file and link under `folder`, relative, leaving out MARKER and stage folders."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(STAGE_PREFIX)]
        rel = Path(root).relative_to(folder)
        found += [(rel / f).as_posix() for f in files if (rel / f).as_posix() != MARKER]
        found += [(rel / d).as_posix() + "/" for d in dirs if (Path(root) / d).is_symlink()]
    return sorted(found)


def _theirs(out: Path, command: str, names: tuple[str, ...], page: bool) -> list[str]:
    """The files in `out` this command would overwrite (a page: the files beside it) without having
    written them (MARKER)."""
    if not out.is_dir():
        return []
    mine = set(written_by(out).get(command, []))
    files = _files_under(out)
    if not page:
        files = [f for f in files if f.split("/", 1)[0].rstrip("/") in names]
    return [f for f in files if f not in mine]


def out_problem(out: Path | str, command: str, source: Path | str | None = None, names: tuple[str, ...] = (),
                page: bool = False) -> str | None:
    """Why `bench <command>` must not write into the folder `out` (None when it may; nothing is created):
    a name too long; a file, or under one; a symbolic link (--out or one of `names`, the entries it writes
    there); a system folder; not writable; a part of a run folder another command owns, or this command's
    own part of another run than `source` (None: no run, a what-if), or for a new run (NEW_RUN) any folder
    inside a run; or, outside the command's own part of `source`, a folder holding files of those `names`
    the command did not write there (MARKER) — with `page`, any file it did not write (a page is a folder
    of its own)."""
    out = Path(out)
    shown = f"--out={str(out)!r}"
    problem = _name_problem(out, shown)
    if problem:
        return problem
    for folder in (out, *out.parents):
        if os.path.lexists(folder) and folder.exists() and not folder.is_dir():
            return f"{shown}: {str(folder)!r} is a file, not a folder"
    problem = _symlink_problem(out, shown, names) or _system_problem(out, shown)
    if problem:
        return problem
    existing = next(f for f in (out, *out.parents, Path(".")) if f.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{shown}: {str(existing)!r} is not writable"
    problem = _run_problem(Path(os.path.abspath(out)), command, source, shown)
    if problem or command == NEW_RUN or own_part(out, command, source):
        return problem
    theirs = _theirs(out, command, names, page)
    return _refusal(shown, command, theirs) if theirs else None


def _refusal(shown: str, command: str, theirs: list[str]) -> str:
    more = " …" if len(theirs) > 3 else ""
    return (f"{shown} holds {len(theirs)} file(s) `bench {command}` did not write there "
            f"({sorted(theirs)[:3]}{more}; its {MARKER} lists what it wrote): it neither overwrites nor "
            "deletes them; choose a new or empty folder")


def check_out(out: Path | str, command: str, source: Path | str | None = None, names: tuple[str, ...] = (),
              page: bool = False) -> Path:
    """`out` as a Path when `bench <command>` reading `source` may write into it, else OutError
    (out_problem's reason)."""
    problem = out_problem(out, command, source, names, page)
    if problem:
        raise OutError(problem)
    return Path(out)


@contextmanager
def writing(out: Path | str, command: str, source: Path | str | None = None, names: tuple[str, ...] = (),
            page: bool = False) -> Iterator[Path]:
    """Write a command's files into `out` by the rule above: checked (OutError), then a stage folder
    inside `out` to write into, whose files replace the command's earlier ones in `out` when the block
    ends (a page's earlier files it no longer writes are deleted; anything else stays) and MARKER says
    what it wrote. A refusal found then (a file of its names the command does not own, a link on the way)
    is OutError and an error inside the block propagates: either way `out` is left as it was, the folders
    made for it removed when empty."""
    out = check_out(out, command, source, names, page)
    made = [f for f in (out, *out.parents) if not os.path.lexists(f)]
    stage, done = None, False
    try:
        out.mkdir(parents=True, exist_ok=True)
        _remove_stale_stages(out)
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=out))
        yield stage
        _publish(stage, out, command, own_part(out, command, source), page)
        done = True
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        for folder in made if not done else ():
            try:
                folder.rmdir()
            except OSError:
                break


def _remove_stale_stages(out: Path) -> None:
    """Stage folders in `out` of commands that died while writing (their pid gone)."""
    for stage in out.glob(f"{STAGE_PREFIX}*"):
        pid = stage.name[len(STAGE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not stage.is_symlink() and stage.is_dir() and not _alive(int(pid)):
            shutil.rmtree(stage, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _publish(stage: Path, out: Path, command: str, owned: bool, page: bool) -> None:
    """The stage's files moved into `out` (module comment above); OutError, nothing moved, on a file the
    command does not own or a link or file on a new file's way."""
    shown = f"--out={str(out)!r}"
    new = [f for f in _files_under(stage) if not f.endswith("/")]
    markers = written_by(out)
    mine = set(markers.get(command, []))
    theirs = []
    for rel in new:
        target = out / rel
        for folder in [out / p for p in Path(rel).parents if str(p) != "."][::-1]:
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                what = "a symbolic link" if folder.is_symlink() else "a file"
                raise OutError(f"{shown}: {str(folder)!r} is {what}, where `bench {command}` writes the "
                               f"folder of {rel!r}: nothing was written")
        if os.path.lexists(target) and (target.is_symlink() or not target.is_file() or
                                        not (owned or rel in mine)):
            theirs.append(rel)
    if page and not owned:
        theirs += [f for f in _files_under(out) if f not in mine and f not in theirs]
    if theirs:
        raise OutError(_refusal(shown, command, theirs))
    for rel in sorted(mine - set(new)) if page else ():  # an earlier page's files this one does not write
        old = out / rel
        if old.is_file() and not old.is_symlink():
            old.unlink()
            for folder in [out / p for p in Path(rel).parents if str(p) != "."]:
                try:
                    folder.rmdir()
                except OSError:
                    break
    for rel in new:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / rel, out / rel)
    if not owned:
        markers[command] = sorted(set(new) | (set() if page else mine))
        tmp = stage / MARKER
        tmp.write_text(json.dumps(markers, indent=1) + "\n")
        os.replace(tmp, out / MARKER)


@dataclass
class Run:
    """One run folder: its result rows, environment fingerprint and resolved config."""

    path: Path
    results: pd.DataFrame
    env: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def device(self) -> str:
        """ "cpu" or "cuda": env.json's word, else the rows' (a run never mixes devices)."""
        if self.env.get("device"):
            return str(self.env["device"])
        devices = sorted(set(self.results["device"]) - {""})
        return devices[0] if len(devices) == 1 else "unknown"


def read_records(run_dir: Path | str) -> list[dict]:
    """The latest record of every cell in cells.jsonl, in the order cells first appear (a line cut short by
    a kill is ignored): a later line for the same cell_id supersedes an earlier one (cells.jsonl stays
    append-only while a record is completed, e.g. its traces, written after the launch's timed steps)."""
    path = Path(run_dir) / CELLS
    if not path.is_file():
        return []
    rows: dict[str, dict] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a last line cut short by a kill: that cell never finished
            continue
        if isinstance(row, dict) and "cell_id" in row:
            rows[row["cell_id"]] = row  # dict order: first appearance; value: the last line
    return list(rows.values())


def read_anatomy(run_dir: Path | str) -> dict | None:
    """anatomy.json (where the last `bench run` into the folder spent its wall time, schema.ANATOMY_PARTS), or
    None for a folder without one (older runs, plan runs)."""
    path = Path(run_dir) / ANATOMY
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_results_csv(run_dir: Path | str) -> pd.DataFrame:
    """results.csv as written: text columns as strings ("" when empty), the others as pandas reads them
    (RunError when it is not a readable CSV). `load_run` is the typed, cross-checked view of the rows."""
    return _read_csv(Path(run_dir) / RESULTS)


def _read_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        return pd.read_csv(path, dtype={c: str for c in STRING_COLUMNS}, keep_default_na=False, na_values={})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise RunError(f"{path}: not a readable CSV ({str(e).splitlines()[0][:120]})") from None


def _read_rows(run_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """The run's rows. cells.jsonl is the source of truth: when it is there the rows come from it, and
    results.csv (derived from it) is cross-checked — a truncated or stale results.csv is said, not trusted."""
    import pandas as pd

    csv_path, jsonl_path = run_dir / RESULTS, run_dir / CELLS
    if jsonl_path.is_file():
        rows = read_records(run_dir)
        df = pd.DataFrame(rows, columns=None if rows else list(RESULT_COLUMNS)).drop(
            columns=["step_times_ms", "cell", "allreduce_sweep"], errors="ignore")
        if not csv_path.is_file():
            return df, ["results.csv is missing; rows were read from cells.jsonl (the run may be "
                        "incomplete)."]
        try:
            csv_ids = list(_read_csv(csv_path)["cell_id"]) if csv_path.stat().st_size else []
        except (RunError, KeyError) as e:
            return df, [f"results.csv cannot be read ({e}); rows were rebuilt from cells.jsonl."]
        jsonl_ids = [r["cell_id"] for r in rows]
        if csv_ids != jsonl_ids:
            missing = len(set(jsonl_ids) - set(csv_ids))
            return df, [f"results.csv disagrees with cells.jsonl (the source of truth): {len(csv_ids)} rows "
                        f"against {len(jsonl_ids)} cells, {missing} missing from it (truncated or stale?); "
                        "the report uses cells.jsonl."]
        return df, []
    if csv_path.is_file():
        return _read_csv(csv_path), ["cells.jsonl is missing; rows were read from results.csv."]
    raise RunError(
        f"{run_dir}: neither results.csv nor cells.jsonl found (is this a results/<run-id>/ folder?)"
    )


def normalise(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Typed columns in RESULT_COLUMNS order (extra runner columns kept after them)."""
    import pandas as pd

    missing = [c for c in CONTRACT_COLUMNS if c not in df.columns]
    if missing:
        raise RunError(f"{source}: missing contract columns {missing}")
    df = df.copy()
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = "" if col in STRING_COLUMNS else float("nan")
    for col in df.columns:
        if col in STRING_COLUMNS:
            df[col] = df[col].fillna("").astype(str)
        elif col in RESULT_COLUMNS:
            blank = df[col].astype(str).str.strip().isin(["", "None", "nan"])
            values = pd.to_numeric(df[col].where(~blank), errors="coerce")
            bad = values.isna() & ~blank & df[col].notna()
            if bad.any():
                raise RunError(
                    f"{source}: column {col!r} holds non-numbers {sorted(set(df.loc[bad, col]))[:3]}"
                )
            infinite = values.abs() == float("inf")  # the writer never writes one: an edited or foreign file
            if infinite.any():
                cells = list(df.loc[infinite, "cell_id"])[:3] if "cell_id" in df else []
                raise RunError(f"{source}: column {col!r} holds {values[infinite].iloc[0]} in "
                               f"{int(infinite.sum())} rows (e.g. {cells}); a value not measured is empty, "
                               "never inf")
            df[col] = values.astype(float)
    unknown = sorted(set(df["status"]) - set(STATUSES))
    if unknown:
        raise RunError(f"{source}: unknown status {unknown}; expected one of {STATUSES}")
    df["comm_dtype"] = _comm_dtypes(df, source)
    extras = [c for c in df.columns if c not in RESULT_COLUMNS]
    return df[list(RESULT_COLUMNS) + extras].reset_index(drop=True)


def _comm_dtypes(df: pd.DataFrame, source: str) -> pd.Series:
    """The rows' comm_dtype in the runner's words: a config alias ("fp32") becomes the value it stands for
    ("none"), so every table sees one spelling of "no compression". An empty comm_dtype says nothing about
    how the gradients travelled: it is refused rather than guessed."""
    empty = df["comm_dtype"] == ""
    if empty.any():
        cells = list(df.loc[empty, "cell_id"])[:3]
        raise RunError(
            f"{source}: column 'comm_dtype' is empty in {int(empty.sum())} rows (e.g. {cells}); expected one "
            f"of {COMM_DTYPES} or an alias of one {COMM_DTYPE_ALIASES}"
        )
    return df["comm_dtype"].replace(COMM_DTYPE_ALIASES)


def load_run(run_dir: Path | str) -> Run:
    """Load results, env.json and config.toml of `run_dir`; env and config may be absent (noted)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: no such run folder")
    raw, notes = _read_rows(run_dir)
    results = normalise(raw, str(run_dir))
    env, config = {}, {}
    if (run_dir / ENV).is_file():
        try:
            env = json.loads((run_dir / ENV).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{run_dir / ENV}: not valid JSON ({e})") from None
        if not isinstance(env, dict):
            raise RunError(f"{run_dir / ENV}: not a JSON object")
    else:
        notes.append("env.json is missing: the environment fingerprint is unknown.")
    if (run_dir / CONFIG).is_file():
        try:
            config = tomllib.loads((run_dir / CONFIG).read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{run_dir / CONFIG}: not valid TOML ({e})") from None
    else:
        notes.append("config.toml is missing: the resolved preset is unknown.")
    return Run(path=run_dir, results=results, env=env, config=config, notes=notes)
