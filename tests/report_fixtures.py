"""Fixture runs for the report, compare and TensorBoard tests: a results/<run-id>/ folder written by hand.

The numbers are chosen so that every derived value can be worked out on paper (see the tests). Rows follow
`bench.schema.RESULT_COLUMNS`; what a row does not set stays empty, as the runner leaves unmeasured numbers.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from bench.schema import RESULT_COLUMNS

H100_ENV = {
    "torch": "2.13.0",
    "cuda": "12.8",
    "cudnn": "91000",
    "nccl": "2.27.3",
    "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559, "capability": "9.0"}] * 4,
    "gpu_count": 4,
    "driver": "570.124.06",
    "topology": "GPU0 GPU1 GPU2 GPU3\nNV18 NV18 NV18 NV18",
    "cpu_model": "Intel Xeon Platinum 8480+",
    "cpu_cores": 112,
    "env_vars": {"NCCL_DEBUG": "WARN"},
    "tf32": {"matmul": False, "cudnn": True},
    "git_sha": "abc1234",
    "hostname": "h100-node",
    "command": "python -m bench run --config gpu-node",
    "time": "2026-11-20T10:00:00Z",
    "python": "3.11.7",
    "device": "cuda",
    "backend": "nccl",
}

A100_ENV = {
    **H100_ENV,
    "cuda": "12.4",
    "nccl": "2.21.5",
    "driver": "550.54.15",
    "hostname": "a100-node",
    "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920, "capability": "8.0"}] * 4,
    "topology": "GPU0 GPU1 GPU2 GPU3\nNV12 NV12 NV12 NV12",
}

CPU_ENV = {
    **H100_ENV,
    "cuda": None,
    "cudnn": None,
    "nccl": None,
    "gpus": [],
    "gpu_count": 0,
    "driver": None,
    "topology": None,
    "device": "cpu",
    "backend": "gloo",
    "hostname": "laptop",
}

CONFIG_TOML = """description = "fixture run for the report tests"

[matrix]
engines = ["torch", "overlap", "naive"]
world_sizes = [1, 2, 4]

[workload]
model = "mlp"
size = "tiny"

[run]
device = "{device}"

[profile]
enabled = true
"""


def row(
    engine: str,
    world_size: int,
    step_ms: float | None,
    *,
    status: str = "ok",
    error: str = "",
    bucket_cap_mb: float | None = 25.0,
    precision: str = "fp32",
    comm_dtype: str = "none",
    grad_accum: int = 1,
    scaling: str = "strong",
    global_batch: int = 64,
    per_rank_batch: int | None = None,
    compute_only_ms: float | None = None,
    peak_mem_mb: float | None = None,
    p90_ms: float | None = None,
    device: str = "cuda",
    trace: bool = False,
) -> dict:
    """One result row. Strong scaling derives per_rank_batch from global_batch; weak passes per_rank_batch."""
    if per_rank_batch is None:
        per_rank_batch = global_batch // (world_size * grad_accum)
    global_batch = per_rank_batch * world_size * grad_accum
    bucket = "" if bucket_cap_mb is None else bucket_cap_mb
    cell_id = (
        f"{engine}-mlp-tiny-ws{world_size}-b{bucket or 'na'}-{precision}-{comm_dtype}"
        f"-ga{grad_accum}-{scaling}-prb{per_rank_batch}"
    )
    r = {c: "" for c in RESULT_COLUMNS}
    r.update(
        cell_id=cell_id,
        status=status,
        error=error,
        engine=engine,
        model="mlp",
        model_size="tiny",
        world_size=world_size,
        bucket_cap_mb=bucket,
        precision=precision,
        comm_dtype=comm_dtype,
        grad_accum=grad_accum,
        scaling=scaling,
        per_rank_batch=per_rank_batch,
        global_batch=global_batch,
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
    )
    if status == "ok" and step_ms is not None:
        r.update(
            n_timed_steps=20,
            step_time_ms_p50=step_ms,
            step_time_ms_p90=p90_ms or step_ms * 1.1,
            samples_per_s=global_batch / (step_ms / 1e3),
        )
        if compute_only_ms is not None:
            r.update(compute_only_ms_p50=compute_only_ms, exposed_comm_ms=step_ms - compute_only_ms)
        if peak_mem_mb is not None:
            r["peak_mem_mb"] = peak_mem_mb
        if trace:
            r["trace_dir"] = f"traces/{cell_id}"
    return r


def scaling_rows(device: str = "cuda") -> list[dict]:
    """A small sweep whose efficiencies are worked out by hand in tests/test_report.py."""
    d = {"device": device}
    return [
        # strong scaling, global batch 64: torch 100 → 55 → 40 ms; overlap 100 → 52 → 30 ms.
        row("torch", 1, 100.0, compute_only_ms=100.0, peak_mem_mb=1000.0, trace=True, **d),
        row("torch", 2, 55.0, compute_only_ms=50.0, peak_mem_mb=1100.0, trace=True, **d),
        row("torch", 4, 40.0, compute_only_ms=25.0, peak_mem_mb=1200.0, **d),
        row("overlap", 1, 100.0, compute_only_ms=100.0, peak_mem_mb=900.0, **d),
        row("overlap", 2, 52.0, compute_only_ms=50.0, peak_mem_mb=990.0, **d),
        row("overlap", 4, 30.0, compute_only_ms=25.0, peak_mem_mb=1080.0, **d),
        # naive: bucket collapsed (empty); its 4-rank cell ran out of memory.
        row("naive", 1, 110.0, bucket_cap_mb=None, compute_only_ms=110.0, **d),
        row("naive", 2, 80.0, bucket_cap_mb=None, compute_only_ms=55.0, **d),
        row("naive", 4, None, bucket_cap_mb=None, status="oom", error="CUDA out of memory (rank 2)", **d),
        # bucket sweep for overlap at 4 ranks.
        row("overlap", 4, 36.0, bucket_cap_mb=1.0, compute_only_ms=25.0, **d),
        row("overlap", 4, 32.0, bucket_cap_mb=100.0, compute_only_ms=25.0, **d),
        # precision and accumulation at 2 ranks.
        row("torch", 2, 30.0, precision="bf16", compute_only_ms=26.0, **d),
        row("torch", 2, 28.0, precision="bf16", comm_dtype="bf16", compute_only_ms=26.0, **d),
        row("torch", 2, 200.0, grad_accum=4, global_batch=256, compute_only_ms=195.0, **d),
        # weak scaling, per-rank batch 32: torch 50 → 60 ms.
        row("torch", 1, 50.0, scaling="weak", per_rank_batch=32, compute_only_ms=50.0, **d),
        row("torch", 2, 60.0, scaling="weak", per_rank_batch=32, compute_only_ms=50.0, **d),
        # every other failure status, each with its reason.
        row(
            "overlap",
            2,
            None,
            scaling="weak",
            per_rank_batch=32,
            status="timeout",
            error="watchdog: no progress for 300 s",
            **d,
        ),
        row("bucketed", 2, None, status="failed", error="RuntimeError: NCCL error in all_reduce", **d),
        row("bucketed", 4, None, status="diverged", error="loss is nan at step 7", **d),
        row(
            "naive",
            2,
            None,
            bucket_cap_mb=None,
            precision="fp16",
            status="skipped",
            error="fp16 needs a GPU",
            **d,
        ),
    ]


def write_run(run_dir: Path, rows: list[dict], env: dict | None = None) -> Path:
    """Write config.toml, env.json, cells.jsonl and results.csv for `rows`; returns the run folder."""
    env = dict(H100_ENV if env is None else env)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "config.toml").write_text(CONFIG_TOML.format(device=env["device"]))
    (run_dir / "env.json").write_text(json.dumps(env, indent=2))
    with (run_dir / "cells.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps({**r, "step_times_ms": [], "cell": {"cell_id": r["cell_id"]}}) + "\n")
    with (run_dir / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(RESULT_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    for r in rows:
        if r["trace_dir"]:
            (run_dir / r["trace_dir"]).mkdir(parents=True, exist_ok=True)
    return run_dir


def write_traces(trace_root: Path, cell_ids: list[str], ranks: int = 2) -> None:
    """Profile a tiny model as the suite's worker does: one trace per (cell, fake rank), gzipped."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    for cell_id in cell_ids:
        for r in range(ranks):
            handler = tensorboard_trace_handler(
                str(trace_root / cell_id), worker_name=f"rank{r}", use_gzip=True
            )
            with profile(
                activities=[ProfilerActivity.CPU],
                schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                on_trace_ready=handler,
            ) as prof:
                for _ in range(3):
                    opt.zero_grad()
                    model(x).sum().backward()
                    opt.step()
                    prof.step()
