"""On a real SLURM (tests/slurm_cluster.py: one host, started for this module): README's sbatch script,
plain srun with one task per rank, `bench slurm --submit`, and scancel mid-run then --resume. Skipped with
the reason where slurm-wlm/munge are missing or the tests do not run as root. `bench slurm`'s bad input
needs no cluster."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import slurm  # noqa: F401 (the fixture)
from test_multinode import ENV, REPO, TINY, collect, events, free_port, plan, rows

from bench.__main__ import main as bench_main
from bench.lifetime import alive
from bench.matrix import Cell
from bench.run.schedule import job_schedule, launch_steps
from bench.run.slurm import EXIT_CANCELLED
from bench.run.slurm_job import Job
from bench.run.slurm_script import sbatch_script

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


PACKED = ["matrix.engine=torch,naive", "matrix.world_size=1", "matrix.precision=fp32,bf16", "run.pack=on"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_packed_world_size_runs_its_launches_at_once_each_on_its_own_cpus(slurm, tmp_path):  # noqa: F811
    """Issue 43's packing in `bench slurm`: world size 1 on a 2-CPU node with run.pack=on is two srun
    steps at once (--exact, a CPU each; the test cluster's task/none binds nothing, so each launch binds
    itself to its block: bench.worker bind_share), each running its share (--slot) of the plan's cells: two
    engine groups, fp32 and bf16. Both shares finish, every row says it ran beside one other launch with
    one thread, and the two launches' lifetimes overlap."""
    out = tmp_path / "run"
    sets = [a for o in [*TINY, *PACKED] for a in ("--set", o)]
    done = run([sys.executable, "-m", "bench", "slurm", "--config", "cpu-smoke", *sets, "--nodes", "1",
                "--ranks-per-node", "1", "--cpus-per-node", "2", "--time", "00:05:00", "--out", str(out),
                "--submit"], slurm | ENV, timeout=140)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "\nstep 1 1 1 0 2\n" in (out / "job.sbatch").read_text()
    assert "world size 1 (2 launches at once) on node 0" in done.stdout
    slots = json.loads((out / "plan.json").read_text())["slots"]["1"]
    assert sorted(len(share) for share in slots) == [2, 2]
    assert "COMPLETED: 4 cells recorded of 4 planned: 4 ok" in done.stdout
    got = rows(out)
    assert {r["packed_launches"] for r in got} == {"2"} and {r["threads_per_rank"] for r in got} == {"1"}
    by_file = [[json.loads(line)["t"] for line in path.read_text().splitlines()]  # a file per launch's rank
               for path in sorted((out / "events").glob("*.jsonl"))]
    assert len(by_file) == 2
    (a0, a1), (b0, b1) = [(min(t), max(t)) for t in by_file]
    assert max(a0, b0) < min(a1, b1), by_file  # at the same time


FAKE_PYTHON = """#!/bin/bash
# the nodes' interpreter, stood in for: a launch says its slot, its GPUs and when it ran; --collect is a no-op
case "$*" in
    *"bench run --collect"*) exit 0 ;;
    *torch.distributed.run*)
        args="$*"
        slot=${args##*--slot }
        echo "LAUNCH slot=${slot%% *} gpus=$CUDA_VISIBLE_DEVICES start=$(date +%s.%N)"
        sleep 2
        echo "LAUNCH slot=${slot%% *} end=$(date +%s.%N)" ;;
    *) exec python3 "$@" ;;
esac
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_packed_steps_get_their_own_gpus_from_slurm_at_the_same_time(slurm, tmp_path):  # noqa: F811
    """The packed steps of `bench slurm`'s own script, through a real slurmctld and slurmd whose node has
    two GPUs (tests/slurm_cluster.py: fake devices SLURM's GRES plugin schedules and binds as real ones):
    world size 1 of gpu-node-quick on a 2-GPU node is two launches at once; SLURM gives each step its own
    GPU (CUDA_VISIBLE_DEVICES 0 and 1: `srun --exact --gres=gpu:1 --mem=0`), and the two run at the same
    time. The nodes' python is a stand-in that says what it was given (the GPU cells cannot run here)."""
    from slurm_cluster import TEST_GPUS_ENV

    if slurm[TEST_GPUS_ENV] == "0":
        pytest.skip("the test cluster has no GPUs: mknod of its fake devices was refused (needs CAP_MKNOD)")
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    out = tmp_path / "run"
    prepared = run([sys.executable, "-m", "bench", "slurm", "--config", "gpu-node-quick", "--set",
                    "matrix.world_size=1", "--nodes", "1", "--gpus-per-node", "2", "--time", "00:05:00",
                    "--python", str(python), "--out", str(out)], slurm | ENV)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr[-3000:]
    assert "world size 1 (2 launches at once) on node 0" in prepared.stdout
    job = run(["sbatch", "--wait", str(out / "job.sbatch")], slurm | ENV, timeout=100)
    log = "".join(p.read_text() for p in (out / "logs").glob("slurm-*.out"))
    assert job.returncode == 0, job.stderr + log[-3000:]
    starts = dict(line.split()[1:4:2] for line in log.splitlines() if " start=" in line)
    gpus = {line.split()[1]: line.split()[2] for line in log.splitlines() if " gpus=" in line}
    ends = dict(line.split()[1:3] for line in log.splitlines() if " end=" in line)
    assert gpus == {"slot=0": gpus["slot=0"], "slot=1": gpus["slot=1"]}, log
    assert sorted(gpus.values()) == ["gpus=0", "gpus=1"], log  # one GPU each, not the same one
    begun = [float(v.split("=")[1]) for v in starts.values()]
    ended = [float(v.split("=")[1]) for v in ends.values()]
    assert len(begun) == len(ended) == 2 and max(begun) < min(ended), log  # at the same time


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
    schedule = job_schedule([(8, 2, 4), (16, 4, 4)], 4, {8: 1, 16: 1})
    text = sbatch_script(tmp_path / "r", schedule, job, 4, 4, ["bench", "slurm"])
    assert "#SBATCH --nodes=4" in text and "#SBATCH --gpus-per-node=4" in text and "--account" not in text
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --exclusive" in text  # the nodes' CPUs, all
    assert text.count("\nstep ") == 2 and "\nstep 16 4 4 0\n" in text and "LANES" not in text
    assert text.rstrip().endswith("exit $rc") and f"--collect {tmp_path / 'r'}" in text


def test_one_node_world_sizes_run_in_lanes_on_their_own_nodes_at_the_same_time():
    """4 nodes of 8: world sizes 1, 2, 4 and 8 each fit one node, so they run at the same time, one lane a
    node, the longest first onto the lane that ends soonest; 16 and 32 span nodes and run after, from node 0.
    By hand, seconds 1: 10, 2: 20, 4: 40, 8: 80, 16: 100, 32: 120 on 2 nodes: 8 alone (80), then 4 onto the
    emptier lane (40), 2 onto it too (60), 1 onto it (70): lanes [8] and [1, 2, 4]; the job 80 + 220 = 300 s,
    where one after another took 370. On 4 nodes a lane each: 80 + 220."""
    seconds = {1: 10, 2: 20, 4: 40, 8: 80, 16: 100, 32: 120}
    steps = launch_steps(list(seconds), 4, 8)
    two = job_schedule(steps, 2, seconds)
    assert two.lanes == (((8, 1, 8),), ((1, 1, 1), (2, 1, 2), (4, 1, 4)))
    assert two.spanning == ((16, 2, 8), (32, 4, 8))
    assert two.seconds(seconds) == 300 and two.nodes_used() == 4
    four = job_schedule(steps, 4, seconds)
    assert [len(lane) for lane in four.lanes] == [1, 1, 1, 1] and four.seconds(seconds) == 300
    assert job_schedule(steps[:4], 1, seconds).seconds(seconds) == 150
    assert job_schedule(steps[:4], 8, seconds).nodes_used() == 4
    assert four.words() == ("world size 8 on node 0 | world size 4 on node 1 | world size 2 on node 2 | "
                            "world size 1 on node 3 (at the same time); then world size 16 on 2 nodes × 8; "
                            "then world size 32 on 4 nodes × 8")


def slurm_fs_is_local(path: Path) -> bool:
    from bench.run.slurm_job import LOCAL_FILESYSTEMS, filesystem_of

    found = filesystem_of(path)
    return found is not None and found[0] in LOCAL_FILESYSTEMS


def fake_slurm_bin(tmp_path: Path) -> Path:
    """srun and scontrol that only say what they were asked: srun prints its CPUs, the rendezvous endpoint
    and NCCL_DEBUG_FILE; scontrol names this host."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nargs="$*"; cpus=${args#*--cpus-per-task }; '
                                  'ep=${args#*--rdzv-endpoint }; rel=${args#*--relative }; '
                                  '[[ "$args" == *--standalone* ]] && ep=standalone; '
                                  'gres=none; [[ "$args" == *--gres=* ]] && gres=${args#*--gres=}; '
                                  'slot=none; [[ "$args" == *--slot* ]] && slot=${args#*--slot }; '
                                  'echo "SRUN cpus=${cpus%% *} endpoint=${ep%% *} relative=${rel%% *} '
                                  'gres=${gres%% *} slot=${slot%% *} nccl=${NCCL_DEBUG_FILE:-none}"\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def run_script(script: Path, bin_dir: Path, **env: str) -> list[str]:
    """The script's steps through the fake srun (its --collect line left out: tested elsewhere)."""
    steps_only = script.with_name("steps.sh")
    steps_only.write_text("".join(line for line in script.read_text().splitlines(keepends=True)
                                  if "--collect" not in line))
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    proc = subprocess.run(["bash", str(steps_only)], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=base | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
                                      "SLURM_JOB_NODELIST": "localhost", "SLURM_CPUS_ON_NODE": "96"} | env)
    return [line for line in proc.stdout.splitlines() if line.startswith("SRUN")]


def test_the_script_gives_every_step_the_nodes_cpus_a_free_port_and_an_nccl_log(tmp_path, capsys):
    """Issue 32's SLURM findings, on the script itself (fake srun): a GPU job takes whole nodes and hands
    every step their CPUs (srun does not inherit sbatch's since SLURM 22.05: 8 ranks shared a core); each
    step over nodes has a rendezvous port free on the first node (29500 + job id % 1000 could be taken), a
    one-node step its own (torchrun --standalone); NCCL writes its INFO log per world size, for --collect's
    nccl_transport, unless the user set NCCL_DEBUG. One-node steps on two nodes run in two lanes."""
    out = tmp_path / "run"
    assert bench_main(["slurm", "--config", "gpu-check", "--nodes", "2", "--gpus-per-node", "1",
                       "--set", "matrix.world_size=1,2", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "time limit 00:15:00: the plan's estimate" in printed.out  # 2-3 min + 25 %, whole quarters
    if slurm_fs_is_local(out):  # pytest's tmp_path: this machine's own disk, which other nodes do not see
        assert "which other machines do not see" in printed.err
    script = (out / "job.sbatch").read_text()
    assert "#SBATCH --exclusive" in script and "#SBATCH --time=00:15:00" in script
    bin_dir = fake_slurm_bin(tmp_path)
    steps = run_script(out / "job.sbatch", bin_dir)
    assert len(steps) == 2 and all("cpus=96" in s for s in steps)  # $SLURM_CPUS_ON_NODE, to every step
    assert "endpoint=standalone relative=0" in steps[0] and "relative=0" in steps[1]
    port = int(steps[1].split("endpoint=localhost:")[1].split()[0])
    assert 1024 < port < 65536 and port != 29500 + 4242 % 1000
    assert [s.split("nccl=")[1] for s in steps] == [
        str(out.resolve() / "logs" / f"nccl-ws{ws}.%h.%p.log") for ws in (1, 2)]
    assert all(s.endswith("nccl=mine.log") for s in run_script(out / "job.sbatch", bin_dir,
                                                                NCCL_DEBUG_FILE="mine.log"))
    lanes = tmp_path / "lanes"
    assert bench_main(["slurm", "--config", "gpu-check", "--nodes", "2", "--gpus-per-node", "2",
                       "--set", "matrix.world_size=1,2", "--out", str(lanes)]) == 0
    # world size 2 fills a 2-GPU node; world size 1 packs there as two launches at once (a GPU each)
    assert sorted(s.split()[2:5] for s in run_script(lanes / "job.sbatch", bin_dir)) == [
        ["endpoint=standalone", "relative=0", "gres=none"],
        ["endpoint=standalone", "relative=1", "gres=gpu:1"],
        ["endpoint=standalone", "relative=1", "gres=gpu:1"]]
    cpu = tmp_path / "cpu"
    assert bench_main(["slurm", "--config", "cpu-smoke", *SETS, "--nodes", "1", "--ranks-per-node", "2",
                       "--cpus-per-node", "6", "--out", str(cpu)]) == 0
    text = (cpu / "job.sbatch").read_text()
    assert "#SBATCH --cpus-per-task=6" in text and "NCCL_DEBUG" not in text  # gloo: no NCCL log
    assert [s.split()[1] for s in run_script(cpu / "job.sbatch", bin_dir)] == ["cpus=6"]


def test_world_sizes_below_the_node_pack_into_steps_at_once_on_their_own_gpus(tmp_path, capsys):
    """Issue 43 in `bench slurm`: on one 8-GPU node gpu-node-quick's world sizes 1, 2 and 4 run in launches
    at once (its two engine groups a world size: two launches, the split `bench run` makes,
    estimate.slot_shares), each an srun step with its own GPUs (--gres=gpu:W: SLURM sets each step's
    CUDA_VISIBLE_DEVICES), half the node's CPUs and its share (--slot I); world size 8 fills the node and
    runs alone. The time limit costs a packed world size at its longest launch: below the unpacked one."""
    from bench.config import config_from_dict
    from bench.run.estimate import slot_shares

    out = tmp_path / "run"
    args = ["slurm", "--config", "gpu-node-quick", "--nodes", "1", "--gpus-per-node", "8"]
    assert bench_main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert ("world sizes 1 (2 launches at once), 2 (2 launches at once), 4 (2 launches at once), 8 on node 0"
            in printed)
    script = (out / "job.sbatch").read_text()
    assert [line for line in script.splitlines() if line.startswith("step ")] == [
        "step 1 1 1 0 2", "step 2 1 2 0 2", "step 4 1 4 0 2", "step 8 1 8 0"]
    steps = run_script(out / "job.sbatch", fake_slurm_bin(tmp_path))
    packed = sorted((s.split()[1:6] for s in steps if "slot=none" not in s), key=lambda x: (x[3], x[4]))
    assert packed == [["cpus=48", "endpoint=standalone", "relative=0", f"gres=gpu:{ws}", f"slot={i}"]
                      for ws in (1, 2, 4) for i in (0, 1)]
    assert [s.split()[1:6] for s in steps if "slot=none" in s] == [
        ["cpus=96", "endpoint=standalone", "relative=0", "gres=none", "slot=none"]]
    plan_json = json.loads((out / "plan.json").read_text())
    config = config_from_dict(plan_json["config"])
    cells = [Cell.from_dict(c) for c in plan_json["cells"]]
    for ws in (1, 2, 4):
        mine = [c for c in cells if c.world_size == ws]
        assert plan_json["slots"][str(ws)] == [[c.cell_id for c in share]
                                               for share in slot_shares(config, mine, 8 // ws)]
        assert sorted(i for share in plan_json["slots"][str(ws)] for i in share) == sorted(
            c.cell_id for c in mine)  # every cell in one share, once
    assert "8" not in plan_json["slots"]
    alone = tmp_path / "alone"
    assert bench_main([*args, "--set", "run.pack=off", "--out", str(alone)]) == 0
    assert "slots" not in json.loads((alone / "plan.json").read_text())
    unpacked = capsys.readouterr().out
    assert "launches at once" not in unpacked and "step 1 1 1 0\n" in (alone / "job.sbatch").read_text()

    def most_minutes(text: str) -> float:
        return float(text.split("the plan's estimate, ")[1].split(" min")[0].split("-")[1])

    assert most_minutes(printed) < most_minutes(unpacked)


def test_a_resubmitted_plan_packs_only_what_is_left(tmp_path, capsys):
    """--resume after world size 1's first share finished: its other share is all that is left of it, so
    it runs as one launch (no step for a finished share), while world size 2 still packs two."""
    from bench.config import config_from_dict
    from bench.run import results

    out = tmp_path / "run"
    args = ["slurm", "--config", "gpu-node-quick", "--nodes", "1", "--gpus-per-node", "8", "--out", str(out)]
    assert bench_main(args) == 0
    plan_json = json.loads((out / "plan.json").read_text())
    config = config_from_dict(plan_json["config"])
    first, second = plan_json["slots"]["1"]
    for cell in (Cell.from_dict(c) for c in plan_json["cells"] if c["cell_id"] in first):
        results.append_record(out, results.make_record(cell, config, "ok", None))
    capsys.readouterr()
    assert bench_main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "world sizes 1, 2 (2 launches at once), 4 (2 launches at once), 8 on node 0" in printed
    resumed = json.loads((out / "plan.json").read_text())
    assert "1" not in resumed["slots"] and len(resumed["slots"]["2"]) == 2
    assert sorted(c["cell_id"] for c in resumed["cells"] if c["world_size"] == 1) == sorted(second)
    steps = [line for line in (out / "job.sbatch").read_text().splitlines() if line.startswith("step ")]
    assert steps[:2] == ["step 1 1 1 0", "step 2 1 2 0 2"]


def test_a_worker_slot_outside_the_plans_shares_exits_2(tmp_path):
    """--slot names one of the plan's launches at once for its world size; another is refused, exit 2,
    before any process group forms."""
    out = tmp_path / "run"
    assert bench_main(["slurm", "--config", "gpu-node-quick", "--nodes", "1", "--gpus-per-node", "8",
                       "--out", str(out)]) == 0
    proc = subprocess.run([sys.executable, "-m", "bench.worker", "--plan", str(out / "plan.json"), "--slot",
                           "2"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=ENV | {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--slot 2: the plan has 2 launches at once for world size 1" in proc.stderr


def test_nodes_the_plan_cannot_use_are_refused_unless_chosen(tmp_path, capsys):
    """--nodes 8 with gpu-node-quick's world sizes (≤ 8, one node of 8 GPUs: four lanes) would book 8 nodes
    and use 4: refused, exit 2, nothing written; with world sizes the user set, a warning. (--nodes 4 runs
    the four in lanes on their own nodes at the same time: every node used.)"""
    args = ["slurm", "--config", "gpu-node-quick", "--nodes", "8", "--gpus-per-node", "8"]
    assert bench_main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--nodes=8: the world sizes 1,2,4,8 use at most 4 node(s) of 8 ranks" in err
    assert "--set matrix.world_size=1,2,4,8,64" in err and not (tmp_path / "a").exists()
    assert bench_main([*args, "--set", "matrix.world_size=8", "--out", str(tmp_path / "b")]) == 0
    assert "warning: --nodes=8: the world sizes 8 use at most 1 node(s)" in capsys.readouterr().err
    assert bench_main([*args[:4], "4", *args[5:], "--out", str(tmp_path / "c")]) == 0
    assert "(at the same time)" in capsys.readouterr().out


def test_time_limit_and_local_filesystems_by_hand():
    from bench.run.slurm_job import filesystem_of, shared_fs_warning, time_limit

    # the estimate + 25 %, rounded up to 15 min: 600 s → 750 → 00:15:00; 10 h → 12.5 h; 100,000 s → 125,000
    # → 139 quarters = 125,100 s = 1 day 10:45:00
    limits = (time_limit(600), time_limit(36_000), time_limit(100_000))
    assert limits == ("00:15:00", "12:30:00", "1-10:45:00")
    mounts = "/dev/sda1 / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\nnfs:/home /home nfs4 rw 0 0\n"
    assert filesystem_of(Path("/tmp/run"), mounts) == ("tmpfs", "/tmp")
    assert filesystem_of(Path("/home/me/run"), mounts) == ("nfs4", "/home")
    assert filesystem_of(Path("/opt/run"), mounts) == ("ext4", "/")
    assert shared_fs_warning(Path("/proc")) is None  # proc: not a filesystem a run folder could hold


def test_collect_reads_the_nccl_logs_of_a_plan_run(tmp_path):
    """`bench slurm`'s script has NCCL log per world size into logs/nccl-ws<W>.%h.%p.log: --collect
    classes its connections into each cell's nccl_transport and env.json's nccl_transport["ws<W>"]."""
    from bench.run.collector import collect

    out = tmp_path / "run"
    assert bench_main(["run", "--config", "cpu-smoke", *SETS, "--plan-only", "--out", str(out)]) == 0
    cells = json.loads((out / "plan.json").read_text())["cells"]
    lines = [json.dumps({"event": "finish", "cell_id": c["cell_id"], "status": "ok", "error": None,
                         "row": {"step_time_ms_p50": 1.0}, "t": 1.0}) for c in cells]
    (out / "events").mkdir(exist_ok=True)
    (out / "events" / "host-1.jsonl").write_text("\n".join(lines) + "\n")
    (out / "logs").mkdir(exist_ok=True)
    info = "node1:77:77 [1] NCCL INFO "
    (out / "logs" / "nccl-ws2.node1.77.log").write_text(
        info + "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n" + info + "Channel 01/0 : 1[1] -> 0[0] via "
        "P2P/CUMEM/read\n")
    collect(out)
    assert {(r["world_size"], r["nccl_transport"]) for r in rows(out)} == {("2", "P2P/CUMEM")}
    entry = json.loads((out / "env.json").read_text())["nccl_transport"]["ws2"]
    assert entry["transport"] == "P2P/CUMEM" and entry["connections"] == {"P2P/CUMEM": 2}
    assert entry["log_files"] == ["logs/nccl-ws2.node1.77.log"] and entry["set_by"] == "bench"


def test_the_script_runs_the_nodes_interpreter_and_clone_and_warns_about_this_machines(tmp_path, capsys,
                                                                                       monkeypatch):
    """Issue 46: the script ran the planning machine's interpreter (a CPU torch) and clone, silently. With
    --python and --chdir it runs the nodes' own; without them it warns when that torch has no CUDA for a
    GPU job and when the interpreter or the clone sits on a filesystem only this machine has."""
    import torch

    monkeypatch.chdir(tmp_path)
    args = ["slurm", "--config", "gpu-check", "--nodes", "1", "--gpus-per-node", "2",
            "--set", "matrix.world_size=1,2"]
    assert bench_main([*args, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    if not torch.version.cuda:
        assert f"the script runs {sys.executable} (this machine's Python), whose torch {torch.__version__} " \
               "has no CUDA, on 2-GPU nodes" in err and "--python PATH" in err
    if slurm_fs_is_local(tmp_path):
        assert f"the script runs the clone {tmp_path}, on a " in err and "with --chdir" in err
    script = (tmp_path / "a" / "job.sbatch").read_text()
    assert f"#SBATCH --chdir={tmp_path}" in script and f"{sys.executable} -m torch.distributed.run" in script

    assert bench_main([*args, "--python", "/shared/venv/bin/python", "--chdir", "/shared/ddpbench",
                       "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "has no CUDA" not in err and "the script runs the" not in err  # not on this machine: not checked
    script = (tmp_path / "b" / "job.sbatch").read_text()
    assert "#SBATCH --chdir=/shared/ddpbench" in script and sys.executable not in script
    assert "/shared/venv/bin/python -m torch.distributed.run" in script
    assert "/shared/venv/bin/python -m bench run --collect" in script


def test_a_plan_run_counts_one_launch_a_cell(tmp_path, capsys):
    """A plan run (bench slurm's steps, your own torchrun) times each cell in one launch: gpu-node asks
    `bench run` for 2 (run.launches), and its job booked the time of two (13 h of 19:30:00 used). The job's
    time limit counts one, and says so."""
    from bench.run.estimate import estimate_range
    from bench.run.planner import plan as make_plan
    from bench.run.slurm_job import time_limit

    planned = make_plan("gpu-node", plan_only=True, nnodes=1, gpus_per_node=8)
    assert planned.config.run.launches == 2
    once = dataclasses.replace(planned.config, run=dataclasses.replace(planned.config.run, launches=1))
    one, two = (estimate_range(c, [x for x in planned.runnable if x.world_size == 8])[1]
                for c in (once, planned.config))
    assert one < 0.8 * two
    out = tmp_path / "run"
    assert bench_main(["slurm", "--config", "gpu-node", "--nodes", "1", "--gpus-per-node", "8",
                       "--out", str(out)]) == 0
    assert "with one launch a cell (run.launches is bench run's)" in capsys.readouterr().out
    # world sizes 1, 2 and 4 pack (8 ÷ W launches at once): each costs its longest launch
    from bench.run.estimate import slot_shares

    total = sum(max(estimate_range(once, share)[1] for share in slot_shares(
        once, [x for x in planned.runnable if x.world_size == ws], 8 // ws)) for ws in (1, 2, 4, 8))
    assert f"#SBATCH --time={time_limit(total)}" in (out / "job.sbatch").read_text()
    alone = tmp_path / "alone"
    assert bench_main(["slurm", "--config", "gpu-node", "--nodes", "1", "--gpus-per-node", "8",
                       "--set", "run.pack=off", "--out", str(alone)]) == 0
    total = sum(estimate_range(once, [x for x in planned.runnable if x.world_size == ws])[1]
                for ws in (1, 2, 4, 8))
    assert f"#SBATCH --time={time_limit(total)}" in (alone / "job.sbatch").read_text()
