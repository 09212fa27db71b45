"""A dropped ddp_core wrapper is freed (no reference cycle through autograd's hooks), and close() detaches it.

Why it matters on a GPU: a sweep builds a model per cell in one process; a wrapper that is never freed
keeps its parameters, gradients and flat buckets on the device, so later cells run out of memory and
measure other cells' leftovers. The effect is the same on CPU, where weakref + gc show it.
"""

from __future__ import annotations

import gc
import itertools
import weakref

import pytest
import torch
from torch import nn

from ddp_core import DistributedDataParallel


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2), nn.Linear(2, 2))


def train_a_little(model: nn.Module) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(6, 4)
    with model.no_sync():
        model(x)[:, :2].sum().backward()
    model(x)[:, :2].sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize(("strategy", "as_view", "find_unused"), list(itertools.product(
    ("naive", "bucketed", "overlap"), (False, True), (False, True))))
def test_a_dropped_wrapper_and_its_module_are_freed(one_rank_group, strategy, as_view, find_unused):
    model = DistributedDataParallel(make_model(), strategy=strategy, bucket_cap_mb=0.0001,
                                    gradient_as_bucket_view=as_view, find_unused_parameters=find_unused)
    train_a_little(model)
    wrapper, module = weakref.ref(model), weakref.ref(model.module)
    del model
    gc.collect()
    assert wrapper() is None and module() is None


def test_torch_ddp_is_freed_too(one_rank_group):
    model = nn.parallel.DistributedDataParallel(make_model())
    train_a_little(model)
    wrapper = weakref.ref(model)
    del model
    gc.collect()
    assert wrapper() is None


def test_close_detaches_the_hooks_and_the_module_trains_on(one_rank_group):
    model = DistributedDataParallel(make_model(), strategy="overlap", bucket_cap_mb=0.0001)
    train_a_little(model)
    module = model.module
    model.close()
    calls = []
    model._mark_ready = lambda i: calls.append(i)  # would be called by a hook still attached
    module(torch.randn(6, 4)).sum().backward()
    assert calls == [] and all(p.grad is not None for p in module.parameters())


def test_hooks_of_a_dropped_wrapper_do_nothing(one_rank_group):
    module = make_model()
    model = DistributedDataParallel(module, strategy="bucketed")
    del model
    gc.collect()
    module(torch.randn(6, 4)).sum().backward()  # the stale hooks fire and must not fail
    assert all(p.grad is not None for p in module.parameters())
