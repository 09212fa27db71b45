"""Beyond one machine: a plan written for nodes this machine is not (no GPU needed), and README's two-node
torchrun recipe run for real — two agents in sessions of their own on 127.0.0.1, c10d rendezvous — with
the failures a cluster user meets: an agent that never starts, an agent killed mid-cell, a failing cell."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from bench.lifetime import alive
from bench.run.collector import merge_node_envs
from bench.schema import RESULT_COLUMNS
from bench.worker.plan_mode import finished_cells

REPO = Path(__file__).resolve().parent.parent
# cpu-smoke, cut down: three engines at world size 2, one profiled, a few steps each
TINY = ["matrix.engine=torch,naive,bucketed", "matrix.world_size=2", "matrix.grad_accum=1",
        "matrix.scaling=strong", "run.warmup_steps=2", "run.timed_steps=2", "run.compute_only_steps=2",
        "run.phase_steps=1", "run.probe_iters=2", "run.interleave=false", "profile.cells=torch-*",
        "run.launches=1"]
# plan runs have no watchdog: a collective with a dead or stuck peer ends after the process-group timeout
QUICK_PG = ["run.cell_timeout_s=2", "run.startup_timeout_s=1", "run.pg_timeout_s=4"]
ENV = os.environ | {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=REPO)


def plan(out: Path, *overrides: str, extra: tuple[str, ...] = ()) -> None:
    """README's first step, in this process (the command's own start-up is seconds on a busy machine)."""
    sets = [a for o in (*TINY, *overrides) for a in ("--set", o)]
    assert bench_main(["run", "--config", "cpu-smoke", *sets, "--plan-only", "--nnodes", "2", "--out",
                       str(out), *extra]) == 0


def start_agent(out: Path, node_rank: int, port: int, join_timeout_s: int = 30) -> subprocess.Popen:
    """One "node": README's torchrun command, in a session of its own (as on a machine of its own)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
           "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--rdzv-conf", f"join_timeout={join_timeout_s}", "-m", "bench.worker", "--plan",
           str(out / "plan.json")]
    log = open(out / f"agent{node_rank}.log", "a")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV, cwd=REPO,
                            start_new_session=True)


def wait_listening(port: int, timeout_s: float = 30) -> None:
    """Until something accepts connections on 127.0.0.1:`port` (an agent's rendezvous store)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def run_agents(out: Path, timeout: float = 120) -> list[int]:
    port = free_port()
    agents = [start_agent(out, r, port) for r in (0, 1)]
    try:
        return [a.wait(timeout=timeout) for a in agents]
    finally:
        stop(agents)


def stop(agents: list[subprocess.Popen]) -> None:
    """Kill what is left of the agents' sessions (their workers die with them: PR_SET_PDEATHSIG)."""
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def events(out: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((out / "events").glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def rows(out: Path) -> list[dict]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def collect(out: Path) -> str:
    proc = bench("run", "--collect", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# ---- a plan for nodes this machine is not -----------------------------------------------------------------

def test_plan_only_for_gpu_nodes_from_a_machine_without_gpu(tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["run", "--config", "gpu-node", "--set", "matrix.world_size=8,16", "--set", "matrix.engine=torch",
            "--plan-only", "--nnodes", "2"]
    assert bench_main([*argv, "--gpus-per-node", "8", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["config"]["run"]["device"] == "cuda" and plan["launcher_pid"] is None
    assert sorted({c["world_size"] for c in plan["cells"]}) == [8, 16]
    capsys.readouterr()
    # 2 nodes × 8 GPUs cannot hold world size 32; without --gpus-per-node this GPU-less machine cannot tell
    for extra, message in ((["--set", "matrix.world_size=8,32", "--gpus-per-node", "8"],
                            "matrix.world_size=32: above the 16 GPUs of 2 nodes × 8"),
                           ([], "run.device='cuda': this machine has no CUDA device"),
                           (["--gpus-per-node", "0"], "--gpus-per-node=0: must be at least 1")):
        bad = tmp_path / "bad"
        assert bench_main([*argv, *extra, "--out", str(bad)]) == 2
        assert message in capsys.readouterr().err
        assert not bad.exists()


def test_collect_merges_the_nodes_env_files(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"hostname": "login", "gpu_count": 0, "command": "plan",
                                                   "threads_per_rank": {"16": 1}}))
    for host, rank in (("gpu-a", 1), ("gpu-b", 0)):  # node 0 is not the first name
        (tmp_path / f"env-{host}.json").write_text(json.dumps({"hostname": host, "gpu_count": 8,
                                                               "node_rank": rank, "command": "worker"}))
    assert merge_node_envs(tmp_path) == ["gpu-b", "gpu-a"]
    env = json.loads((tmp_path / "env.json").read_text())
    # the machine is node 0's, the command and threads the plan's, the login node kept aside
    assert (env["hostname"], env["gpu_count"], env["command"]) == ("gpu-b", 8, "plan")
    assert env["threads_per_rank"] == {"16": 1} and sorted(env["nodes"]) == ["gpu-a", "gpu-b"]
    assert env["planned_on"]["hostname"] == "login"
    assert merge_node_envs(tmp_path) == ["gpu-b", "gpu-a"]  # again: the same result, not nested deeper
    assert json.loads((tmp_path / "env.json").read_text()) == env


def test_finished_cells_reads_every_events_file_and_ignores_a_torn_line(tmp_path):
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a-1.jsonl").write_text(
        '{"event": "finish", "cell_id": "x"}\n{"event": "traced", "cell_id": "x", "trace_dir": "t"}\n')
    (tmp_path / "events" / "b-2.jsonl").write_text('{"event": "error", "cell_ids": ["y"]}\n{"event": "fin')
    assert finished_cells(tmp_path) == ({"x"}, {"x"})


# ---- two agents on 127.0.0.1 ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_nodes_with_torchrun_every_cell_ok_and_a_rerun_skips_them(tmp_path):
    out = tmp_path / "run"
    plan(out)
    assert run_agents(out) == [0, 0], (out / "agent0.log").read_text()[-3000:]
    assert "collected 3 cells" in collect(out)
    got = rows(out)
    assert list(got[0]) == list(RESULT_COLUMNS)
    assert [(r["engine"], r["world_size"], r["status"]) for r in got] == [
        ("torch", "2", "ok"), ("naive", "2", "ok"), ("bucketed", "2", "ok")]
    # ranks 0 and 1 came from different agents (the worker's parent is its node's torchrun agent)
    hello = {e["rank"]: e for e in events(out) if e["event"] == "hello"}
    assert sorted(hello) == [0, 1] and hello[0]["ppid"] != hello[1]["ppid"]
    traced = [r for r in got if r["trace_dir"]]
    assert [r["engine"] for r in traced] == ["torch"]
    trace_files = (out / traced[0]["trace_dir"]).iterdir()
    assert sorted(p.name.split(".")[0] for p in trace_files) == ["rank0", "rank1"]
    env = json.loads((out / "env.json").read_text())
    assert env["nodes"] and env["device"] == "cpu" and env["planned_on"]["command"].startswith(sys.executable)
    # the same plan again: every cell has its finish event and the profiled cell its traced event, so
    # nothing is measured or profiled twice (counted over every events file: their order is by pid)
    def measured() -> dict:
        kinds = ("start", "finish", "profile", "traced")
        return {k: sum(e["event"] == k for e in events(out)) for k in kinds}

    before = measured()
    assert run_agents(out) == [0, 0]
    assert measured() == before


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_cell_failing_on_one_rank_is_recorded_with_its_cause_and_the_next_cell_runs(tmp_path):
    out = tmp_path / "run"
    plan(out, *QUICK_PG, "debug.fault=crash@bna")  # rank 1 raises in naive; rank 0 waits in a collective
    assert run_agents(out) == [0, 0]
    collect(out)
    assert [(r["engine"], r["status"]) for r in rows(out)] == [("torch", "ok"), ("naive", "failed"),
                                                               ("bucketed", "ok")]
    assert "injected crash" in rows(out)[1]["error"]  # the rank that failed says why
    # the failure was rank 1's alone (guard.Peers): its event says so; rank 0, whose collective it broke,
    # blames nothing of its own
    errors = [e for e in events(out) if e["event"] == "error"]
    assert [(e["rank"], e.get("alone")) for e in errors] == [(1, True)]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_one_agent_never_starts_the_other_times_out(tmp_path):
    out = tmp_path / "run"
    plan(out)
    t0 = time.monotonic()
    agent = start_agent(out, 0, free_port(), join_timeout_s=3)
    try:
        rc = agent.wait(timeout=40)
    finally:
        stop([agent])
    assert rc != 0 and time.monotonic() - t0 < 40
    assert "RendezvousTimeoutError" in (out / "agent0.log").read_text()
    said = collect(out)
    assert "collected 0 cells" in said and "3 not run yet" in said


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_worker_whose_peer_never_comes_records_every_cell(tmp_path):
    """srun's way (env:// rendezvous, one task per rank): rank 0 alone, the process group never forms."""
    out = tmp_path / "run"
    plan(out, *QUICK_PG)
    env = ENV | {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-m", "bench.worker", "--plan", str(out / "plan.json")],
                          capture_output=True, text=True, timeout=40, env=env, cwd=REPO)
    assert proc.returncode != 0
    collect(out)
    got = rows(out)
    assert [r["status"] for r in got] == ["failed"] * 3
    assert "the process group of WORLD_SIZE=2 did not form within 4 s" in got[0]["error"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_agent_killed_mid_cell_survivor_exits_collect_and_resume(tmp_path):
    out = tmp_path / "run"
    plan(out, *QUICK_PG, "debug.fault=hang@bna")  # rank 1 hangs in naive: the moment to kill its node
    port = free_port()
    # The agent that binds the rendezvous port first holds the c10d store: killing that one kills the store,
    # and the survivor's own agent then ends it (RendezvousConnectionError) before it can record anything,
    # as a real cluster would if its first node died. Agent 0 starts alone until it listens, so it holds the
    # store and rank 0 (torch's dynamic_rendezvous ranks the agents sorted by (addr, pid): the lower pid);
    # the victim is rank 1's machine.
    agents = [start_agent(out, 0, port)]
    wait_listening(port)
    agents.append(start_agent(out, 1, port))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                e["event"] == "start" and "naive" in e["cell_ids"][0] for e in events(out)):
            time.sleep(0.2)
        hello = {e["rank"]: e for e in events(out) if e["event"] == "hello"}
        victim = next(a for a in agents if a.pid == hello[1]["ppid"])
        assert victim is agents[1], "rank 1 landed on the agent that holds the store"
        os.killpg(victim.pid, signal.SIGKILL)  # the whole "machine" of rank 1
        survivor = next(a for a in agents if a is not victim)
        assert survivor.wait(timeout=60) != 0
    finally:
        stop(agents)
    pids = {e["pid"] for e in events(out) if e["event"] == "hello"} | {a.pid for a in agents}
    assert not any(alive(p) for p in pids)
    collect(out)
    assert [(r["engine"], r["status"]) for r in rows(out)] == [("torch", "ok"), ("naive", "failed")]
    # --resume re-plans what is left; the same plan without the fault then finishes it
    resumed = bench("run", "--config", "cpu-smoke", *[a for o in (*TINY, *QUICK_PG) for a in ("--set", o)],
                    "--plan-only", "--nnodes", "2", "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [c["engine"] for c in json.loads((out / "plan.json").read_text())["cells"]] == ["bucketed"]
    assert run_agents(out) == [0, 0]
    collect(out)
    assert [(r["engine"], r["status"]) for r in rows(out)] == [("torch", "ok"), ("naive", "failed"),
                                                               ("bucketed", "ok")]


def test_a_peers_failure_reaches_a_watching_rank_within_a_second():
    """Plan mode under NCCL (bench/worker/plan_mode.py FailureKey, bench/worker/watch.py): the rank that
    fails a group sets the group's failure key at once; a rank watching that key calls its abort (the
    communicator's, on CUDA), so a collective it waits in with the failed rank ends now rather than at the
    process-group timeout. Its own failure does not abort it; a key of another group is not its concern."""
    import time as time_mod

    import torch.distributed as dist

    from bench.worker.plan_mode import FailureKey
    from bench.worker.watch import FailureWatch

    store = dist.HashStore()
    calls: list[float] = []
    heard = FailureKey(store, "ws2-group0", 0)
    with FailureWatch(heard, lambda: calls.append(time_mod.monotonic())) as watch0:
        FailureKey(store, "ws2-group1", 1).post()  # another group's failure
        time_mod.sleep(0.7)
        assert not calls
        t0 = time_mod.monotonic()
        FailureKey(store, "ws2-group0", 1).post()  # rank 1 fails this group
        while not calls and time_mod.monotonic() - t0 < 5:
            time_mod.sleep(0.05)
    assert len(calls) == 1 and calls[0] - t0 < 1.0 and watch0.fired
    mine: list[float] = []
    own = FailureKey(store, "ws2-group2", 0)
    with FailureWatch(own, lambda: mine.append(1.0)):
        own.post()
        time_mod.sleep(0.7)
    assert not mine and store.get("bench/ws2-group2/failed") == b"0"
