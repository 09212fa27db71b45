"""On a real SLURM (tests/slurm_cluster.py: one host, started for this module): README's sbatch script,
plain srun with one task per rank, `bench slurm --submit`, and scancel mid-run then --resume. Skipped with
the reason where slurm-wlm/munge are missing or the tests do not run as root. `bench slurm`'s bad input
needs no cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import slurm  # noqa: F401 (the fixture)
from test_multinode import ENV, REPO, TINY, collect, events, free_port, plan, rows

from bench.__main__ import main as bench_main
from bench.lifetime import alive
from bench.run.slurm import EXIT_CANCELLED, Job, launch_steps, sbatch_script

EXPECTED = [("torch", "2", "ok"), ("naive", "2", "ok"), ("bucketed", "2", "ok")]
SETS = [a for o in TINY for a in ("--set", o)]


def run(cmd: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def summary(out: Path) -> list[tuple[str, str, str]]:
    return [(r["engine"], r["world_size"], r["status"]) for r in rows(out)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_readme_sbatch_script_through_sbatch_wait(slurm, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    plan(out)  # --plan-only --nnodes 2 is README's; one node here holds both ranks
    script = tmp_path / "job.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=1 --ntasks-per-node=1 --cpus-per-task=2 --time=00:05:00 --output={tmp_path}/slurm-%j.out
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
srun {sys.executable} -m torch.distributed.run --nnodes "$SLURM_NNODES" --nproc-per-node 2 \\
     --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$HEAD:{free_port()}" \\
     -m bench.worker --plan {out}/plan.json
{sys.executable} -m bench run --collect {out}
""")
    job = run(["sbatch", "--wait", str(script)], slurm | ENV)
    logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert job.returncode == 0, job.stderr + logs[-3000:]
    assert "collected 3 cells" in logs
    assert summary(out) == EXPECTED


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_plain_srun_one_task_per_rank_gives_the_same_rows(slurm, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    plan(out)
    env = slurm | ENV | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    step = run(["srun", "--ntasks", "2", sys.executable, "-m", "bench.worker", "--plan",
                str(out / "plan.json")], env)
    assert step.returncode == 0, step.stderr[-3000:]
    collect(out)
    assert summary(out) == EXPECTED
    hello = {e["rank"]: e for e in events(out) if e["event"] == "hello"}
    assert sorted(hello) == [0, 1]  # ranks from SLURM_PROCID/SLURM_NTASKS, one srun task each


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_slurm_submit_follows_the_job_and_collects(slurm, tmp_path):  # noqa: F811
    # a folder name sbatch's directives and the shell must both take literally: a space, a command
    # substitution, a quote and a '#' (bench.run.slurm.directive; shlex.quote in the script's commands)
    out = tmp_path / 'run $(id) "q" #1'
    done = run([sys.executable, "-m", "bench", "slurm", "--config", "cpu-smoke", *SETS, "--nodes", "1",
                "--ranks-per-node", "2", "--time", "00:05:00", "--partition", "debug", "--out", str(out),
                "--submit"], slurm | ENV)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert (out / "job.sbatch").is_file() and "step 2 1 2" in (out / "job.sbatch").read_text()
    assert "COMPLETED: 3 cells recorded of 3 planned: 3 ok" in done.stdout
    assert done.stderr.count("ok       ") == 3  # bench run's line per finished cell
    assert summary(out) == EXPECTED


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_scancel_mid_run_leaves_no_process_and_resume_finishes(slurm, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bench", "slurm", "--config", "cpu-smoke", *SETS, "--nodes", "1",
           "--ranks-per-node", "2", "--out", str(out), "--submit"]
    follower = subprocess.Popen([*cmd, "--set", "debug.fault=hang@bna"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=slurm | ENV, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                e["event"] == "start" and "naive" in e["cell_ids"][0] for e in events(out)):
            time.sleep(0.2)
        job = (out / "logs" / "slurm-job-id").read_text().strip()
        pids = {e["pid"] for e in events(out) if e["event"] == "hello"}
        assert len(pids) == 2 and all(alive(p) for p in pids)
        run(["scancel", job], slurm)
        stdout, stderr = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == EXIT_CANCELLED, stdout + stderr
    assert f"job {job} CANCELLED" in stdout and "--resume" in stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
    assert summary(out) == EXPECTED[:1]  # the cell that finished before the cancel
    resumed = run([*cmd, "--resume"], slurm | ENV)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    replanned = json.loads((out / "plan.json").read_text())["cells"]
    assert [c["engine"] for c in replanned] == ["naive", "bucketed"]
    assert summary(out) == EXPECTED


# ---- bad input: no cluster needed ------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--nodes", "0"], "--nodes=0: must be at least 1"),
    (["--nodes", "1", "--ranks-per-node", "0"], "--ranks-per-node=0: must be at least 1"),
    (["--nodes", "1", "--time", "90"], "--time='90': must be HH:MM:SS"),
    (["--nodes", "1", "--partition", "gpu;rm"], "--partition='gpu;rm': must be one word"),
    (["--nodes", "2", "--ranks-per-node", "3", "--set", "matrix.world_size=4"],
     "matrix.world_size=4: not a multiple of 3 ranks per node"),
    (["--nodes", "2", "--ranks-per-node", "2", "--set", "matrix.world_size=8"],
     "matrix.world_size=8: above the 4 ranks of --nodes=2 × 2 per node"),
    (["--nodes", "1", "--gpus-per-node", "4"], "--gpus-per-node=4: run.device is 'cpu'"),
    (["--nodes", "1", "--set", "run.device=cuda"], "run.device='cuda': this machine has no CUDA device"),
    (["--nodes", "1", "--set", "matrix.engine=nope"], "matrix.engine"),
])
def test_bench_slurm_bad_input_exits_2_and_creates_nothing(tmp_path, capsys, monkeypatch, extra, message):
    if "run.device=cuda" in extra and __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.chdir(tmp_path)
    assert bench_main(["slurm", "--config", "cpu-smoke", *extra, "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_launch_steps_and_the_script_hand_worked(tmp_path):
    # 4 GPUs per node, 4 nodes: 1, 2 and 4 ranks fit one node; 8 = 2 nodes × 4; 16 = 4 nodes × 4
    assert launch_steps([16, 1, 8, 2, 4, 8], 4, 4) == [(1, 1, 1), (2, 1, 2), (4, 1, 4), (8, 2, 4), (16, 4, 4)]
    job = Job(nodes=4, time="02:00:00", partition="gpu", gpus_per_node=4)
    text = sbatch_script(tmp_path / "r", [(8, 2, 4), (16, 4, 4)], job, 4, 4, ["bench", "slurm"])
    assert "#SBATCH --nodes=4" in text and "#SBATCH --gpus-per-node=4" in text and "--account" not in text
    assert "#SBATCH --partition=gpu" in text and "--cpus-per-task" not in text
    assert text.count("\nstep ") == 2 and "\nstep 16 4 4\n" in text
    assert text.rstrip().endswith("exit $rc") and f"--collect {tmp_path / 'r'}" in text
