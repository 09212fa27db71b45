"""docs/reference.md is generated (scripts/reference_tables.py, `make reference`) from the owners of the
config keys, the command-line flags and the result columns: it must be what the generator writes now, and
every entry must have an explanation in its owner."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "reference_tables.py"


@pytest.fixture(scope="module")
def check() -> subprocess.CompletedProcess:
    # its own process: a plug-in engine another test registered in this one would be in the tables
    env = {k: v for k, v in os.environ.items() if k != "DDPBENCH_ENGINE_MODULES"}
    return subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True,
                          env=env | {"PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=300)


def test_every_key_flag_and_column_is_explained_by_its_owner(check):
    missing = [line for line in check.stderr.splitlines() if line.startswith("no explanation")]
    assert missing == [], "\n".join(missing)


def test_the_reference_is_what_the_generator_writes(check):
    assert check.returncode == 0, check.stderr[-2000:] + "\nrun `make reference` and commit docs/reference.md"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("reference_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_an_item_is_explained_by_its_comment_or_the_lines_above(generator, tmp_path):
    source = tmp_path / "columns.py"
    source.write_text('COLUMNS = (\n'
                      '    "a",      # what a is,\n'
                      '              # continued\n'
                      '    # what b is\n'
                      '    "b",\n'
                      '    "c",\n'
                      '    "d",      # d\'s own\n'
                      ')\n')
    comments = generator.comments_of(source)
    assert [generator.explanation(comments, line, 4) for line in (2, 5, 6, 7)] == [
        "what a is, continued", "what b is", "", "d's own"]


def test_a_cell_stays_one_cell(generator):
    assert generator.cell("a | b\n  c") == "a \\| b c"
    assert generator.cell('"*" and <path>, `["*"]`') == '"\\*" and &lt;path>, `["*"]`'
