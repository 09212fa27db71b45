"""Packing (run.pack, bench/run/packing.py): a world size below the node's GPUs in several launches at once,
each on its own GPUs and CPUs, each taking whole groups; the estimate and --dry-run know it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.config import ConfigError, load_config, usable_cpus
from bench.matrix import expand
from bench.run import packing
from bench.run.estimate import RATES, estimate_seconds, fixed_seconds
from bench.run.packing import ALONE, Slot, slots
from bench.run_folder import launch_file, read_records

REPO = Path(__file__).resolve().parent.parent
CPUS64 = list(range(64))


def test_an_8_gpu_node_has_8_one_gpu_slots_4_two_gpu_ones_and_one_eight_gpu_one():
    one = slots("auto", "cuda", 1, 8, 0, CPUS64, environ={})
    assert [s.gpus for s in one] == [(str(i),) for i in range(8)] and {s.of for s in one} == {8}
    assert [s.cpus for s in one][:2] == [tuple(range(0, 8)), tuple(range(8, 16))]  # 64 CPUs ÷ 8 slots
    two = slots("auto", "cuda", 2, 8, 0, CPUS64, environ={})
    assert [s.gpus for s in two] == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]
    assert [len(s.cpus) for s in two] == [16] * 4
    three = slots("auto", "cuda", 3, 8, 0, CPUS64, environ={})  # 8 // 3 = 2 slots; GPUs 6, 7 stay idle
    assert [s.gpus for s in three] == [("0", "1", "2"), ("3", "4", "5")]
    assert slots("auto", "cuda", 8, 8, 0, CPUS64, environ={}) == [ALONE]
    assert slots("off", "cuda", 1, 8, 0, CPUS64, environ={}) == [ALONE]
    # the user's own CUDA_VISIBLE_DEVICES: the slots index into it
    mine = slots("on", "cuda", 2, 4, 0, CPUS64, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert [s.gpus for s in mine] == [("4", "5"), ("6", "7")]
    assert mine[1].env() == {"CUDA_VISIBLE_DEVICES": "6,7"} and ALONE.env() == {}
    assert mine[1].facts() == {"packed_launches": 2, "slot_gpus": "6,7"}


def test_a_cpu_packs_only_when_asked_on_its_cores():
    assert slots("auto", "cpu", 1, 0, 0, [0, 1, 2, 3]) == [ALONE]  # CPU ranks would share memory bandwidth
    on = slots("on", "cpu", 1, 0, 0, [0, 1, 2, 3])
    assert [s.cpus for s in on] == [(0,), (1,), (2,), (3,)] and all(s.gpus == () for s in on)
    assert [s.cpus for s in slots("on", "cpu", 2, 0, 0, [0, 1, 2, 3])] == [(0, 1), (2, 3)]
    assert slots("on", "cpu", 1, 0, 2, [0, 1, 2, 3]) == [Slot(0, 2, (), (0, 1)), Slot(1, 2, (), (2, 3))]
    # threads per rank: the slot's CPUs ÷ its ranks, as a rank of the full node gets; alone, the launcher's
    assert packing.threads_per_rank(Slot(0, 4, ("0", "1"), tuple(range(16))), 2, 0, 64) == 8
    assert packing.threads_per_rank(ALONE, 2, 0, 64) == 32 and packing.threads_per_rank(ALONE, 2, 3, 64) == 3


def test_run_pack_takes_auto_on_or_off():
    with pytest.raises(ConfigError, match="run.pack"):
        load_config("cpu-smoke", ["run.pack=yes"])


def test_a_packed_world_size_costs_its_longest_slot_in_the_estimate():
    # world size 1 of two equal groups, on a planned 2-GPU node: the groups run at once, so the cells
    # cost half as long; at world size 2 (one slot) nothing changes
    sets = ["run.device=cuda", "matrix.world_size=1", "matrix.scaling=strong", "matrix.grad_accum=1,2",
            "matrix.engine=torch,overlap", "matrix.bucket_cap_mb=25", "matrix.precision=fp32"]
    config = load_config("cpu-smoke", sets, cuda_available=lambda: True)
    cells = expand(config, gpu_count=2)
    fixed = fixed_seconds(config, RATES["cuda"], cells)
    alone = estimate_seconds(config, cells, gpus=1) - fixed
    assert estimate_seconds(config, cells, gpus=0) - fixed == pytest.approx(alone)
    packed = estimate_seconds(config, cells, gpus=2) - fixed
    # the ga2 group's cells step twice the micro-batches: the longer group sets the packed time
    assert alone / 2 < packed < alone
    off = load_config("cpu-smoke", [*sets, "run.pack=off"], cuda_available=lambda: True)
    assert estimate_seconds(off, cells, gpus=2) - fixed == pytest.approx(alone)


def test_dry_run_says_what_it_packs():
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "gpu-node-quick", "--dry-run",
                           "--plan-only", "--gpus-per-node", "8"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "packed (run.pack = auto): world size 1 in 8 launches at once" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(usable_cpus() < 2, reason="packing on a CPU needs 2 cores for 2 slots")
def test_a_packed_cpu_sweep_runs_two_launches_at_once_on_their_own_cores(tmp_path):
    out = tmp_path / "run"
    sets = ["matrix.world_size=1", "matrix.scaling=strong", "matrix.grad_accum=1,2",
            "matrix.engine=torch,overlap", "run.pack=on", "run.launches=1", "run.threads_per_rank=1",
            "profile.enabled=false", "run.timed_steps=6", "run.compute_only_steps=2", "run.phase_steps=1",
            "run.probe_iters=1"]
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "cpu-smoke",
                           *[a for s in sets for a in ("--set", s)], "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_records(out)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["packed_launches"] for r in rows} == {2} and {r["slot_gpus"] for r in rows} == {None}
    # the two groups each on its own core, the launches' lifetimes overlapping
    cpus = {r["grad_accum"]: tuple(r["rank0_cpus"]) for r in rows}
    assert len(set(cpus.values())) == 2 and all(len(c) == 1 for c in cpus.values())
    spans = []
    for k in range(2):
        times = [json.loads(line)["t"] for line in (out / "logs" / launch_file(k, "events.jsonl")).open()]
        spans.append((min(times), max(times)))
        assert "cpus=" in (out / "logs" / launch_file(k, "cmd")).read_text()
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]


@pytest.mark.slow
@pytest.mark.skipif(usable_cpus() < 2, reason="packing on a CPU needs 2 cores for 2 slots")
@pytest.mark.timeout(150)
def test_a_stopped_packed_sweep_stops_every_launch_and_keeps_what_finished(tmp_path):
    # Two launches at once: ga1's finishes, ga2's hangs. SIGTERM (as Ctrl-C) stops both, leaves no process
    # of either, and keeps ga1's row; --resume then runs ga2 alone.
    from test_runner import FAST, assert_no_orphans

    out = tmp_path / "run"
    sets = [*FAST, "matrix.engine=torch", "matrix.world_size=1", "matrix.grad_accum=1,2", "run.pack=on",
            "run.threads_per_rank=1", "profile.enabled=false"]
    cmd = [sys.executable, "-m", "bench", "run", "--config", "cpu-smoke",
           *[a for s in sets for a in ("--set", s)], "--out", str(out)]
    proc = subprocess.Popen([*cmd, "--set", "debug.fault=hang@-ga2-"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=os.environ | {"OMP_NUM_THREADS": "1"})
    cells = out / "cells.jsonl"
    deadline = time.time() + 90
    while time.time() < deadline and (not cells.exists() or not cells.read_text().strip()):
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr[-2000:]
    assert len(list((out / "logs").glob("launch-*.pid"))) == 2
    assert_no_orphans(out)
    assert [r["grad_accum"] for r in read_records(out)] == [1]
    resumed = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=120,
                             env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert sorted(r["grad_accum"] for r in read_records(out)) == [1, 2]


def test_a_world_size_with_fewer_groups_than_slots_says_how_many_ran_at_once(tmp_path, monkeypatch):
    # 8 cores, 1 thread a rank: 8 slots for world size 1, but 2 groups: 2 lanes, each `of` 2, on the first
    # two slots in repeat 0 and rotated by one slot in repeat 1
    import io

    from bench.run.progress import Progress
    from bench.run.sweep import Sweep

    monkeypatch.setattr(packing, "launcher_cpus", lambda: list(range(8)))
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.scaling=strong",
                                       "matrix.grad_accum=1,2", "matrix.engine=torch,overlap", "run.pack=on",
                                       "run.threads_per_rank=1"])
    sweep = Sweep(config, tmp_path, Progress(0, stream=io.StringIO()))
    lanes = sweep.lanes(1, 0, expand(config))
    assert [(s.index, s.of, s.cpus) for s, _ in lanes] == [(0, 2, (0,)), (1, 2, (1,))]
    assert sorted(len(share) for _, share in lanes) == [2, 2]
    assert [s.index for s, _ in sweep.lanes(1, 1, expand(config))] == [1, 2]
