"""CUDA/NCCL: ddp_core on a GPU matches one process on the global batch (skipped without CUDA)."""

from __future__ import annotations

import copy

import pytest
import torch
from dist_utils import assert_no_rank_errors
from torch import nn

from ddp_core import DistributedDataParallel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL backend)"),
]


def nccl_parity(rank, world_size) -> list[str]:
    """Every strategy on cuda:rank against a single-GPU reference on the global batch."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    errors = []
    for strategy in ("naive", "bucketed", "overlap"):
        for as_view in (False, True):
            torch.manual_seed(0)
            ref = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
            ddp = DistributedDataParallel(
                copy.deepcopy(ref), strategy=strategy, bucket_cap_mb=0.001, gradient_as_bucket_view=as_view
            )
            assert all(b.flat.device == device for b in ddp.buckets), "bucket not on the parameter's device"
            opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, ddp)]
            gen = torch.Generator(device="cpu").manual_seed(1)
            x, y = (
                torch.randn(8 * world_size, 32, generator=gen),
                torch.randn(8 * world_size, 8, generator=gen),
            )
            x, y = x.to(device), y.to(device)
            mine = slice(rank * 8, (rank + 1) * 8)
            for _ in range(3):
                for model, opt in zip((ref, ddp), opts):
                    opt.zero_grad()
                    xs, ys = (x, y) if model is ref else (x[mine], y[mine])
                    nn.functional.mse_loss(model(xs), ys).backward()
                    opt.step()
            torch.cuda.synchronize()
            for (name, a), b in zip(ddp.module.named_parameters(), ref.parameters()):
                # TF32 may be on for matmuls: a looser tolerance than the CPU float32 tests
                if not torch.allclose(a, b, rtol=1e-3, atol=1e-4):
                    errors.append(f"strategy={strategy} view={as_view}: {name}")
    return errors


# one GPU, and two where the machine has them
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
WORLD_SIZES = [1, pytest.param(2, marks=TWO_GPUS)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_nccl_parity(world_size):
    assert_no_rank_errors(nccl_parity, world_size, backend="nccl")  # one GPU per rank


def nccl_matches_torch_ddp(rank, world_size) -> list[str]:
    """ddp_core against torch DDP on the same GPU with BatchNorm buffers: at world size ≥ 2 this runs the
    CUDA paths of the gradient division (a CUDA gradient times a CPU 0-dim scalar into its bucket view),
    the process group's own allreduce and the per-forward buffer broadcast (BufferBroadcast over NCCL)."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    errors = []
    for strategy in ("bucketed", "overlap"):
        for as_view in (False, True):
            torch.manual_seed(0)
            base = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 8))
            base = base.to(device)
            ours = DistributedDataParallel(copy.deepcopy(base), strategy=strategy, bucket_cap_mb=0.001,
                                           gradient_as_bucket_view=as_view)
            theirs = nn.parallel.DistributedDataParallel(copy.deepcopy(base), device_ids=[rank],
                                                         bucket_cap_mb=0.001, gradient_as_bucket_view=as_view)
            opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
            gen = torch.Generator(device="cpu").manual_seed(1 + rank)  # each rank its own data
            for _ in range(3):
                x, y = (torch.randn(8, n, generator=gen).to(device) for n in (32, 8))
                for model, opt in zip((ours, theirs), opts):
                    opt.zero_grad()
                    nn.functional.mse_loss(model(x), y).backward()
                    opt.step()
            torch.cuda.synchronize()
            tag = f"strategy={strategy} view={as_view}"
            for (name, a), b in zip(ours.module.state_dict().items(), theirs.module.state_dict().values()):
                if not torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6):
                    errors.append(f"{tag}: {name} max|diff|={(a.float() - b.float()).abs().max().item():.3g}")
    return errors


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_nccl_matches_torch_ddp_with_buffers(world_size):
    assert_no_rank_errors(nccl_matches_torch_ddp, world_size, backend="nccl")
