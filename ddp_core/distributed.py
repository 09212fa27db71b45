"""DistributedDataParallel: the wrapper, its gradient hooks and the end-of-backward reduction.

The loop is torch's: `loss.backward()` returns with gradients averaged over the process group, then
`optimizer.step()`. Every strategy hooks each parameter with `register_post_accumulate_grad_hook`
(the gradient is final for this backward) and queues one end-of-backward callback per backward:

- naive:    the callback all-reduces each parameter's `.grad`, blocking, one at a time;
- bucketed: the callback launches every flat bucket's all-reduce, then waits for all;
- overlap:  the hook that makes a bucket complete launches its async all-reduce at once (in bucket
            order, as torch's reducer does, so every rank issues collectives in the same order);
            the callback only waits, so communication hides behind the rest of backward.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from .buckets import Bucket, assign_buckets
from .graph import used_parameters
from .labels import label
from .sync import BufferBroadcast, broadcast_from_rank0, verify_same_as_rank0

STRATEGIES = ("naive", "bucketed", "overlap")
INIT_SYNCS = ("broadcast", "verify", "none")
MiB = 1024 * 1024


@dataclass(frozen=True)
class Options:
    """The wrapper's options (torch DDP's names where torch has the option), checked here, in one place.

    strategy: "naive" | "bucketed" | "overlap" (module docstring). bucket_cap_mb / first_bucket_mb:
    bucket caps in MiB (`assign_buckets`). gradient_as_bucket_view: `.grad` is a view into its bucket
    (no copy in or out). broadcast_buffers: buffers broadcast from rank 0 before a forward that follows a
    synchronising one (torch's rule). init_sync: "broadcast" parameters and buffers from rank 0, "verify"
    they already agree (ValueError naming the first that differs), or "none". comm_dtype: float16/bfloat16
    all-reduce, gradients divided by the world size before the cast. find_unused_parameters: walk the
    autograd graph after forward; unused parameters count as ready with their local gradient (zeros
    if None); one no rank used keeps its .grad as it was (None stays None), as torch DDP.
    batched_grad_copy (torch DDP's option of that name, which torch 2.13 has; bucketed and overlap):
    gradients are copied into a bucket with one foreach call and divided with one division when it is
    complete, instead of one fused copy-and-multiply per parameter — fewer calls per parameter (host
    time), one more pass over the bucket's memory.
    """

    strategy: str = "overlap"
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float | None = None
    gradient_as_bucket_view: bool = False
    broadcast_buffers: bool = True
    init_sync: str = "broadcast"
    comm_dtype: torch.dtype | None = None
    find_unused_parameters: bool = False
    batched_grad_copy: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is not one of {STRATEGIES}")
        if self.init_sync not in INIT_SYNCS:
            raise ValueError(f"init_sync={self.init_sync!r} is not one of {INIT_SYNCS}")
        if self.comm_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(f"comm_dtype={self.comm_dtype!r} must be None, torch.float16 or torch.bfloat16")


class DistributedDataParallel(nn.Module):
    """Data parallelism over `process_group` (default: WORLD); see docs/design.md for the contract.

    The options are `Options`' fields, given as keywords as to torch's DDP
    (`DistributedDataParallel(module, strategy="bucketed", bucket_cap_mb=25)`) or as one `Options` value
    (keywords beside it replace its fields); `self.options` holds them.

    `last_sync_wait_ms` is host time (time.perf_counter) the end-of-backward callback spent reducing
    or waiting; on CUDA it is the time to *enqueue* that work, not device time (no sync is added).
    """

    def __init__(self, module: nn.Module, options: Options | None = None, *, process_group=None, **keywords):
        super().__init__()
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"options={options!r}: an Options value; give the others as keywords")
        opts = replace(options, **keywords) if options is not None else Options(**keywords)
        self.module, self.options = module, opts
        self.strategy, self.comm_dtype = opts.strategy, opts.comm_dtype
        self._launch_early = opts.strategy == "overlap"
        self.gradient_as_bucket_view = opts.gradient_as_bucket_view
        self.batched_grad_copy = opts.batched_grad_copy
        self.broadcast_buffers = opts.broadcast_buffers
        self.find_unused_parameters = opts.find_unused_parameters
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.process_group)
        self.require_backward_grad_sync = True
        # torch's rule: buffers are broadcast before a forward only when the previous forward was one
        # whose backward synchronises (set after each forward, as torch's _post_forward does)
        self.require_forward_param_sync = True
        self.last_sync_wait_ms: float | None = None

        # Registration order, a shared parameter once (named_parameters de-duplicates); frozen
        # parameters take no part in the reduction (no hook, no bucket slot) but are still broadcast.
        named = list(module.named_parameters())
        self._named_params = [(n, p) for n, p in named if p.requires_grad]
        self._buffers_list = list(module.buffers())

        state = [p for _, p in named] + self._buffers_list
        if opts.init_sync == "broadcast" and state:
            broadcast_from_rank0([t.data for t in state], self.process_group)
        elif opts.init_sync == "verify":
            verify_same_as_rank0([(n, p.data) for n, p in named], self.process_group)

        self._buffer_sync = BufferBroadcast(self._buffers_list, self.process_group)
        self._bucket_caps_mb = (opts.bucket_cap_mb, opts.first_bucket_mb)
        self._build_buckets(list(reversed(range(len(self._named_params)))))
        # torch's reducer rebuilds its buckets once, in the order gradients became ready in the first synced
        # backward (should_rebuild_buckets: not with find_unused_parameters; only at world size > 1): a model
        # whose modules are registered in another order than they run would otherwise fill its first
        # bucket last and overlap nothing. Until then the hooks record that order.
        self._rebuild_pending = (opts.strategy != "naive" and not opts.find_unused_parameters
                                 and self.world_size > 1)
        self._ready_order: list[int] | None = None
        self._sync_this_backward = False  # decided at forward, like torch's prepare_for_backward
        self._backward = _BackwardState(len(self._named_params))
        # gradient produced since the last synced backward, no_sync micro-steps included (torch's
        # local_used_map_: its autograd hooks mark use in no_sync backwards too)
        self._used = [False] * len(self._named_params)
        # The hooks hold a weak reference: a strong one would make a cycle through autograd's C++ hook
        # registry (parameter → hook → wrapper → module → parameter) that Python's collector cannot see,
        # so a dropped wrapper would never be freed, with its buckets and (on GPU) its memory.
        self._hooks = [
            p.register_post_accumulate_grad_hook(_ready_hook(weakref.ref(self), i))
            for i, (_, p) in enumerate(self._named_params)
        ]

    def close(self) -> None:
        """Remove the gradient hooks: the wrapped module trains on without DDP (the wrapper is freed when
        dropped even without close(); hooks left behind by a dropped wrapper do nothing)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # ---- construction -------------------------------------------------------------------------------

    def _build_buckets(self, order: list[int]):
        """Flat buckets over the parameters in `order` (indices into the registration order: reversed at
        construction, the gradient-ready order at the rebuild); naive reports one 'bucket' per parameter.
        With gradient_as_bucket_view a defined .grad is copied into its new view and becomes it."""
        bucket_cap_mb, first_bucket_mb = self._bucket_caps_mb
        params = [self._named_params[i][1] for i in order]
        sizes = [p.numel() * p.element_size() for p in params]
        self.buckets: list[Bucket] = []
        self._slot: list[tuple[Bucket, int] | None] = [None] * len(self._named_params)
        if self.strategy == "naive":
            groups = [[j] for j in range(len(order))]
        else:
            first_cap = None if first_bucket_mb is None else max(1, int(first_bucket_mb * MiB))
            cap = max(1, int(bucket_cap_mb * MiB))
            groups = assign_buckets(sizes, cap, first_cap, keys=[(p.dtype, p.device) for p in params])
        self.bucket_sizes_bytes = [sum(sizes[j] for j in g) for g in groups]
        self.bucket_param_names = [[self._named_params[order[j]][0] for j in g] for g in groups]
        if self.strategy == "naive":
            return
        self._bucket_members: list[list[int]] = []  # bucket -> its parameters' indices, in bucket order
        for b, group in enumerate(groups):
            idx = [order[j] for j in group]
            bucket = Bucket(
                b,
                [self._named_params[i][1] for i in idx],
                [self._named_params[i][0] for i in idx],
                self.comm_dtype,
                self.process_group,
                world_size=self.world_size,
                as_view=self.gradient_as_bucket_view,
                batched=self.batched_grad_copy,
            )
            self.buckets.append(bucket)
            self._bucket_members.append(idx)
            for j, i in enumerate(idx):
                self._slot[i] = (bucket, j)
                p = self._named_params[i][1]
                if self.gradient_as_bucket_view and p.grad is not None:  # .grad lives in the bucket from now
                    bucket.views[j].copy_(p.grad)  # on; an undefined one stays None (torch does the same)
                    p.grad = bucket.views[j]

    # ---- forward ------------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        """Sync buffers from rank 0 (unless the previous forward ran under no_sync or without grad, as
        torch DDP), run the module, and prepare the next backward to reduce gradients."""
        if (self.broadcast_buffers and self.require_forward_param_sync and self.world_size > 1
                and self._buffers_list):
            self._buffer_sync()
        if self._ready_order is not None and torch.is_grad_enabled():
            self._rebuild_buckets()
        with label("ddp_core.forward"):
            output = self.module(*args, **kwargs)
        self._sync_this_backward = torch.is_grad_enabled() and self.require_backward_grad_sync
        self.require_forward_param_sync = self._sync_this_backward
        if self._sync_this_backward:
            self._prepare_for_backward(output)
        return output

    def _prepare_for_backward(self, output):
        self._backward = _BackwardState(len(self._named_params))
        for bucket in self.buckets:
            bucket.reset()
        if self.find_unused_parameters:
            used = used_parameters(output)
            self._backward.unused = [i for i, (_, p) in enumerate(self._named_params) if id(p) not in used]

    def _rebuild_buckets(self):
        """Once, before the forward that follows the first synced backward (torch's _rebuild_buckets, called
        there to keep peak memory down): buckets in that backward's gradient-ready order. Rank 0's order is
        broadcast so that every rank builds the same buckets (torch's sync_bucket_indices)."""
        device = self._named_params[0][1].device
        order = torch.tensor(self._ready_order, dtype=torch.int64, device=device)
        dist.broadcast(order, group_src=0, group=self.process_group)
        self._build_buckets(order.tolist())  # note: a device-to-host copy, once in a training run
        self._rebuild_pending, self._ready_order = False, None

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the first backward after the block reduces the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:  # an exception inside the block must not leave sync switched off
            self.require_backward_grad_sync = old

    # ---- backward: hooks ----------------------------------------------------------------------------

    def _mark_ready(self, i):
        """Gradient i is final: put it in its bucket; launch complete buckets in order (overlap)."""
        state = self._backward
        if not state.callback_queued:
            state.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            for u in state.unused:  # as torch's reducer: unused parameters are ready at the first hook
                self._mark_ready(u)
        if state.ready[i]:
            name = self._named_params[i][0]
            raise RuntimeError(f"ddp_core: parameter {name!r} was marked ready twice in one backward")
        state.ready[i] = True
        state.ready_count += 1
        if self._rebuild_pending:
            state.order.append(i)
        slot = self._slot[i]  # None for naive: it reduces .grad itself at the end
        if slot is not None and slot[0].add(slot[1]) and self._launch_early:
            self._launch_complete_buckets()

    def _launch_complete_buckets(self):
        """overlap: launch every complete bucket not yet launched, in bucket order, stopping at the first
        incomplete one (as torch's reducer: every rank then issues its collectives in the same order)."""
        buckets, state = self.buckets, self._backward
        while state.next_bucket < len(buckets) and buckets[state.next_bucket].pending == 0:
            buckets[state.next_bucket].launch()
            state.next_bucket += 1

    # ---- backward: end-of-backward callback ---------------------------------------------------------

    def _finalize(self):
        """Runs once when autograd finishes: reduce (naive, bucketed) or wait (overlap), write back."""
        start = time.perf_counter()
        self._sync_this_backward = False
        state = self._backward
        missing = [] if state.ready_count == len(state.ready) else [
            self._named_params[i][0] for i, r in enumerate(state.ready) if not r]
        with label("ddp_core.wait"):
            if self.strategy == "naive":
                if missing:
                    raise self._unused_error(missing)
                self._reduce_each_parameter(self._globally_unused())
            else:
                launched = state.next_bucket
                if not missing:
                    for bucket in self.buckets[launched:]:
                        bucket.launch()
                unused = self._globally_unused() if not missing else set()
                for b, bucket in enumerate(self.buckets[: len(self.buckets) if not missing else launched]):
                    bucket.wait()  # also when raising: leave no collective in flight
                    if not missing:  # as torch's finalize_backward: while later buckets still reduce
                        self._copy_out(b, unused)
                if missing:
                    raise self._unused_error(missing)
                if self._rebuild_pending and self._ready_order is None:
                    self._ready_order = state.order  # the rebuild waits for the next forward
        self._used = [False] * len(self._named_params)  # the next accumulation window starts
        self.last_sync_wait_ms = (time.perf_counter() - start) * 1e3

    def _globally_unused(self) -> set[int]:
        """With find_unused_parameters: the parameters whose gradient no rank produced since the last
        synced backward (no_sync micro-steps included: torch's local_used_map_, all-reduced). Their .grad
        is left as it is — None stays None, a gradient accumulated under no_sync stays local — as torch's
        reducer leaves it (copy_bucket_to_grad with global_unused). AdamW skips a None gradient but decays
        a zero one, so this matters."""
        if not self.find_unused_parameters:
            return set()
        device = self._named_params[0][1].device
        used = torch.tensor(self._used, dtype=torch.int32, device=device)
        dist.all_reduce(used, op=dist.ReduceOp.MAX, group=self.process_group)
        return {i for i, u in enumerate(used.tolist()) if not u}  # note: a device-to-host copy

    def _reduce_each_parameter(self, unused: set[int]):
        """naive: one blocking all-reduce per parameter, in registration order (globally unused ones,
        which every rank skips alike, keep their gradient untouched)."""
        for i, (name, p) in enumerate(self._named_params):
            if i in unused:
                continue
            if p.grad is None:  # unused here, used on another rank: this rank contributes zeros
                p.grad = torch.zeros_like(p)
            with label(f"ddp_core.allreduce.param.{name}"):
                p.grad.div_(self.world_size)
                if self.comm_dtype is None:
                    dist.all_reduce(p.grad, group=self.process_group)
                else:
                    wire = p.grad.to(self.comm_dtype)
                    dist.all_reduce(wire, group=self.process_group)
                    p.grad.copy_(wire)

    def _copy_out(self, b: int, unused: set[int]):
        """Bucket b's reduced slices into `.grad` (Bucket.copy_out); globally unused parameters are left
        as they are."""
        skip = {j for j, i in enumerate(self._bucket_members[b]) if i in unused} if unused else ()
        self.buckets[b].copy_out(skip)

    def _unused_error(self, missing):
        return RuntimeError(
            f"ddp_core: parameters received no gradient in this backward: {missing}. Their buckets can "
            f"never be reduced. Pass find_unused_parameters=True to DistributedDataParallel, or make "
            f"every forward output that depends on them take part in the loss."
        )


class _BackwardState:
    """What the current synced backward has seen. A plain object, not attributes of the wrapper: the
    hooks update it once per parameter, and nn.Module.__setattr__ costs microseconds per call."""

    __slots__ = ("ready", "ready_count", "callback_queued", "next_bucket", "unused", "order")

    def __init__(self, num_params: int):
        self.ready = [False] * num_params  # this parameter's gradient is in its bucket (or reduced)
        self.ready_count = 0
        self.callback_queued = False  # the end-of-backward callback is queued
        self.next_bucket = 0  # overlap: the first bucket not yet launched
        self.unused: list[int] = []  # find_unused_parameters: not reached from this forward's outputs
        self.order: list[int] = []  # parameters in the order their gradients became ready (for the rebuild)


def _ready_hook(wrapper_ref: weakref.ref, i: int):
    """The post-accumulate-grad hook of parameter i: marks it ready when this backward synchronises.
    It holds the wrapper weakly (see DistributedDataParallel.__init__) and does nothing once it is gone."""

    def hook(param):
        wrapper = wrapper_ref()
        if wrapper is None:
            return
        wrapper._used[i] = True
        if wrapper._sync_this_backward:
            wrapper._mark_ready(i)

    return hook
