"""The run folder as the launcher opens it: created (or checked against its config.toml on --resume),
locked for this process's life, env.json written, the skipped cells recorded, and what an earlier launch into
it left running stopped. Its file names are bench/run_folder/layout.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench import run_folder
from bench.config import BenchConfig, ConfigError, config_from_dict, read_tables, to_toml
from bench.matrix import Cell
from bench.run import results
from bench.run.planner import Plan
from bench.schema import STATUSES, backend_for

RETRYABLE = tuple(s for s in STATUSES if s not in ("ok", "skipped"))  # what --retry may name


class FolderTaken(ConfigError):
    """A new run folder's name is taken (it exists, or another run made it first)."""


@dataclass
class RunFolder:
    """An open run folder: its path, the lock held on it, and the cells already recorded there (a resumed
    run measures them again only when their status is retried)."""

    path: Path
    lock: IO = field(repr=False)
    done: set[str] = field(default_factory=set)
    retried: set[str] = field(default_factory=set)  # recorded with a status --retry names: measured afresh

    def todo(self, plan: Plan) -> list[Cell]:
        """The plan's runnable cells that have no record here yet."""
        return [c for c in plan.runnable if c.cell_id not in self.done]


def default_run_dir(preset: str) -> Path:
    """results/<preset>-<host>-<date>-<time>.<ms>, with a suffix if that exists (two runs in one ms)."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    out = Path("results") / f"{preset}-{socket.gethostname()}-{stamp}"
    n = 1
    while out.exists():
        n += 1
        out = out.with_name(f"{preset}-{socket.gethostname()}-{stamp}-{n}")
    return out


def new_default_run_dir(plan: Plan) -> Path:
    """default_run_dir made: a name another run takes between the look and the making is passed over."""
    for _ in range(100):
        try:
            return prepare(default_run_dir(plan.preset), plan.config, resume=False)
        except FolderTaken:
            continue
    raise ConfigError("results/: no new run folder could be made (100 names taken at once)")


def _comparable(config: BenchConfig) -> dict:
    data = config.to_dict()
    data.pop("debug")  # test-only fault injection may differ between a run and its resumption
    return data


def first_difference(saved: dict, now: dict, prefix: str = "") -> tuple[str, object, object] | None:
    """The first dotted key whose value differs between two nested config dicts: (key, saved, now)."""
    for key in list(saved) + [k for k in now if k not in saved]:
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found = first_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}", a, b
    return None


def check_retry(retry: set[str], resume: bool) -> None:
    """--retry names statuses a resumed run measures again (ConfigError otherwise)."""
    unknown = sorted(retry - set(RETRYABLE))
    if unknown:
        raise ConfigError(f"--retry={unknown[0]!r}: must be statuses among {list(RETRYABLE)}")
    if retry and not resume:
        raise ConfigError(f"--retry={','.join(sorted(retry))!r}: needs --resume (it re-runs cells of an "
                          "existing run folder)")


def prepare(out: Path, config: BenchConfig, resume: bool) -> Path:
    """The run folder `out`, created (or checked, with `resume`); ConfigError when it must not be used."""
    if resume:
        saved = out / run_folder.CONFIG
        if not saved.is_file():
            raise ConfigError(f"--resume: {str(out)!r} holds no config.toml to resume")
        differs = first_difference(_comparable(config_from_dict(read_tables(saved))), _comparable(config))
        if differs:
            key, was, now = differs
            raise ConfigError(f"--resume: {key}={now!r} differs from {was!r} in {str(saved)!r}; resume with "
                              "the same preset and --set values, or use a new --out")
        if (out / run_folder.ENV).is_file():  # a user model's file must be the one the run measured
            from bench.workloads import check_model_unchanged

            try:
                check_model_unchanged(json.loads((out / run_folder.ENV).read_text()).get("user_model"),
                                      config.workload.model)
            except ValueError as e:
                raise ConfigError(f"--resume: {e}; use a new --out") from None
        return out
    if os.path.lexists(out):
        raise FolderTaken(f"--out={str(out)!r} already exists; refusing to overwrite it "
                          "(--resume continues it, or choose another --out)")
    problem = run_folder.out_problem(out, run_folder.NEW_RUN)  # a long name, a system folder, inside a run
    if problem:
        raise ConfigError(problem)
    create(out)
    try:
        (out / run_folder.CONFIG).write_text(to_toml(config))
    except OSError as e:  # read-only, a full disk: the folder this process made is not left half-made
        shutil.rmtree(out, ignore_errors=True)
        raise ConfigError(f"--out={str(out)!r}: cannot create the run folder ({e.strerror or e})") from None
    return out


def create(out: Path) -> None:
    """Make the new folder `out`, atomically: of two runs starting on one --out, one makes it and the other
    is refused (ConfigError), never deleting what the first made."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.mkdir()
    except FileExistsError:
        raise FolderTaken(f"--out={str(out)!r} already exists (another run made it just now); refusing to "
                          "overwrite it (--resume continues it, or choose another --out)") from None
    except OSError as e:  # under a file, in /proc, read-only, full
        raise ConfigError(f"--out={str(out)!r}: cannot create the run folder ({e.strerror or e})") from None


def lock_run_dir(run_dir: Path) -> IO:
    """Hold an exclusive lock on run_dir for this process's life; ConfigError if another run holds it.

    Two `bench run` processes on one folder (a --resume started while the first still runs) would both
    launch the same cells and write duplicate rows; the lock makes the second one refuse instead.
    The lock file's descriptor is not inherited by the launches and goes away with this process.
    """
    handle = open(run_dir / run_folder.LOCK, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(f"--out={str(run_dir)!r} is in use by another bench run (pid {holder}); "
                          "wait for it to finish or stop it, then --resume") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    except OSError:  # a full disk: the pid could not be written; the caller says so
        with contextlib.suppress(OSError):
            handle.close()
        raise
    return handle


def write_env(run_dir: Path, config: BenchConfig) -> None:
    """env.json: the machine and software fingerprint, plus threads and variables per launch."""
    from bench import envinfo
    from bench.run.launch import launch_env
    from bench.workloads import describe_model_spec

    device = config.run.device
    threads = {str(ws): config.run.threads_for(ws) for ws in sorted(set(config.matrix.world_size))}
    # what each launch adds to the environment above, per world size (env_vars is the launcher's own)
    launch_vars = {ws: launch_env(device, n) for ws, n in threads.items()}
    info = envinfo.collect(device, backend_for(device), [sys.executable, "-m", "bench", *sys.argv[1:]],
                           extra={"threads_per_rank": threads, "launch_env_vars": launch_vars,
                                  "user_model": describe_model_spec(config.workload.model)})
    (run_dir / run_folder.ENV).write_text(json.dumps(info, indent=2) + "\n")


def open_run(plan: Plan, out: Path | None = None, resume: bool = False,
             retry: set[str] = frozenset()) -> RunFolder:
    """The plan's run folder, ready to sweep into: created under `out` (default results/<preset>-<host>-
    <time>) or, with `resume`, checked against its config.toml; locked; processes an earlier launch into it
    left running stopped; env.json written once; the plan's skipped cells recorded. Cells recorded with a
    status in `retry` count as not done. ConfigError (nothing created) when the folder cannot be used."""
    check_retry(set(retry), resume)
    run_dir = prepare(out, plan.config, resume) if out is not None else new_default_run_dir(plan)
    try:
        return _ready(run_dir, plan, resume, retry)
    except OSError as e:  # the disk filled (or went read-only) while the folder was set up
        if not resume:  # made by this process a moment ago: not left half-made
            shutil.rmtree(run_dir, ignore_errors=True)
        raise ConfigError(f"--out={str(run_dir)!r}: cannot {'open' if resume else 'create'} the run folder "
                          f"({e.strerror or e})") from None


def _ready(run_dir: Path, plan: Plan, resume: bool, retry: set[str]) -> RunFolder:
    """open_run's folder locked, an earlier launch's leftovers stopped, env.json and skipped cells
    written (OSError, the lock released, when the folder stops taking writes)."""
    lock = lock_run_dir(run_dir)
    try:
        return _recorded(run_dir, plan, resume, retry, lock)
    except OSError:
        lock.close()
        raise


def _recorded(run_dir: Path, plan: Plan, resume: bool, retry: set[str], lock: IO) -> RunFolder:
    if resume:  # an earlier launch's processes must not run beside this one
        from bench.lifetime import leftovers, stop

        left = leftovers(run_dir)
        if left:
            stop(left)
            print(f"--resume: stopped {len(left)} process(es) an earlier launch into {run_dir} left running "
                  f"(pids {', '.join(map(str, left))})", file=sys.stderr)
    if not (run_dir / run_folder.ENV).exists():
        write_env(run_dir, plan.config)
    records = results.read_records(run_dir)
    launches = plan.config.run.launches
    done = {r["cell_id"] for r in records if r["status"] not in retry and launches_complete(r, launches)}
    for cell in plan.cells:
        if cell.skip_reason and cell.cell_id not in done:
            record = results.make_record(cell, plan.config, "skipped", cell.skip_reason)
            results.append_record(run_dir, record)
            done.add(cell.cell_id)
    return RunFolder(path=run_dir, lock=lock, done=done,
                     retried={r["cell_id"] for r in records if r["status"] in retry})


def launches_complete(record: dict, launches: int) -> bool:
    """A recorded cell is finished when it failed (a failure ends it), when every launch measured it (a run
    stopped between its launches resumes with the missing ones), or when a plan run recorded it."""
    rows = record.get("launch_rows")  # none: a plan run's record (one launch by its nature; --collect)
    return record["status"] not in ("ok", "diverged") or rows is None or len(rows) >= launches
