"""End to end through real processes (torchrun, gloo on CPU): sweep, faults, kill + resume, plan + collect."""

from __future__ import annotations

import csv
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.schema import RESULT_COLUMNS, STATUSES

pytestmark = pytest.mark.slow  # real sweeps through torchrun: seconds to a minute each

REPO = Path(__file__).resolve().parent.parent
ENV_KEYS = ("torch", "cuda", "cudnn", "nccl", "gpus", "gpu_count", "driver", "topology", "cpu_model",
            "cpu_cores", "env_vars", "git_sha", "hostname", "command", "time", "python", "device",
            "backend", "torch_source", "user_model")
# Tiny and short: 2 timed steps, the smallest profiler schedule.
FAST = ["matrix.scaling=strong", "workload.model=mlp", "workload.model_size=tiny", "workload.global_batch=4",
        "run.warmup_steps=2", "run.timed_steps=2", "run.compute_only_steps=2", "run.phase_steps=1",
        "run.probe_iters=2", "profile.skip_first=0", "profile.warmup=0", "profile.active=1",
        "run.cell_timeout_s=60", "run.launches=1"]
ENGINES = "torch,naive,bucketed,overlap"


def bench_cmd(out: Path, *overrides: str, extra: tuple[str, ...] = ()) -> list[str]:
    sets = [a for o in (*FAST, *overrides) for a in ("--set", o)]
    return [sys.executable, "-m", "bench", "run", "--config", "cpu-smoke", *sets, "--out", str(out), *extra]


def run_bench(out: Path, *overrides: str, extra: tuple[str, ...] = (), timeout: float = 150):
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(bench_cmd(out, *overrides, extra=extra), capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def read_csv(out: Path) -> tuple[list[str], list[dict]]:
    with open(out / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def launched_pids(out: Path) -> set[int]:
    """Every process a launch reported: torchrun (logs/launch-k.pid) and its workers (hello events)."""
    pids = {int(p.read_text()) for p in (out / "logs").glob("launch-*.pid")}
    for events in (out / "logs").glob("launch-*.events.jsonl"):
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "hello":
                pids |= {event["pid"], event["pgid"]}
    return pids


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def assert_no_orphans(out: Path) -> None:
    pids = launched_pids(out)
    assert pids
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)]


@pytest.mark.timeout(150)
def test_sweep_world_sizes_1_and_2(tmp_path):
    out = tmp_path / "run"
    proc = run_bench(out, f"matrix.engine={ENGINES}", "matrix.world_size=1,2", "matrix.grad_accum=1,2",
                     "matrix.comm_dtype=none,fp16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    columns, rows = read_csv(out)
    assert tuple(columns) == RESULT_COLUMNS
    n_engines = len(ENGINES.split(","))
    assert len(rows) == n_engines * 2 * 2 * 2  # engines × ws × accum × comm_dtype (ws1 fp16 skipped)
    by_status: dict[str, list[dict]] = {}
    for row in rows:
        assert row["status"] in STATUSES
        by_status.setdefault(row["status"], []).append(row)
    assert len(by_status["skipped"]) == n_engines * 2 and not set(by_status) - {"ok", "skipped"}
    for row in by_status["skipped"]:
        assert row["world_size"] == "1" and row["comm_dtype"] == "fp16" and row["error"]
        assert row["step_time_ms_p50"] == "" and row["trace_dir"] == ""
    for row in by_status["ok"]:
        assert row["n_timed_steps"] == "2" and row["error"] == ""
        for col in ("step_time_ms_p50", "step_time_ms_p90", "samples_per_s", "compute_only_ms_p50",
                    "exposed_comm_ms", "peak_mem_mb", "allreduce_busbw_gbps", "final_loss"):
            float(row[col])  # a number, not empty
        # the probe times nothing at world size 1: no link to measure
        assert (row["allreduce_algbw_gbps"] == "") == (row["world_size"] == "1")
        assert float(row["samples_per_s"]) == pytest.approx(
            int(row["global_batch"]) / float(row["step_time_ms_p50"]) * 1e3)
        assert int(row["global_batch"]) == int(row["per_rank_batch"]) * int(row["world_size"]) * int(
            row["grad_accum"])
        assert row["tokens_per_s"] == "" and row["mfu"] == ""  # not a sequence model; CPU has no peak
        assert (float(row["allreduce_busbw_gbps"]) == 0) == (row["world_size"] == "1")
        # gloo: no NCCL transport; CPU: no caching allocator, no device memory
        assert row["nccl_transport"] == row["peak_reserved_mb"] == row["device_used_mb"] == ""
        # one gzipped trace per rank, loadable as JSON
        assert row["trace_dir"] == f"traces/{row['cell_id']}"
        traces = sorted((out / row["trace_dir"]).glob("*.pt.trace.json.gz"))
        assert [t.name.split(".")[0] for t in traces] == [f"rank{r}" for r in range(int(row["world_size"]))]
        trace = json.loads(gzip.decompress(traces[-1].read_bytes()))
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"forward", "backward", "opt_step", "data_movement"} <= names
    if n_engines > 1:
        sync_waits = [r["sync_wait_ms_p50"] for r in by_status["ok"] if r["engine"] != "torch"]
        assert all(v != "" for v in sync_waits)
    with open(out / "allreduce_sweep.csv", newline="") as f:
        sweep = list(csv.DictReader(f))
    ws2 = [r for r in by_status["ok"] if r["world_size"] == "2"]
    assert {p["cell_id"] for p in sweep} == {r["cell_id"] for r in ws2}  # none at world size 1
    for row in ws2:  # sizes double from 4 KiB to the largest bucket (the row's probe), fp16 on the wire
        points = [p for p in sweep if p["cell_id"] == row["cell_id"]]
        assert int(points[0]["size_bytes"]) == 4096 and points[-1]["size_bytes"] == row["allreduce_bytes"]
        assert float(points[-1]["busbw_gbps"]) == float(row["allreduce_busbw_gbps"])
        assert {p["dtype"] for p in points} == {"float16" if row["comm_dtype"] == "fp16" else "float32"}
        assert all(float(p["time_us"]) > 0 and p["backend"] == "gloo" for p in points)
    assert "traces: " in proc.stdout
    from bench.run.results import read_records

    records = read_records(out)  # a profiled cell's record is completed by a later line: the latest wins
    assert [r["cell_id"] for r in records] == [r["cell_id"] for r in rows]
    assert all(len(r["step_times_ms"]) == 2 for r in records if r["status"] == "ok")
    assert all(r["cell"]["engine"] == r["engine"] for r in records)
    env = json.loads((out / "env.json").read_text())
    assert set(ENV_KEYS) <= set(env) and env["device"] == "cpu" and env["backend"] == "gloo"
    assert "OMP_NUM_THREADS" in env["env_vars"]
    assert (out / "config.toml").is_file() and list((out / "logs").glob("launch-*.err"))
    assert "nccl_transport" not in env and not list((out / "logs").glob("nccl-*"))  # no NCCL on CPU
    assert "overhead per cell" in proc.stdout
    assert_no_orphans(out)


@pytest.mark.timeout(150)
def test_hang_and_crash_are_recorded_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "run"
    # ws2, accumulation 1..4: ga2 hangs (timeout, its launch killed), ga1, ga3 and ga4 run.
    proc = run_bench(out, "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1,2,3,4",
                     "run.cell_timeout_s=6", "run.startup_timeout_s=60", "profile.enabled=false",
                     "debug.fault=hang@-ga2-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out)
    status = {r["grad_accum"]: r["status"] for r in rows}
    assert status == {"1": "ok", "2": "timeout", "3": "ok", "4": "ok"}
    # the last rank hangs, the other waits for it in a collective: the process group's timeout
    # (run.pg_timeout_s="auto": 0.75 × 6 s, below the watchdog's limit) ends it there, which that rank names
    assert "rank 0 stuck in " in rows[1]["error"] and "run.pg_timeout_s=4.5s" in rows[1]["error"], rows[1]
    assert rows[1]["step_time_ms_p50"] == ""
    assert len(list((out / "logs").glob("launch-*.pid"))) == 2  # relaunched once for ga3, ga4
    assert_no_orphans(out)

    out2 = tmp_path / "run2"
    proc = run_bench(out2, "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1,2,3",
                     "profile.enabled=false", "debug.fault=crash@-ga2-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out2)
    assert {r["grad_accum"]: r["status"] for r in rows} == {"1": "ok", "2": "failed", "3": "ok"}
    failed = rows[1]
    assert "injected crash" in failed["error"] and "rank 1" in failed["error"]
    assert failed["step_time_ms_p50"] == "" and failed["trace_dir"] == ""
    assert_no_orphans(out2)


@pytest.mark.timeout(150)
def test_a_failure_on_one_rank_ends_its_group_in_seconds_with_its_own_cause(tmp_path):
    """torch and overlap side by side at 2 ranks; overlap's first timed step raises an out-of-memory error on
    rank 1 only, while rank 0 waits in that step's all-reduce. Before: rank 1 went on stepping torch, the
    collectives no longer paired, both ranks waited until the watchdog (run.cell_timeout_s, 60 s here)
    killed the launch and the group was recorded `timeout` with the cause lost. Now: overlap is `oom` with
    the message, the launch ends within 10 s of the failure, and torch, relaunched, is measured."""
    from bench.run_folder import launch_file
    from bench.worker.guard import GRACE_S

    out = tmp_path / "run"
    proc = run_bench(out, "matrix.engine=torch,overlap", "matrix.world_size=2", "matrix.grad_accum=1",
                     "profile.enabled=false", "debug.fault=oom@overlap-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out)
    status = {r["engine"]: (r["status"], r["error"]) for r in rows}
    assert status["torch"] == ("ok", "") and status["overlap"][0] == "oom", status
    assert "injected out of memory" in status["overlap"][1] and "rank 1" in status["overlap"][1]
    events = [json.loads(line) for line in (out / "logs" / launch_file(0, "events.jsonl")).read_text()
              .splitlines()]
    (alone,) = [e for e in events if e.get("alone")]
    failed_at = alone["t"] - GRACE_S  # the event is written once the grace for the other ranks is over
    relaunched_at = (out / "logs" / launch_file(1, "plan.json")).stat().st_mtime
    assert relaunched_at - failed_at <= 10.0, relaunched_at - failed_at
    assert_no_orphans(out)


@pytest.mark.timeout(150)
def test_a_worker_killed_during_start_up_is_relaunched_once(tmp_path):
    """A worker SIGKILLed before its first cell (the OOM killer, a kill -9) is not the cells' fault: the
    world size is launched again, and its cells are measured. Before: every cell of the world size was
    `failed` with "launch exited with code 1 before its first cell" and never relaunched."""
    from bench.run.launch_log import killed_by
    from bench.run_folder import launch_file

    env = os.environ | {"OMP_NUM_THREADS": "1"}
    # rank 1's hello says it is up; the launch's "start" that its first cell has begun. The gap between them
    # (the process group forming, the group planned) can be shorter than this loop's poll on a busy
    # machine: a run where the kill missed it measures its cell unharmed, and the scenario is run again.
    for attempt in range(3):
        out = tmp_path / f"run{attempt}"
        cmd = bench_cmd(out, "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1",
                        "profile.enabled=false")
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        events = out / "logs" / launch_file(0, "events.jsonl")
        killed, deadline = None, time.time() + 60
        while killed is None and time.time() < deadline and proc.poll() is None:
            lines = events.read_text().splitlines() if events.exists() else []
            if any('"start"' in x for x in lines):
                break  # missed: its first cell has begun
            hello = [x for x in lines if '"hello"' in x and '"rank": 1' in x and x.endswith("}")]
            if hello:  # a whole line (the file is read while the ranks write it)
                killed = json.loads(hello[0])["pid"]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.005)
        _, stderr = proc.communicate(timeout=120)
        if killed:
            break
    assert killed and proc.returncode == 0, stderr[-3000:]
    assert "was killed (SIGKILL (signal 9)) before its first cell; launching again" in stderr
    assert killed_by(out / "logs" / launch_file(0, "err")) == "SIGKILL (signal 9)"
    _, rows = read_csv(out)
    assert rows and all(r["status"] == "ok" for r in rows)
    assert_no_orphans(out)


@pytest.mark.timeout(150)
def test_killed_run_resumes_without_duplicates(tmp_path):
    out = tmp_path / "run"
    overrides = ("matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1,2,3",
                 "profile.enabled=false")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    # The last cell hangs, so the run is certainly in flight when it is killed.
    proc = subprocess.Popen(bench_cmd(out, *overrides, "debug.fault=hang@-ga3-"), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    cells = out / "cells.jsonl"
    deadline = time.time() + 90
    while time.time() < deadline and (not cells.exists() or len(cells.read_text().splitlines()) < 2):
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # as Ctrl-C does: stop the launch, keep what finished
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr[-2000:]
    assert "--resume" in stderr
    assert_no_orphans(out)
    before = [json.loads(line)["cell_id"] for line in cells.read_text().splitlines()]
    assert len(before) == 2

    resumed = run_bench(out, *overrides, extra=("--resume",))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(1 cell to run, 2 done before)" in resumed.stdout
    ids = [json.loads(line)["cell_id"] for line in cells.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 3 and ids[:2] == before
    _, rows = read_csv(out)
    assert [r["cell_id"] for r in rows] == ids and {r["status"] for r in rows} == {"ok"}
    again = run_bench(out, *overrides, extra=("--resume",))
    assert again.returncode == 0 and "0 cells to run" in again.stdout
    assert len(cells.read_text().splitlines()) == 3


@pytest.mark.timeout(120)
def test_plan_only_own_torchrun_then_collect(tmp_path):
    out = tmp_path / "run"
    proc = run_bench(out, "matrix.engine=torch", "matrix.world_size=1,2", "matrix.grad_accum=1",
                     "profile.enabled=false", extra=("--plan-only",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torchrun" in proc.stdout and (out / "plan.json").is_file()
    # What a user runs on each node (here: one node, world size 2), then the collect step.
    env = os.environ | {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    worker = subprocess.run([*torchrun, "-m", "bench.worker", "--plan", str(out / "plan.json")],
                            capture_output=True, text=True, timeout=90, env=env, cwd=REPO)
    assert worker.returncode == 0, worker.stderr[-3000:]
    collect = subprocess.run([sys.executable, "-m", "bench", "run", "--collect", str(out)],
                             capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert collect.returncode == 0, collect.stderr[-3000:]
    assert "1 not run yet" in collect.stdout  # the world-size-1 cell: no launch of that size yet
    columns, rows = read_csv(out)
    assert tuple(columns) == RESULT_COLUMNS
    assert [(r["world_size"], r["status"]) for r in rows] == [("2", "ok")]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device (NCCL backend)")
def test_gpu_sweep_nccl(tmp_path):
    """The CUDA path: NCCL, CUDA events, autocast bf16/fp16 with GradScaler, tf32, CUDA traces (one slice
    profiled, every engine and world size at bf16 without accumulation: a profiled pass of every one of the
    96 cells would not fit the time limit)."""
    import torch

    out = tmp_path / "run"
    sizes = "1,2" if torch.cuda.device_count() >= 2 else "1"
    proc = run_bench(out, "run.device=cuda", f"matrix.engine={ENGINES}", f"matrix.world_size={sizes}",
                     "matrix.precision=fp32,tf32,bf16,fp16", "matrix.comm_dtype=none,bf16",
                     "run.threads_per_rank=0", "profile.cells=*-bf16-cnone-ga1-*", timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    columns, rows = read_csv(out)
    assert tuple(columns) == RESULT_COLUMNS
    assert {r["status"] for r in rows} <= {"ok", "skipped"}
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["device"] == "cuda" and r["backend"] == "nccl" and r["gpu_name"] for r in ok)
    traced = {r["cell_id"] for r in ok if r["trace_dir"]}
    assert traced and all("-bf16-cnone-ga1-" in cell_id for cell_id in traced)
    env = json.loads((out / "env.json").read_text())
    assert env["gpu_count"] >= 1 and env["gpus"][0]["name"] and env["nccl"]


@pytest.mark.timeout(120)
def test_sigkill_of_the_launcher_during_a_hung_cell_leaves_no_process(tmp_path):
    out = tmp_path / "run"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = bench_cmd(out, "matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1",
                    "profile.enabled=false", "run.cell_timeout_s=300", "debug.fault=hang@-ga1-")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 90  # until both ranks said hello and the hung cell started
    events = out / "logs" / "launch-0.events.jsonl"
    while time.time() < deadline:
        lines = events.read_text().splitlines() if events.exists() else []
        if sum('"hello"' in line for line in lines) == 2 and any('"start"' in line for line in lines):
            break
        time.sleep(0.2)
    time.sleep(1.0)
    pids = launched_pids(out)
    assert len(pids) >= 3  # torchrun and two ranks
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: only the kernel and the ranks' watchdogs act
    proc.wait()
    deadline = time.time() + 5
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes outlived their launcher"


@pytest.mark.timeout(120)
def test_resume_stops_what_an_earlier_launch_left_running(tmp_path):
    # A launch's ranks left running (as a launcher killed on a system without parent-death signals
    # would leave them): the resume finds them by the pids the run folder recorded, checks they still
    # run this folder's plan, and stops them before running anything.
    from bench.lifetime import leftovers

    out = tmp_path / "run"
    overrides = ("matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1", "profile.enabled=false")
    assert run_bench(out, *overrides).returncode == 0
    logs = out / "logs"
    fake = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(60)",
                             "--plan", str((logs / "launch-0.plan.json").resolve())], start_new_session=True)
    (logs / "launch-9.pid").write_text(f"{fake.pid}\n")
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (logs / "launch-10.pid").write_text(f"{stranger.pid}\n")  # a pid reused by someone else: left alone
    try:
        assert leftovers(out) == [fake.pid]
        resumed = run_bench(out, *overrides, extra=("--resume",))
        assert resumed.returncode == 0 and f"pids {fake.pid}" in resumed.stderr
        fake.wait(timeout=10)
        assert stranger.poll() is None
    finally:
        for p in (fake, stranger):
            p.kill()
            p.wait()


@pytest.mark.timeout(150)
def test_resume_retry_runs_failed_cells_again_and_the_new_record_wins(tmp_path):
    from bench.run.results import read_records

    out = tmp_path / "run"
    overrides = ("matrix.engine=torch", "matrix.world_size=2", "matrix.grad_accum=1,2",
                 "profile.enabled=false")
    assert run_bench(out, *overrides, "debug.fault=crash@-ga2-").returncode == 0
    assert [r["status"] for r in read_records(out)] == ["ok", "failed"]
    again = run_bench(out, *overrides, extra=("--resume", "--retry", "failed"))
    assert again.returncode == 0 and "(1 cell to run, 1 done before)" in again.stdout, again.stderr[-2000:]
    assert [r["status"] for r in read_records(out)] == ["ok", "ok"]  # one record per cell: the latest
    _, rows = read_csv(out)
    assert [r["status"] for r in rows] == ["ok", "ok"]


def test_the_opening_line_counts_cells_to_run_done_and_skipped():
    from bench.run.planner import plan
    from bench.run.runner import counts_words

    # torch's bf16 hook at 1 and 2 ranks: both skipped on CPU (bench.matrix skip rules), none run yet
    made = plan("cpu-smoke", ["matrix.engine=torch", "matrix.comm_dtype=none,bf16", "matrix.grad_accum=1",
                              "matrix.scaling=strong"])
    runnable = list(made.runnable)
    assert (len(made.cells), len(runnable)) == (4, 2)
    assert counts_words(made, runnable) == "2 cells to run, 2 skipped"  # a fresh run: nothing done yet
    assert counts_words(made, runnable[1:]) == "1 cell to run, 1 done before, 2 skipped"
