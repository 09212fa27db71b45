"""Bucket assignment (a pure function) and the flat gradient Bucket that one all-reduce serves."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

import torch
import torch.distributed as dist
from torch.profiler import record_function


def assign_buckets(
    sizes_bytes: Sequence[int],
    cap_bytes: int,
    first_cap_bytes: int | None = None,
    keys: Sequence[Hashable] | None = None,
) -> list[list[int]]:
    """Group tensor indices into buckets of about `cap_bytes`, in the order given.

    The caller passes parameters in reverse registration order (roughly the order backward produces
    their gradients). The rule is torch's `compute_bucket_assignment_by_size` (reducer.cpp), so both
    engines reduce the same messages: a tensor joins the open bucket of its key, and the bucket closes
    once it holds `cap_bytes` or more. A tensor is never split, so a bucket overshoots the cap by less
    than its last tensor; a tensor larger than the cap closes the bucket it joins. `keys` (e.g. (dtype,
    device)) keeps one open bucket per key, so a bucket holds one dtype. When `first_cap_bytes` is given,
    the first bucket of each key closes at it instead: a small first bucket starts communication early
    (torch: "Experiments showed 1MB is a reasonable value"). Buckets come back sorted by their first
    index, so bucket 0 is the first one backward fills.
    """
    if cap_bytes <= 0:
        raise ValueError(f"cap_bytes={cap_bytes} must be positive")
    keys = keys if keys is not None else [None] * len(sizes_bytes)
    open_buckets: dict[Hashable, tuple[list[int], int]] = {}  # key -> (indices, bytes)
    closed_per_key: dict[Hashable, int] = {}
    done: list[list[int]] = []

    def cap_for(key):
        first = closed_per_key.get(key, 0) == 0 and first_cap_bytes is not None
        return first_cap_bytes if first else cap_bytes

    def close(key):
        done.append(open_buckets.pop(key)[0])
        closed_per_key[key] = closed_per_key.get(key, 0) + 1

    for i, (size, key) in enumerate(zip(sizes_bytes, keys)):
        indices, total = open_buckets.get(key, ([], 0))
        open_buckets[key] = (indices + [i], total + size)
        if total + size >= cap_for(key):
            close(key)
    for key in list(open_buckets):
        close(key)
    return sorted(done, key=lambda b: b[0])


def dense_non_overlapping(t: torch.Tensor) -> bool:
    """The tensor's elements fill its memory exactly once in some order of its dimensions (contiguous,
    channels_last and every other permutation of a contiguous layout)."""
    expected = 1
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _view_like(flat: torch.Tensor, offset: int, param: torch.Tensor) -> torch.Tensor:
    """Parameter's slice of `flat` with the parameter's strides when its layout is dense (torch's reducer,
    initialize_bucket_views: autograd then makes gradients in that layout and the gradient layout contract
    holds, e.g. channels_last convolutions), else a C-contiguous view."""
    if dense_non_overlapping(param):
        return flat.as_strided(param.shape, param.stride(), offset)
    return flat[offset:offset + param.numel()].view(param.shape)


class Bucket:
    """One flat gradient buffer for some parameters of one dtype and device, reduced by one all-reduce.

    `views[j]` is parameter j's slice of `flat`, shaped and strided like it: with gradient_as_bucket_view the
    parameter's `.grad` *is* that view; otherwise gradients are copied in and the result copied out.
    With a `comm_dtype`, the (pre-divided) bucket is cast to a separate buffer for the wire.
    """

    def __init__(self, index, params, names, comm_dtype, process_group):
        self.index, self.params, self.names = index, params, names
        self.process_group = process_group
        numels = [p.numel() for p in params]
        self.flat = torch.zeros(sum(numels), dtype=params[0].dtype, device=params[0].device)
        offsets = [0, *itertools.accumulate(numels)][:-1]
        self.views = [_view_like(self.flat, o, p) for o, p in zip(offsets, params)]
        wire = comm_dtype not in (None, self.flat.dtype)
        self.comm = torch.empty_like(self.flat, dtype=comm_dtype) if wire else None
        self.size_bytes = self.flat.numel() * self.flat.element_size()
        self.pending = len(params)
        self.work = None

    def reset(self):
        """Make the bucket wait for all its gradients again (called before each synced backward)."""
        self.pending, self.work = len(self.params), None

    def launch(self):
        """Cast for the wire if asked and start an async SUM all-reduce of the bucket.

        The gradients were already divided by the world size as they entered the bucket (as torch's
        reducer does): dividing before the reduction keeps a float16 sum from overflowing.
        """
        with record_function(f"ddp_core.allreduce.bucket{self.index}"):
            buf = self.flat if self.comm is None else self.comm.copy_(self.flat)
            self.work = dist.all_reduce(buf, group=self.process_group, async_op=True)

    def wait(self):
        """Wait for the all-reduce and bring a compressed result back into the parameter dtype."""
        self.work.wait()
        if self.comm is not None:
            self.flat.copy_(self.comm)
        self.work = None
