"""PowerSGD's messages and compression compute for one synced backward (torch's powerSGD_hook, read in
torch 2.13's torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py).

Per DDP bucket, each gradient is viewed as a matrix M of n = shape[0] rows and m = the rest; it is
compressed when (n + m)·r · min_compression_rate < n·m (`_should_compress`, rate 2 by default, r =
min(n, m, matrix_approximation_rank)); vectors and matrices not worth it travel uncompressed. The hook then
issues, in order, three all-reduces per bucket (`powerSGD_hook`: the uncompressed tensors, then the Ps,
then the Qs, each chained after the previous one's result):

    uncompressed   Σ n·m of the tensors not compressed          × 4 B (fp32 gradients)
    P              Σ n·r over the compressed matrices           × 4 B
    Q              Σ m·r                                         × 4 B

and computes, per compressed matrix: error feedback M += e (and a copy of the bucket), P = M·Q (2·n·m·r
FLOPs), orthogonalise P (Gram-Schmidt, ≈ 2·n·r² FLOPs), Q = Mᵀ·P (2·n·m·r), decompress M = P·Qᵀ (2·n·m·r),
e = M_old − M. The compression compute is these FLOPs at the rate the model's own step ran
(`model_tflops_per_s` of the base cell): the same GPU, between backward's kernels, so it adds to the step.
The first `start_powerSGD_iter` steps run plain all-reduces (warm-up; bench.engines.torch_ddp), so timed
steps are all compressed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_COMPRESSION_RATE = 2   # PowerSGDState's default min_compression_rate
FP32 = 4


@dataclass(frozen=True)
class Compressed:
    """One synced backward under PowerSGD: message bytes in issue order, with the bucket each belongs to,
    and the compression's FLOPs."""

    messages: tuple[int, ...]
    bucket_of: tuple[int, ...]
    flops: float


def matrix_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """(n, m) of a gradient viewed as tensor.view(shape[0], -1); a scalar is (1, 1)."""
    if not shape:
        return 1, 1
    n = shape[0]
    return n, math.prod(shape[1:]) if len(shape) > 1 else 1


def compress(buckets: list[list[tuple[int, ...]]], rank: int) -> Compressed:
    """The messages and FLOPs of PowerSGD at `rank` over `buckets` (each a list of parameter shapes, in
    the bucket's order)."""
    if rank < 1:
        raise ValueError(f"powersgd_rank={rank} must be >= 1")
    messages, owner, flops = [], [], 0.0
    for index, shapes in enumerate(buckets):
        plain = ps = qs = 0
        for shape in shapes:
            n, m = matrix_of(shape)
            r = min(n, m, rank)
            if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
                ps, qs = ps + n * r, qs + m * r
                flops += 3 * 2 * n * m * r + 2 * n * r * r
            else:
                plain += n * m
        for elements in (plain, ps, qs):
            if elements:
                messages.append(elements * FP32)
                owner.append(index)
    if not messages:
        raise ValueError("no gradients in the buckets")
    return Compressed(tuple(messages), tuple(owner), flops)
