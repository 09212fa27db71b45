"""Bucket assignment (a pure function) and the flat gradient Bucket that one all-reduce serves."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

import torch
import torch.distributed as dist

from .labels import label


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


def _scalar_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which a CPU scalar multiplies a tensor of `dtype` without a cast of its own: the
    tensor's when it is float32 or float64; float32 for float16/bfloat16 (their kernels compute in float32
    and read the scalar from its original value, so 1/world_size rounds as torch's double scalar does)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


class Bucket:
    """One flat gradient buffer for some parameters of one dtype and device, reduced by one all-reduce.

    `views[j]` is parameter j's slice of `flat`, shaped and strided like it: with gradient_as_bucket_view the
    parameter's `.grad` *is* that view; otherwise gradients are copied in and the result copied out.
    With a `comm_dtype`, the (pre-divided) bucket is cast to a separate buffer for the wire.
    """

    def __init__(self, index, params, names, comm_dtype, process_group, world_size=1, as_view=False,
                 batched=False):
        self.index, self.params, self.names = index, params, names
        self.process_group, self.world_size, self.as_view = process_group, world_size, as_view
        self.batched = batched  # torch's batched_grad_copy: copies deferred to one foreach call at launch
        numels = [p.numel() for p in params]
        self.flat = torch.zeros(sum(numels), dtype=params[0].dtype, device=params[0].device)
        offsets = [0, *itertools.accumulate(numels)][:-1]
        self.views = [_view_like(self.flat, o, p) for o, p in zip(offsets, params)]
        wire = comm_dtype not in (None, self.flat.dtype)
        self.comm = torch.empty_like(self.flat, dtype=comm_dtype) if wire else None
        self.size_bytes = self.flat.numel() * self.flat.element_size()
        # 1/world_size as a CPU 0-dim tensor: torch.mul(grad, it, out=view) rounds as torch's reducer does
        # (mul_out by a wrapped 1/div_factor), without the ~1.6 µs it costs to wrap a Python float each call
        self.inverse_world_size = torch.tensor(1.0 / world_size, dtype=_scalar_dtype(self.flat.dtype))
        self.pending, self.work, self.undivided, self.deferred = len(params), None, [], []
        self.label = f"ddp_core.allreduce.bucket{index}"
        self.allreduce_options = dist.AllreduceOptions()  # SUM, asynchronous

    def reset(self):
        """Make the bucket wait for all its gradients again (called before each synced backward)."""
        self.pending, self.work, self.undivided, self.deferred = len(self.params), None, [], []

    def add(self, j: int) -> bool:
        """Parameter j's gradient is final: bring it into the bucket divided by the world size; True when
        it was the last one the bucket waited for.

        The arithmetic is torch's reducer's (mark_variable_ready_dense): a gradient outside the bucket is
        multiplied by 1/world_size on its way in (one pass: copy and division fused); one autograd already
        accumulated into its view (gradient_as_bucket_view) is divided in place, here once for the whole
        bucket at launch instead of once per parameter; an unused parameter without a gradient adds zeros.
        With `batched` (torch's batched_grad_copy) a gradient outside the bucket is only noted here: the
        bucket copies all of them with one foreach call and divides itself once at launch.
        """
        param, view = self.params[j], self.views[j]
        grad = param.grad
        if grad is None:
            view.zero_()
        elif self.as_view and (grad is view or grad.data_ptr() == view.data_ptr()):
            self.undivided.append(view)  # (copy mode never lets autograd accumulate into the bucket)
        elif self.batched:
            self.deferred.append(j)
        else:  # copy mode, or set_to_none=True made autograd allocate a fresh .grad
            if self.world_size == 1:
                view.copy_(grad)
            else:
                torch.mul(grad, self.inverse_world_size, out=view)
            if self.as_view:  # an unused parameter without a gradient gets one only if a rank used it
                param.grad = view
        self.pending -= 1
        return self.pending == 0

    def launch(self):
        """Cast for the wire if asked and start an async SUM all-reduce of the bucket.

        The gradients were divided by the world size as they entered the bucket (as torch's reducer does):
        dividing before the reduction keeps a float16 sum from overflowing.
        """
        with label(self.label):
            self._complete()
            buf = self.flat if self.comm is None else self.comm.copy_(self.flat)
            # the process group's own allreduce, not dist.all_reduce: the same c10d op without the Python
            # wrapper's checks, which cost ~60 µs per call when a hook runs cold (ddp_core/labels.py)
            self.work = self.process_group.allreduce([buf], self.allreduce_options)

    def _complete(self):
        """The bucket's last step before its all-reduce. Batched: the deferred copies in one foreach call
        and one division of the whole bucket, in-place gradients included (torch's flush_deferred_copies,
        which divides rather than multiplies). Otherwise: divide the gradients autograd accumulated into
        their views (torch: bucket_view.div_), with one call when that is all of them."""
        if self.batched:
            if self.deferred:
                views = [self.views[j] for j in self.deferred]
                torch._foreach_copy_(views, [self.params[j].grad for j in self.deferred])
                if self.as_view:  # .grad lives in the bucket from now on
                    for j, view in zip(self.deferred, views):
                        self.params[j].grad = view
            if self.world_size != 1:
                self.flat.div_(self.world_size)
        elif self.undivided and self.world_size != 1:
            if len(self.undivided) == len(self.views):
                self.flat.div_(self.world_size)  # one call instead of one per parameter; the same values
            else:
                for view in self.undivided:
                    view.div_(self.world_size)
        self.undivided, self.deferred = [], []

    def copy_out(self, skip=()) -> None:
        """Copy mode: the reduced slices into `.grad` (one foreach call for the bucket when every gradient is
        defined); view mode: `.grad` becomes the view where it is still undefined. `skip`: positions of
        globally unused parameters, whose `.grad` is left as it is."""
        if not self.as_view and not skip:
            grads = [p.grad for p in self.params]
            if all(g is not None for g in grads):
                torch._foreach_copy_(grads, self.views)
                return
        for j, (p, view) in enumerate(zip(self.params, self.views)):
            if j in skip:
                continue
            if self.as_view:
                if p.grad is None:
                    p.grad = view
            elif p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)

    def wait(self):
        """Wait for the all-reduce and bring a compressed result back into the parameter dtype."""
        self.work.wait()
        if self.comm is not None:
            self.flat.copy_(self.comm)
        self.work = None
