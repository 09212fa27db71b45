"""Start-of-training and per-forward synchronisation: broadcast from rank 0, or verify replicas agree."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def _by_dtype_device(tensors):
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return groups.values()


@torch.no_grad()
def broadcast_from_rank0(tensors: Sequence[torch.Tensor], process_group) -> None:
    """Overwrite `tensors` with the group's rank-0 values: one broadcast per dtype/device, not per tensor."""
    for group in _by_dtype_device(tensors):
        flat = _flatten_dense_tensors(group)
        dist.broadcast(flat, group_src=0, group=process_group)
        for t, src in zip(group, _unflatten_dense_tensors(flat, group)):
            t.copy_(src)


class BufferBroadcast:
    """Rank 0's values of a fixed list of tensors (a module's buffers), on every call.

    The per-forward form of `broadcast_from_rank0`: each dtype/device group keeps one flat buffer and views
    of it shaped like its tensors, so a call is, per group, one foreach copy into the flat buffer (rank 0
    only), one broadcast, and one foreach copy out (the other ranks only): a few Python calls however many
    buffers the module has (a ResNet has three per BatchNorm), where flattening anew and copying tensor by
    tensor cost about twice torch DDP's C++ broadcast_coalesced.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], process_group):
        self.process_group = process_group
        self.is_source = dist.get_rank(process_group) == 0
        self.groups = []
        for group in _by_dtype_device(tensors):
            flat = torch.empty(sum(t.numel() for t in group), dtype=group[0].dtype, device=group[0].device)
            views = [v.view(t.shape) for v, t in zip(flat.split([t.numel() for t in group]), group)]
            self.groups.append((group, flat, views))

    @torch.no_grad()
    def __call__(self) -> None:
        for tensors, flat, views in self.groups:
            if self.is_source:
                torch._foreach_copy_(views, tensors)
            dist.broadcast(flat, group_src=0, group=self.process_group)
            if not self.is_source:
                torch._foreach_copy_(tensors, views)


@torch.no_grad()
def verify_same_as_rank0(named: Sequence[tuple[str, torch.Tensor]], process_group) -> None:
    """Raise ValueError on every rank, naming the first parameter that differs from rank 0's.

    The index of the first mismatch is agreed with a MIN all-reduce, so all ranks raise together
    instead of one rank raising while the others block in their next collective.
    """
    names, tensors = [n for n, _ in named], [t for _, t in named]
    copies = [t.detach().clone() for t in tensors]
    broadcast_from_rank0(copies, process_group)
    first = next((i for i, (a, b) in enumerate(zip(tensors, copies)) if not torch.equal(a, b)), len(tensors))
    device = tensors[0].device if tensors else torch.device("cpu")
    first_t = torch.tensor([first], dtype=torch.int64, device=device)
    dist.all_reduce(first_t, op=dist.ReduceOp.MIN, group=process_group)
    first = int(first_t.item())  # note: a device sync, once, at construction
    if first < len(tensors):
        raise ValueError(
            f"init_sync='verify': parameter {names[first]!r} differs between ranks. Seed every rank "
            f"identically before building the model (torch.manual_seed(...) on every rank), or use "
            f"init_sync='broadcast'."
        )
