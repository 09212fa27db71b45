"""Tiny Kineto-style traces written by hand for the analyze tests; times in µs, chosen to be worked on paper.

GPU_EVENTS: two profiler steps on one host thread; in step 1 a GEMM [10,40], an NCCL all-reduce [30,60],
an elementwise kernel [50,70] and a memcpy [80,90]; in step 2 a GEMM [180,230] launched at 150 (it runs
past the step's end). CPU_EVENTS: one step; a gloo barrier [10,50] and a gloo all-reduce [420,700] on
gloo's threads; on the main thread operators, a ddp_core bucket launch and wait inside `backward`.
The expected values are worked out in tests/test_analyze.py next to each assertion.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HOST, MAIN = 1, 1
GPU, STREAM, COMM_STREAM = 0, 7, 20


def x(name: str, cat: str, ts: float, dur: float, pid=HOST, tid=MAIN, **args) -> dict:
    """One complete event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def runtime(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict:
    return x(name, "cuda_runtime", ts, 2, correlation=corr)


def kernel(name: str, ts: float, dur: float, corr: int, bps: float, occ: float, stream=STREAM) -> dict:
    return x(name, "kernel", ts, dur, pid=GPU, tid=stream, correlation=corr, stream=stream,
             **{"blocks per SM": bps, "est. achieved occupancy %": occ})


def gpu_events(launch: str = "cudaLaunchKernel",
               allreduce: str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"):
    return [
        x("ProfilerStep#1", "user_annotation", 0, 100),
        x("ProfilerStep#2", "user_annotation", 100, 100),
        x("aten::mm", "cpu_op", 5, 10),
        runtime(6, 1, launch),
        x("backward", "user_annotation", 18, 50),
        x("c10d::allreduce_", "cpu_op", 19, 4),
        x("record_param_comms", "cpu_op", 19, 3, **{"Collective name": "allreduce", "dtype": "Float",
                                                     "In msg nelems": 1000, "Out msg nelems": 1000,
                                                     "Group size": 4}),
        runtime(20, 2, launch),
        runtime(25, 3, launch),
        runtime(30, 4, "cudaMemcpyAsync"),
        runtime(150, 5, launch),
        kernel("ampere_sgemm_128x64_nn", 10, 30, 1, 0.5, 40),
        kernel(allreduce, 30, 30, 2, 0.25, 10, stream=COMM_STREAM),
        kernel("void at::native::vectorized_elementwise_kernel<4>(int)", 50, 20, 3, 2.0, 80),
        x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 80, 10, pid=GPU, tid=STREAM, correlation=4),
        kernel("ampere_sgemm_128x64_nn", 180, 50, 5, 1.0, 50),
    ]


CPU_MAIN, GLOO_A, GLOO_B = 10, 11, 12


def cpu_events(with_steps: bool = True) -> list[dict]:
    c = lambda name, ts, dur, cat="cpu_op", tid=CPU_MAIN, **a: x(name, cat, ts, dur, pid=10, tid=tid, **a)
    steps = [c("ProfilerStep#5", 0, 1000, "user_annotation")] if with_steps else []
    return steps + [
        c("gloo:barrier", 10, 40, "user_annotation", tid=GLOO_A),
        c("aten::linear", 100, 200),
        c("backward", 300, 600, "user_annotation"),
        c("autograd::engine::evaluate_function: AddmmBackward0", 310, 190),
        c("ddp_core.allreduce.bucket0", 400, 50, "user_annotation"),
        c("c10d::allreduce_", 410, 30),
        c("gloo:all_reduce", 420, 280, "user_annotation", tid=GLOO_B,
          **{"Input Dims": [[1000]], "Input type": ["float"]}),
        c("ddp_core.wait", 600, 280, "user_annotation"),
        c("aten::copy_", 850, 20),
        c("aten::add_", 920, 40),
    ]


CPU_META = {"distributedInfo": {"backend": "gloo", "world_size": 2,
                                "pg_config": [{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]}}
GPU_META = {"distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4},
            "deviceProperties": [{"id": 0}]}


def write_trace(path: Path, events: list[dict], meta: dict | None = None, shift: float = 0.0) -> Path:
    """Write a trace (gzipped when the name ends .gz), every timestamp moved by `shift` µs."""
    events = [{**e, "ts": e["ts"] + shift} for e in events]
    doc = {"schemaVersion": 1, **(meta or {}), "traceEvents": events}
    data = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path
