"""Whether a command may write into an --out folder (checked before anything is created): a name the
filesystem allows, no file or symbolic link on the way, no system folder, writable, not another command's
part of a run (bench/run_folder/ownership.py), and no file there the command did not write (MARKER)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.run_folder.ownership import NEW_RUN, own_part, run_problem


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



def files_under(folder: Path) -> list[str]:
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
    files = files_under(out)
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
    problem = run_problem(Path(os.path.abspath(out)), command, source, shown)
    if problem or command == NEW_RUN or own_part(out, command, source):
        return problem
    theirs = _theirs(out, command, names, page)
    return refusal(shown, command, theirs) if theirs else None


def refusal(shown: str, command: str, theirs: list[str]) -> str:
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
