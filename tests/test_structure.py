"""The code's size rules (docs/design.md "Invariants"), checked on the source: a module reads top to bottom in
one sitting (at most MAX_FILE_LINES lines), a function fits a screen (MAX_FUNCTION_LINES) and takes what a
reader can hold (MAX_PARAMETERS, self and cls not counted); how much of a group's passes a launch runs is
the Passes value's to say (no `full` flag in bench/run); design.md is a map (at most MAX_DESIGN_LINES lines,
naming only paths that exist) and README's first section one screen (MAX_README_HEAD lines)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("bench", "ddp_core")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 8
MAX_DESIGN_LINES = 700
MAX_README_HEAD = 45


def source_files() -> list[Path]:
    return sorted(p for folder in SOURCES for p in (ROOT / folder).rglob("*.py"))


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def parameter_count(fn: ast.FunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
    return len([n for n in names if n not in ("self", "cls")])


def where(path: Path, fn: ast.FunctionDef | None = None) -> str:
    return f"{path.relative_to(ROOT)}" + (f":{fn.lineno} {fn.name}" if fn else "")


def test_no_module_is_longer_than_a_sitting():
    long = {where(p): n for p in source_files() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_no_function_is_longer_than_a_screen():
    long = {where(p, f): f.end_lineno - f.lineno + 1 for p in source_files() for f in functions(p)
            if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES}
    assert long == {}


def test_no_function_takes_more_than_a_reader_holds():
    many = {where(p, f): n for p in source_files() for f in functions(p)
            if (n := parameter_count(f)) > MAX_PARAMETERS}
    assert many == {}


def test_the_counters_count():
    tree = ast.parse("def f(self, a, b=1, *c, d, **e):\n    pass\n")
    assert parameter_count(tree.body[0]) == 5


def test_the_passes_decide_the_phases_not_a_full_flag():
    # a launch's phases are its Passes value's (bench/worker/cell.py): a `full` boolean beside it would be
    # a second owner of the same decision
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "bench" / "run").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\.full\b|\bfull\s*=|\bfull\s*:", line)]
    assert found == []


DESIGN = ROOT / "docs" / "design.md"
# a path the design names: a repository folder's file or folder, in backquotes
NAMED_PATH = re.compile(r"`((?:bench|ddp_core|tests|docs|scripts|benchmarks|examples|\.ci)/[\w./-]*)")


def named_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in NAMED_PATH.findall(text) if "*" not in m and "<" not in m}


def test_design_is_a_map():
    text = DESIGN.read_text()
    assert len(text.splitlines()) <= MAX_DESIGN_LINES
    missing = sorted(p for p in named_paths(text) if not (ROOT / p).exists())
    assert missing == []


def test_the_path_finder_finds_paths():
    assert named_paths("see `bench/run/launch.py` and `docs/x.md`, `bench/run/` not `foo/bar.py`") == {
        "bench/run/launch.py", "docs/x.md", "bench/run/"}


def test_readme_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    # the first screen: the title and the first section, up to the second `## ` heading
    second = [i for i, line in enumerate(lines) if line.startswith("## ")][1]
    assert second <= MAX_README_HEAD
    head = "\n".join(lines[:second])
    assert "make bench" in head or "python -m bench run" in head  # the main job
    assert "make test" in head  # the test command
