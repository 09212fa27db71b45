"""The suite on CUDA/NCCL (skipped without CUDA): every world size the machine has (1, 2, 4, 8), comm dtypes,
accumulation, autocast with GradScaler, the TF32 flags each cell ran with, memory released between cells,
allocated ≤ reserved ≤ device memory, positive bus bandwidth, NCCL's transport from its log, and traces
holding GPU and NCCL kernels. Written to pass on 1 GPU and on 8."""

from __future__ import annotations

import csv
import gc
import gzip
import json
import os

import pytest
import torch
import torch.distributed as dist
from test_runner import read_csv, run_bench

from bench.config import load_config
from bench.matrix import expand
from bench.run import nccl_log
from bench.schema import RESULT_COLUMNS, MiB
from bench.worker import process
from bench.worker.cell import run_group
from bench.worker.context import Launch
from bench.worker.trainer import Trainer
from bench.workloads import get_workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL backend)"),
]

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
WORLD_SIZES = [ws for ws in (1, 2, 4, 8) if ws <= GPUS]
ENGINES = "torch,naive,bucketed,overlap"
LEAK_TOLERANCE_BYTES = MiB  # see test_memory_is_released_between_cells


def smoke_config(overrides: list[str], cuda_available: bool | None = None):
    """cpu-smoke at strong scaling only (the preset sweeps both), with `overrides`."""
    return load_config("cpu-smoke", ["matrix.scaling=strong", *overrides], cuda_available=cuda_available)


def kernels(trace: dict) -> list[str]:
    """Names of the GPU kernels in a Kineto trace (complete events of category "kernel")."""
    return [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]


@pytest.mark.timeout(1500)
def test_gpu_sweep_every_world_size(tmp_path):
    out = tmp_path / "run"
    # global batch 8 divides every world size up to 8; fp16 runs autocast with a GradScaler, tf32 the
    # TF32 flags; traces for one slice (fp16, no compression, no accumulation) keep the run short.
    proc = run_bench(out, "run.device=cuda", "run.threads_per_rank=0", "workload.global_batch=8",
                     f"matrix.engine={ENGINES}", f"matrix.world_size={','.join(map(str, WORLD_SIZES))}",
                     "matrix.precision=fp16,tf32", "matrix.comm_dtype=none,fp16,bf16",
                     "matrix.grad_accum=1,2", "profile.cells=*-fp16-cnone-ga1-*", timeout=1400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    own_nccl_debug = any(v in os.environ for v in nccl_log.DEBUG_VARS)  # then the launcher keeps the user's
    columns, rows = read_csv(out)
    assert tuple(columns) == RESULT_COLUMNS
    assert {r["status"] for r in rows} <= {"ok", "skipped"}
    ok = [r for r in rows if r["status"] == "ok"]
    assert {int(r["world_size"]) for r in ok} == set(WORLD_SIZES)
    n_engines = len(ENGINES.split(","))
    # every cell runs but the compressed ones at world size 1 (nothing to compress)
    assert len(ok) == n_engines * 2 * 2 * (1 + 3 * (len(WORLD_SIZES) - 1))
    for r in ok:
        assert r["device"] == "cuda" and r["backend"] == "nccl" and r["gpu_name"]
        flag = "tf32" if r["precision"] == "tf32" else "ieee"
        assert r["matmul_fp32_precision"] == flag and r["cudnn_fp32_precision"] == flag
        assert r["sync_wait_ms_p50"] == ""  # host time is enqueue time on CUDA: not reported
        assert float(r["step_time_ms_p50"]) > 0 and float(r["peak_mem_mb"]) > 0
        # the allocator holds at least what it hands out; the device holds that plus context and NCCL
        assert float(r["peak_reserved_mb"]) >= float(r["peak_mem_mb"])
        assert float(r["device_used_mb"]) >= float(r["peak_reserved_mb"])
        if r["world_size"] == "1":
            assert r["allreduce_algbw_gbps"] == "" and float(r["allreduce_busbw_gbps"]) == 0
            assert r["nccl_transport"] == ""  # one rank: NCCL connects nothing
        else:
            assert float(r["allreduce_busbw_gbps"]) > 0
            if not own_nccl_debug:  # bench's NCCL_DEBUG=INFO log: the transport of every connection
                assert r["nccl_transport"], r["cell_id"]
    with open(out / "allreduce_sweep.csv", newline="") as f:
        sweep = list(csv.DictReader(f))
    wire = {"none": "float32", "fp16": "float16", "bf16": "bfloat16"}
    by_cell = {r["cell_id"]: r for r in ok}
    assert {p["cell_id"] for p in sweep} == {r["cell_id"] for r in ok if r["world_size"] != "1"}
    for p in sweep:
        assert float(p["busbw_gbps"]) > 0 and p["backend"] == "nccl"
        assert p["dtype"] == wire[by_cell[p["cell_id"]]["comm_dtype"]]
    profiled = [r for r in ok if r["trace_dir"]]
    assert {(r["engine"], int(r["world_size"])) for r in profiled} == {
        (e, ws) for e in ENGINES.split(",") for ws in WORLD_SIZES}
    for r in profiled:
        files = sorted((out / r["trace_dir"]).glob("*.pt.trace.json.gz"))
        ranks = sorted(f"rank{i}" for i in range(int(r["world_size"])))
        assert [f.name.split(".")[0] for f in files] == ranks  # one file per rank
        names = kernels(json.loads(gzip.decompress(files[0].read_bytes())))
        assert names, f"{r['cell_id']}: no GPU kernel in the trace"
        if r["world_size"] != "1":  # NCCL kernels: ncclDevKernel_* (NCCL >= 2.19), ncclKernel_* before
            assert any(n.startswith(("ncclDevKernel", "ncclKernel")) for n in names), r["cell_id"]
    env = json.loads((out / "env.json").read_text())
    assert env["gpu_count"] == GPUS and env["nccl"] and "tf32" not in env
    if not own_nccl_debug:  # one NCCL log per rank in logs/, none of it in the ranks' stderr
        launches = env["nccl_transport"].values()
        assert {e["world_size"] for e in launches} == set(WORLD_SIZES)
        for e in launches:
            # one file per rank (one rank may have none, were NCCL not initialised at world size 1)
            assert len(e["log_files"]) == e["world_size"] or (e["world_size"] == 1 and not e["log_files"])
            assert e["set_by"] == "bench"
            assert all((out / f).is_file() for f in e["log_files"])
        assert not any("NCCL INFO" in p.read_text() for p in (out / "logs").glob("launch-*.err"))
    assert "traces: " in proc.stdout


@pytest.mark.timeout(600)
def test_memory_is_released_between_cells(tmp_path):
    """Cells do not accumulate CUDA memory: after each cell (and a garbage collection) memory_allocated is
    the same in the second and the third round of the same cells, and never a cell's model above the
    baseline.

    The first round lets the process's caches settle (cuBLAS workspaces come from the caching allocator and
    stay for the process's life). Not "back at the baseline after every cell": on an H100 (torch 2.11,
    NCCL 2.28, world size 1) torch DDP leaves exactly twice its gradient bytes allocated after its cell,
    held by no Python object (gc finds no such tensor), not freed by empty_cache, and freed by the next
    cell's collectives — torch's C++ side (the reducer's last buckets as NCCL's work keeps them), bounded
    and not growing. A cell left behind holds its weights, gradients and AdamW's two moments (4x the
    parameter bytes, checked below) and grows every round. NCCL's own buffers are not from the caching
    allocator and do not count.
    """
    device = process.pick_device("cuda", 0)
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            device_id=device)
    try:
        config = smoke_config([
            "run.device=cuda", f"matrix.engine={ENGINES}", "matrix.world_size=1", "matrix.precision=fp16",
            "matrix.grad_accum=2", "profile.enabled=false", "workload.model_size=small"], cuda_available=True)
        cells = expand(config)

        def run_all() -> list[int]:
            after = []
            for group in [[c] for c in cells] + [cells]:  # each cell alone, then all side by side
                for status, error, _ in run_group(group, Launch(config, device)):
                    assert (status, error) == ("ok", None)
                gc.collect()
                after.append(torch.cuda.memory_allocated(device))
            return after

        run_all()
        baseline = torch.cuda.memory_allocated(device)
        second, third = run_all(), run_all()
        # weights, gradients and AdamW's two moments of the MLP: what a cell that stays alive keeps
        model_bytes = 4 * 4 * sum(p.numel() for p in get_workload("mlp", "small").build_model().parameters())
        assert LEAK_TOLERANCE_BYTES < model_bytes / 10
        assert all(abs(a - b) <= LEAK_TOLERANCE_BYTES for a, b in zip(second, third)), (second, third)
        assert all(a - baseline < model_bytes for a in second + third), (baseline, second, third)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
def test_a_step_makes_no_host_sync_in_any_precision(tmp_path):
    """Every engine at fp32, bf16 and fp16 (GradScaler): a training step after warm-up queues its work
    without a device→host sync (torch.cuda.set_sync_debug_mode("error") raises on a synchronizing call),
    so the timed windows measure the same kind of step in every precision. With the foreach AdamW,
    GradScaler.step reads found_inf on the host in fp16 cells (bench/worker/trainer.py make_optimizer)."""
    device = process.pick_device("cuda", 0)
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            device_id=device)
    try:
        config = smoke_config(["run.device=cuda", f"matrix.engine={ENGINES}", "matrix.world_size=1",
                               "matrix.precision=fp32,bf16,fp16", "matrix.grad_accum=2",
                               "profile.enabled=false"], cuda_available=True)
        synced = []
        for cell in expand(config):
            trainer = Trainer(cell, config, device, 0, 1, 4)
            for _ in range(2):  # lazy state (optimizer moments, the scaler's scale) is made here
                trainer.step()
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("error")
            try:
                trainer.step()
            except RuntimeError as e:
                synced.append(f"{cell.cell_id}: {str(e).splitlines()[0]}")
            finally:
                torch.cuda.set_sync_debug_mode(0)
            del trainer
        assert not synced, synced
    finally:
        dist.destroy_process_group()


def test_pick_device_on_this_machine():
    assert process.pick_device("cuda", GPUS - 1) == torch.device("cuda", GPUS - 1)
    if GPUS == 1:  # one GPU visible: every local rank gets it, as under srun --gpus-per-task=1
        assert process.pick_device("cuda", 1) == torch.device("cuda", 0)
    else:  # a local rank past the visible GPUs would share one: refused
        with pytest.raises(RuntimeError, match=f"LOCAL_RANK={GPUS} but this process sees only {GPUS} GPUs"):
            process.pick_device("cuda", GPUS)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
@pytest.mark.timeout(400)
def test_plan_mode_under_nccl_a_failing_cell_costs_seconds_not_the_timeout(tmp_path):
    """A plan run (no launcher) where rank 1 raises in one cell while rank 0 waits in a collective with it:
    rank 0 leaves that collective when rank 1's failure key appears (its failure watch aborts its
    NCCL communicator), both agree, and the next cell runs — well inside the 600 s process-group timeout,
    after which NCCL's watchdog would have killed the ranks and the rest of the world size."""
    import subprocess
    import sys
    import time

    from test_multinode import ENV, REPO, TINY, collect, rows

    from bench.__main__ import main as bench_main

    out = tmp_path / "run"
    sets = [*TINY, "run.device=cuda", "run.threads_per_rank=0", "run.pg_timeout_s=600",
            "debug.fault=crash@bna"]
    assert bench_main(["run", "--config", "cpu-smoke", *(a for s in sets for a in ("--set", s)),
                       "--plan-only", "--out", str(out)]) == 0
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", "-m", "bench.worker", "--plan", str(out / "plan.json")], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=380)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert elapsed < 300, f"{elapsed:.0f} s: the failed cell waited for the process-group timeout"
    collect(out)
    assert [(r["engine"], r["status"]) for r in rows(out)] == [("torch", "ok"), ("naive", "failed"),
                                                               ("bucketed", "ok")]


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
@pytest.mark.timeout(400)
def test_world_size_1_packs_onto_disjoint_gpus(tmp_path):
    """run.pack auto on CUDA: world size 1's two groups (accumulation 1 and 2) run in launches at once, each
    on its own GPU (CUDA_VISIBLE_DEVICES of one id) and CPU share; torch and overlap of a group stay
    together, so their pairing (speed_vs_torch) is on one GPU."""
    out = tmp_path / "run"
    proc = run_bench(out, "run.device=cuda", "run.threads_per_rank=0", "matrix.world_size=1",
                     "matrix.engine=torch,overlap", "matrix.grad_accum=1,2", "profile.enabled=false",
                     timeout=380)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["packed_launches"] for r in rows} == {"2"}  # two groups: two of the GPUS slots at once
    records = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    by_group = {}
    for r in records:
        by_group.setdefault(r["grad_accum"], set()).add(r["slot_gpus"])
    assert all(len(gpus) == 1 for gpus in by_group.values())  # a group on one GPU
    assert len({next(iter(g)) for g in by_group.values()}) == 2  # the two groups on two GPUs
    assert all("," not in next(iter(g)) for g in by_group.values())
