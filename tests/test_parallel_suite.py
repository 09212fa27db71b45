"""`make test` runs the suite in two pytest-xdist workers (Makefile, tests/conftest.py): GPU tests of
different modules, which land on different workers, must still take turns, since each takes the node's
GPUs. Checked with two GPU-marked tests in two modules of a scratch suite that uses this conftest: each
says it started and waits up to WAIT_S for the other to start. Taking turns, the first waits in vain and
the second starts after it ended: their lifetimes do not overlap. With the turn-taking fixture removed,
they meet and overlap however late one worker starts (a wait, not a sleep: a loaded machine cannot make
the mutation pass by starting one worker late)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WAIT_S = 5.0
MEETER = '''import json, os, time
from pathlib import Path
import pytest

@pytest.mark.gpu
def test_holds_the_gpus():
    me, here = os.environ["PYTEST_XDIST_WORKER"], Path(os.environ["LIFETIMES"]).parent
    start = time.time()
    (here / f"started-{me}").touch()
    while time.time() - start < WAIT_S and len(list(here.glob("started-*"))) < 2:
        time.sleep(0.05)
    with open(os.environ["LIFETIMES"], "a") as f:
        f.write(json.dumps([me, start, time.time()]) + "\\n")
'''.replace("WAIT_S", repr(WAIT_S))


def _lifetimes(tmp_path: Path, conftest: str) -> list[list]:
    suite = tmp_path / "suite"
    suite.mkdir(parents=True)
    (suite / "conftest.py").write_text(conftest)
    shutil.copy(HERE / "advice_check.py", suite)
    for name in ("test_one.py", "test_two.py"):
        (suite / name).write_text(MEETER)
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
    assert {r[0] for r in rows} == {"gw0", "gw1"} and _overlap(rows) > 0, rows
