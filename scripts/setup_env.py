"""Idempotent set-up: install ddpbench and its dev tools into the active environment or ./.venv.

Why a script rather than a bare `pip install -e .[dev]`: on a machine without torch, pip would resolve the
`torch` range against the package index and may pull several GB of CUDA wheels onto a CPU-only machine.
So torch is installed first, pinned (`TORCH_SPEC`, default `torch==2.13.0`, which the local wheel
directory of a CPU machine satisfies with its CPU build), and only then the project, whose range the
installed torch already satisfies. A stamp keyed on pyproject.toml makes a second run a no-op.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"


def target_python(create: bool = True) -> Path:
    """The interpreter to install into: the active virtualenv/conda env if any, else ./.venv (created)."""
    active = os.environ.get("VIRTUAL_ENV") or os.environ.get("CONDA_PREFIX")
    if active and Path(sys.prefix).resolve() == Path(active).resolve():
        return Path(sys.executable)
    if active:
        return Path(active) / "bin" / "python"
    python = VENV / "bin" / "python"
    if create and not python.exists():
        print(f"setup: creating {VENV}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    return python


def has_module(python: Path, module: str) -> bool:
    """True when `module` imports in the target interpreter."""
    probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def pip(python: Path, *args: str) -> None:
    """Run pip in the target interpreter, loudly failing on error."""
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    print("setup:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    if "--print-python" in sys.argv:  # for the Makefile: where set-up installs, without doing it
        print(target_python(create=False))
        return 0
    python = target_python()
    stamp = python.parent.parent / ".ddpbench-setup-stamp"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == digest and has_module(python, "ddp_core"):
        print(f"setup: up to date ({python})")
        return 0
    if not has_module(python, "torch"):
        pip(python, os.environ.get("TORCH_SPEC", "torch==2.13.0"))
    pip(python, "-e", f"{ROOT}[dev]")
    stamp.write_text(digest + "\n")
    print(f"setup: done ({python})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
