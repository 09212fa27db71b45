"""Parity: ddp_core equals one process on the global batch, and torch's DDP, step after step.

torch's DDP test pattern: the reference model steps on the global batch, each DDP replica on its
rank's slice, inputs reshuffled every step (same permutation on every rank), parameters compared
after every step, buckets made tiny (bucket_cap_mb=0.001, and 0.0005 below the largest weight) so the
multi-bucket paths run, and the bucket layout checked against torch's rebuilt one. One spawn per
world size loops over every combination and reports each failing one by name.

Tolerance: rtol=1e-5, atol=1e-6. All three compute in float32 but sum in different orders (the
reference reduces the global batch inside one matmul; DDP sums per-rank means after dividing each by
the world size), which moves results by a few float32 ulps (eps 2^-23 ≈ 1.2e-7) per step; three SGD
steps of lr 0.1 keep that well under 1e-5 relative.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import itertools

import pytest
import torch
import torch.distributed as dist
from dist_utils import assert_no_rank_errors
from torch import nn

from ddp_core import DistributedDataParallel

RTOL, ATOL = 1e-5, 1e-6
# 0.001 MiB (the tiny cap of torch's tests): several small buckets; 0.0005 MiB: the 16x16 weight (1 KiB) is
# larger than the cap and closes the bucket it joins; 25 MiB: torch's default, one bucket.
CAPS_MB = (0.0005, 0.001, 25)
STEPS, PER_RANK_BATCH, LR = 3, 4, 0.1


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def mismatches(tag, model_a, model_b) -> list[str]:
    """Names (with max difference) of parameters that are not close."""
    out = []
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        if not torch.allclose(a, b, rtol=RTOL, atol=ATOL):
            out.append(f"{tag}: {name} max|diff|={(a - b).abs().max().item():.3g}")
    return out


def check_parity(rank, world_size, strategy, cap_mb, as_view) -> list[str]:
    """Step reference, torch DDP and ddp_core side by side; return a description of every mismatch."""
    reference = make_model()
    ours = DistributedDataParallel(
        copy.deepcopy(reference), strategy=strategy, bucket_cap_mb=cap_mb, gradient_as_bucket_view=as_view
    )
    theirs = nn.parallel.DistributedDataParallel(
        copy.deepcopy(reference), bucket_cap_mb=cap_mb, gradient_as_bucket_view=as_view
    )
    models = (reference, ours, theirs)
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    gen = torch.Generator().manual_seed(1)  # identical on every rank: same global batch, same shuffle
    x_all = torch.randn(PER_RANK_BATCH * world_size, 8, generator=gen)
    y_all = torch.randn(PER_RANK_BATCH * world_size, 3, generator=gen)
    tag = f"world={world_size} strategy={strategy} cap={cap_mb} view={as_view}"
    errors = []
    for step in range(STEPS):
        perm = torch.randperm(len(x_all), generator=gen)
        x_all, y_all = x_all[perm], y_all[perm]
        mine = slice(rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH)
        for model, opt in zip(models, opts):
            opt.zero_grad()
            x, y = (x_all, y_all) if model is reference else (x_all[mine], y_all[mine])
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        errors += mismatches(f"{tag} step={step} vs single process", ours.module, reference)
        errors += mismatches(f"{tag} step={step} vs torch DDP", ours.module, theirs.module)
    if len(ours.bucket_sizes_bytes) == 0 or sum(ours.bucket_sizes_bytes) != sum(
        p.numel() * 4 for p in reference.parameters()
    ):
        errors.append(f"{tag}: bucket_sizes_bytes={ours.bucket_sizes_bytes} do not cover the parameters")
    if strategy != "naive" and world_size > 1:  # torch rebuilds its buckets (after step 1) only when ws > 1
        # same messages as torch's reducer: its rebuilt layout, in gradient-ready order, from its logging data
        theirs_layout = theirs._get_ddp_logging_data().get("rebuilt_bucket_sizes")
        if theirs_layout != ", ".join(map(str, ours.bucket_sizes_bytes)):
            errors.append(f"{tag}: buckets {ours.bucket_sizes_bytes} != torch DDP's rebuilt {theirs_layout}")
    return errors


def all_combinations(rank, world_size) -> list[str]:
    errors = []
    for strategy, cap_mb, as_view in itertools.product(
        ("naive", "bucketed", "overlap"), CAPS_MB, (False, True)
    ):
        errors += check_parity(rank, world_size, strategy, cap_mb, as_view)
    dist.barrier()
    return errors


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_parity_with_single_process_and_torch_ddp(world_size):
    assert_no_rank_errors(all_combinations, world_size)


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def buffers_after_accumulation(rank, world_size, accum=3, steps=3) -> list[str]:
    """BatchNorm running statistics and parameters after K-step accumulation (no_sync on all but the last
    micro-step) equal torch DDP's: torch skips the buffer broadcast on the forward that follows a forward
    under no_sync (require_forward_param_sync), so ranks keep their own statistics until the synced one."""
    errors = []
    for strategy, as_view in itertools.product(("naive", "bucketed", "overlap"), (False, True)):
        ours = DistributedDataParallel(bn_model(), strategy=strategy, bucket_cap_mb=0.001,
                                       gradient_as_bucket_view=as_view)
        theirs = nn.parallel.DistributedDataParallel(bn_model(), bucket_cap_mb=0.001,
                                                     gradient_as_bucket_view=as_view)
        opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in (ours, theirs)]
        gen = torch.Generator().manual_seed(10 + rank)  # every rank its own data: statistics differ
        for step in range(steps):
            batches = [(torch.randn(PER_RANK_BATCH, 8, generator=gen),
                        torch.randn(PER_RANK_BATCH, 3, generator=gen)) for _ in range(accum)]
            for model, opt in zip((ours, theirs), opts):
                for k, (x, y) in enumerate(batches):
                    with model.no_sync() if k < accum - 1 else contextlib.nullcontext():
                        nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            tag = f"world={world_size} strategy={strategy} view={as_view} step={step}"
            for (name, a), b in zip(ours.module.named_buffers(), theirs.module.buffers()):
                if not torch.allclose(a.float(), b.float(), rtol=RTOL, atol=ATOL):
                    errors.append(f"{tag}: buffer {name} max|diff|={(a.float() - b.float()).abs().max():.3g}")
            errors += mismatches(tag, ours.module, theirs.module)
    dist.barrier()
    return errors


@pytest.mark.timeout(180)
def test_buffers_after_accumulation_equal_torch_ddp():
    assert_no_rank_errors(buffers_after_accumulation, 2)


def batched_grad_copy_parity(rank, world_size) -> list[str]:
    """batched_grad_copy=True against torch DDP with the same option (torch 2.13): every bucketed strategy,
    both gradient modes, gradients set to None and zeroed in turn, with accumulation under no_sync."""
    errors = []
    for strategy, as_view in itertools.product(("bucketed", "overlap"), (False, True)):
        ours = DistributedDataParallel(bn_model(), strategy=strategy, bucket_cap_mb=0.001,
                                       gradient_as_bucket_view=as_view, batched_grad_copy=True)
        theirs = nn.parallel.DistributedDataParallel(bn_model(), bucket_cap_mb=0.001,
                                                     gradient_as_bucket_view=as_view, batched_grad_copy=True)
        opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in (ours, theirs)]
        gen = torch.Generator().manual_seed(20 + rank)
        for step in range(STEPS):
            batches = [(torch.randn(PER_RANK_BATCH, 8, generator=gen),
                        torch.randn(PER_RANK_BATCH, 3, generator=gen)) for _ in range(2)]
            for model, opt in zip((ours, theirs), opts):
                for k, (x, y) in enumerate(batches):
                    with model.no_sync() if k == 0 else contextlib.nullcontext():
                        nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=step % 2 == 0)
            errors += mismatches(f"world={world_size} strategy={strategy} view={as_view} step={step} batched",
                                 ours.module, theirs.module)
    dist.barrier()
    return errors


TORCH_HAS_BATCHED_GRAD_COPY = "batched_grad_copy" in inspect.signature(
    nn.parallel.DistributedDataParallel).parameters


@pytest.mark.timeout(180)
@pytest.mark.skipif(not TORCH_HAS_BATCHED_GRAD_COPY, reason="this torch's DDP has no batched_grad_copy")
@pytest.mark.parametrize("world_size", [2, 3])
def test_batched_grad_copy_equals_torch_ddp(world_size):
    assert_no_rank_errors(batched_grad_copy_parity, world_size)


class OutOfOrder(nn.Module):
    """Registered head first, run stem first: reverse registration order is the opposite of the order
    backward makes the gradients, so only a rebuild in ready order lets the first bucket fill first."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(16, 3)
        self.body = nn.Linear(16, 16)
        self.stem = nn.Linear(8, 16)

    def forward(self, x):
        return self.head(torch.tanh(self.body(torch.relu(self.stem(x)))))


def rebuilt_in_ready_order(rank, world_size) -> list[str]:
    """After the first synced backward both engines rebuild their buckets in gradient-ready order (torch's
    _rebuild_buckets), from rank 0's order; parameters stay equal to torch DDP's through the rebuild."""
    errors = []
    # cap 0.0005 MiB = 524 bytes. Reverse registration: stem (64 + 512 B), body (64 + 1,024), head (12 + 192).
    # Ready order: head (204 B, still open), body.bias (268), body.weight (1,292: closes), then stem.
    registered = [["stem.bias", "stem.weight"], ["body.bias", "body.weight"], ["head.bias", "head.weight"]]
    ready_order = [["head.bias", "head.weight", "body.bias", "body.weight"], ["stem.bias", "stem.weight"]]
    for strategy, as_view in itertools.product(("bucketed", "overlap"), (False, True)):
        tag = f"world={world_size} strategy={strategy} view={as_view}"
        ours = DistributedDataParallel(OutOfOrder(), strategy=strategy, bucket_cap_mb=0.0005,
                                       gradient_as_bucket_view=as_view)
        theirs = nn.parallel.DistributedDataParallel(OutOfOrder(), bucket_cap_mb=0.0005,
                                                     gradient_as_bucket_view=as_view)
        if ours.bucket_param_names != registered:
            errors.append(f"{tag}: built {ours.bucket_param_names}, expected {registered}")
        opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in (ours, theirs)]
        gen = torch.Generator().manual_seed(30 + rank)
        for step in range(STEPS):
            x, y = (torch.randn(PER_RANK_BATCH, n, generator=gen) for n in (8, 3))
            if step == 1 and rank == 1:  # another rank seeing another order must still follow rank 0's
                ours._ready_order = list(reversed(ours._ready_order))
            for model, opt in zip((ours, theirs), opts):
                opt.zero_grad(set_to_none=False)
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            errors += mismatches(f"{tag} step={step}", ours.module, theirs.module)
        if ours.bucket_param_names != ready_order:
            errors.append(f"{tag}: rebuilt {ours.bucket_param_names}, expected {ready_order}")
        theirs_layout = theirs._get_ddp_logging_data().get("rebuilt_bucket_sizes")
        if theirs_layout != ", ".join(map(str, ours.bucket_sizes_bytes)):
            errors.append(f"{tag}: buckets {ours.bucket_sizes_bytes} != torch DDP's rebuilt {theirs_layout}")
        if as_view:  # every gradient lives in the new buckets
            flats = {b.flat.untyped_storage().data_ptr() for b in ours.buckets}
            if any(p.grad.untyped_storage().data_ptr() not in flats for p in ours.parameters()):
                errors.append(f"{tag}: a .grad outside the rebuilt buckets")
    # as torch's should_rebuild_buckets: no rebuild with find_unused_parameters (the ready order may change)
    ours = DistributedDataParallel(OutOfOrder(), bucket_cap_mb=0.0005, find_unused_parameters=True)
    for _ in range(STEPS):
        ours(torch.randn(PER_RANK_BATCH, 8)).sum().backward()
    if ours.bucket_param_names != registered:
        errors.append(f"world={world_size} find_unused_parameters: rebuilt to {ours.bucket_param_names}")
    dist.barrier()
    return errors


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 3])
def test_buckets_rebuilt_in_gradient_ready_order(world_size):
    assert_no_rank_errors(rebuilt_in_ready_order, world_size)
