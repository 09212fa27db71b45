"""Writing a command's files into --out by the rule of bench/run_folder/safety.py: into a stage folder
first, published into place only when every file is there and none would replace a file the command
does not own, so that a command that fails leaves --out as it was."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.run_folder.ownership import own_part
from bench.run_folder.safety import (
    MARKER,
    STAGE_PREFIX,
    OutError,
    check_out,
    files_under,
    refusal,
    written_by,
)


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
    new = [f for f in files_under(stage) if not f.endswith("/")]
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
        theirs += [f for f in files_under(out) if f not in mine and f not in theirs]
    if theirs:
        raise OutError(refusal(shown, command, theirs))
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
