"""Two `bench run` processes on one results folder: the second is refused before it launches anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.config import ConfigError
from bench.run.folder import lock_run_dir

REPO = Path(__file__).resolve().parent.parent


def test_second_lock_on_a_run_folder_is_refused(tmp_path):
    held = lock_run_dir(tmp_path)
    try:
        with pytest.raises(ConfigError, match=r"in use by another bench run \(pid \d+\)"):
            lock_run_dir(tmp_path)
    finally:
        held.close()
    lock_run_dir(tmp_path).close()  # released with its holder


def test_resume_while_the_folder_is_in_use_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    plan = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "cpu-smoke", "--out", str(out),
                           "--plan-only"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    before = sorted(p.name for p in out.iterdir())
    held = lock_run_dir(out)  # stands in for a run still going
    try:
        resume = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "cpu-smoke", "--out",
                                 str(out), "--resume"], cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        held.close()
    assert resume.returncode == 2
    assert "in use by another bench run" in resume.stderr and str(out) in resume.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_of_two_runs_making_one_out_the_loser_leaves_the_winners_folder(tmp_path, monkeypatch):
    # Issue 45: both saw --out missing; the second's mkdir failed and it deleted the folder the first had
    # just made (nothing but config.toml in it yet). Here the other run makes it between the look and mkdir.
    from bench.config import load_config
    from bench.run import folder

    out, real_mkdir = tmp_path / "run", Path.mkdir

    def other_run_first(self, *args, **kwargs):
        if self == out and not out.exists():
            real_mkdir(out)
            (out / "config.toml").write_text("# the other run's\n")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", other_run_first)
    with pytest.raises(ConfigError, match="already exists"):
        folder.prepare(out, load_config("cpu-smoke"), resume=False)
    assert (out / "config.toml").read_text() == "# the other run's\n"
