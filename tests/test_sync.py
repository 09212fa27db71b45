"""BufferBroadcast, the per-forward buffer sync: rank 0's values reach every rank, call after call, for
every dtype and layout a module's buffers come in (two real gloo processes)."""

from __future__ import annotations

import torch
from dist_utils import run_distributed

from ddp_core.sync import BufferBroadcast


def broadcast_twice(rank, world_size):
    import torch.distributed as dist

    base = 10.0 * (rank + 1)  # rank 0 holds 10s, rank 1 holds 20s
    buffers = [
        torch.full((3,), base),                          # float32 (BatchNorm running stats)
        torch.tensor(int(base), dtype=torch.int64),      # int64 0-dim (num_batches_tracked)
        torch.full((2, 3), base).t(),                    # non-contiguous
        torch.full((2,), base, dtype=torch.float64),
        torch.tensor([rank == 0, rank == 1]),            # bool
    ]
    sync = BufferBroadcast(buffers, dist.group.WORLD)
    strides = [b.stride() for b in buffers]
    sync()
    first = [b.clone() for b in buffers]
    for b in buffers:  # rank 0 moves on (a BatchNorm forward): the next call must carry the new values
        if rank == 0:
            b.logical_not_() if b.dtype == torch.bool else b.add_(1)
    sync()
    return first, [b.clone() for b in buffers], strides == [b.stride() for b in buffers]


def test_rank_zeros_buffers_reach_every_rank_on_every_call():
    (first0, second0, kept0), (first1, second1, kept1) = run_distributed(broadcast_twice, 2)
    for a, b in zip(first0, first1):
        assert torch.equal(a, b) and a.dtype == b.dtype
    assert first1[0].tolist() == [10.0] * 3 and first1[1].item() == 10 and first1[4].tolist() == [True, False]
    for a, b in zip(second0, second1):
        assert torch.equal(a, b)
    assert second1[0].tolist() == [11.0] * 3 and second1[1].item() == 11
    assert second1[4].tolist() == [False, True]
    assert kept0 and kept1  # buffers are written in place, their layout untouched
