"""Hand-built traces for the idle-time breakdown, the launch statistics and the stragglers; times in µs.

IDLE: two steps [0,100) and [100,200); on stream 7 K1 [10,20] (launched at 2), K2 [25,30] (at 5), K3 [80,90]
(at 8), K4 [125,135] (at 120, step 2); on the NCCL stream one all-reduce [40,75] (at 9), longer than
stream 7's kernels together. Each launch call
lasts 2 µs.
HOST_BOUND: one step [0,100); ten 1 µs kernels, kernel i launched at 10i+1 and run at [10i+9, 10i+10]: the
GPU finishes each one long before the host asks for the next.
GPU_BOUND: one step [0,100); the host launches ten 10 µs kernels at 2i (i < 10); they run back to back from 5.
two_rank_events(rank): three steps of 100 µs; each step a backward [10,60] that issues two bucket
all-reduces, the last of which ends at 90 on both ranks; rank 1 joins it later in steps 1 and 3, rank 0 in
step 2 (JOIN below).
"""

from __future__ import annotations

from analyze_fixtures import COMM_STREAM, STREAM, kernel, runtime, x

GEMM = "ampere_sgemm_128x64_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def k(ts, dur, corr, stream=STREAM, name=GEMM):
    return kernel(name, ts, dur, corr, 1.0, 50, stream=stream)


def idle_events() -> list[dict]:
    return [
        x("ProfilerStep#1", "user_annotation", 0, 100), x("ProfilerStep#2", "user_annotation", 100, 100),
        runtime(2, 1), runtime(5, 2), runtime(8, 3), runtime(9, 4), runtime(120, 5),
        k(10, 10, 1), k(25, 5, 2), k(80, 10, 3), k(40, 35, 4, COMM_STREAM, NCCL), k(125, 10, 5),
    ]


def host_bound_events() -> list[dict]:
    ev = [x("ProfilerStep#1", "user_annotation", 0, 100)]
    for i in range(10):
        ev += [runtime(10 * i + 1, i + 1), k(10 * i + 9, 1, i + 1)]
    return ev


def gpu_bound_events() -> list[dict]:
    ev = [x("ProfilerStep#1", "user_annotation", 0, 100)]
    for i in range(10):
        ev += [runtime(2 * i, i + 1), k(5 + 10 * i, 10, i + 1)]
    return ev


# (rank, step) → start of the rank's last all-reduce kernel within the step; it ends at 90 on both ranks
JOIN = {(0, 1): 55, (1, 1): 75, (0, 2): 70, (1, 2): 62, (0, 3): 50, (1, 3): 80}


def two_rank_events(rank: int) -> list[dict]:
    ev = []
    for step in (1, 2, 3):
        t0, c = 100 * (step - 1), 10 * step
        ev += [
            x(f"ProfilerStep#{step}", "user_annotation", t0, 100),
            x("backward", "user_annotation", t0 + 10, 50),
            x("c10d::allreduce_", "cpu_op", t0 + 20, 4), runtime(t0 + 21, c + 1),
            k(t0 + 30, 10, c + 1, COMM_STREAM, NCCL),
            x("c10d::allreduce_", "cpu_op", t0 + 50, 4), runtime(t0 + 51, c + 2),
            k(t0 + JOIN[rank, step], 90 - JOIN[rank, step], c + 2, COMM_STREAM, NCCL),
        ]
    return ev
