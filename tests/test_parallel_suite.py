"""`make test` runs the suite in two pytest-xdist workers (Makefile, tests/conftest.py): GPU tests of
different modules, which land on different workers, must still take turns, since each takes the node's
GPUs. Checked with two GPU-marked tests that only sleep, in two modules of a scratch suite that uses this
conftest: run in two workers, their lifetimes must not overlap; with the turn-taking fixture removed, they
do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SLEEPER = '''import json, os, time
import pytest

@pytest.mark.gpu
def test_holds_the_gpus():
    start = time.time()
    time.sleep(1.5)
    with open(os.environ["LIFETIMES"], "a") as f:
        f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER"), start, time.time()]) + "\\n")
'''


def _lifetimes(tmp_path: Path, conftest: str) -> list[list]:
    suite = tmp_path / "suite"
    suite.mkdir(parents=True)
    (suite / "conftest.py").write_text(conftest)
    shutil.copy(HERE / "advice_check.py", suite)
    for name in ("test_one.py", "test_two.py"):
        (suite / name).write_text(SLEEPER)
    lifetimes = tmp_path / "lifetimes.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadfile", "--basetemp", str(tmp_path / "base"), str(suite)],
                          cwd=suite, env={**os.environ, "LIFETIMES": str(lifetimes)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in lifetimes.read_text().splitlines()]


def _overlap(rows: list[list]) -> float:
    (_, a0, a1), (_, b0, b1) = sorted(rows, key=lambda r: r[1])
    return a1 - b0


@pytest.mark.integration   # two pytest runs of two workers each: ~10 s
def test_gpu_tests_of_two_workers_take_turns(tmp_path):
    conftest = (HERE / "conftest.py").read_text()
    rows = _lifetimes(tmp_path / "with", conftest)
    assert len(rows) == 2 and {r[0] for r in rows} == {"gw0", "gw1"}, rows  # one on each worker
    assert _overlap(rows) <= 0, rows
    # the mutation: the same suite without the turn-taking fixture runs both at once
    unlocked = conftest.replace("@pytest.fixture(autouse=True)\ndef one_gpu_test_at_a_time",
                                "@pytest.fixture\ndef one_gpu_test_at_a_time")
    assert unlocked != conftest
    rows = _lifetimes(tmp_path / "without", unlocked)
    assert {r[0] for r in rows} == {"gw0", "gw1"} and _overlap(rows) > 1.0, rows
