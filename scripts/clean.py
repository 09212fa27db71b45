"""`make clean`: remove caches and build leftovers of the project (never .venv, results/ or reports/)."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEEP = {".venv", ".git", "results", "reports"}


def leftovers() -> list[Path]:
    """Cache and build folders under the project, outside the kept folders."""
    found = [ROOT / name for name in (".pytest_cache", ".ruff_cache", ".benchmarks", "build")]
    found += list(ROOT.glob("*.egg-info"))
    found += [p for p in ROOT.rglob("__pycache__") if not KEEP & set(p.relative_to(ROOT).parts)]
    return [p for p in found if p.exists()]


if __name__ == "__main__":
    for path in leftovers():
        shutil.rmtree(path)
        print(f"clean: removed {path.relative_to(ROOT)}")
