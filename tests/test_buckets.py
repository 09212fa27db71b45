"""Bucket assignment (a pure function, checked against hand-worked expected lists) and the Bucket's arithmetic
(gradients in, divided as torch's reducer rounds them, and back out), without processes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddp_core import assign_buckets
from ddp_core.buckets import Bucket


def test_fills_up_to_the_cap_in_order():
    # 4+4 = 8 reaches the cap and closes; 4+3 = 7 stays open, +2 = 9 reaches it (torch's rule: a bucket
    # closes once it holds the cap or more), so 1 opens the third bucket
    assert assign_buckets([4, 4, 4, 3, 2, 1], cap_bytes=8) == [[0, 1], [2, 3, 4], [5]]
    assert assign_buckets([6, 4], cap_bytes=8) == [[0, 1]]


def test_parameter_larger_than_the_cap_is_never_split():
    # torch's rule: 20 joins the open [0] (3 + 20 ≥ 8) and closes it; 1 and 2 open the next bucket
    assert assign_buckets([3, 20, 1, 2], cap_bytes=8) == [[0, 1], [2, 3]]
    assert assign_buckets([20, 1], cap_bytes=8) == [[0], [1]]
    assert assign_buckets([20], cap_bytes=8) == [[0]]


def test_first_bucket_has_its_own_cap():
    # first cap 2: [0] (2 bytes) closes at once; then cap 8: [1, 2] = 8, [3, 4] = 6
    assert assign_buckets([2, 4, 4, 3, 3], cap_bytes=8, first_cap_bytes=2) == [[0], [1, 2], [3, 4]]
    # the first bucket follows the same rule as torch's: a tensor joins it, then it closes at ≥ 2
    assert assign_buckets([1, 5, 4, 4, 4], cap_bytes=8, first_cap_bytes=2) == [[0, 1], [2, 3], [4]]
    # a tensor larger than the cap closes the first bucket it joins, as any other
    assert assign_buckets([1, 20, 4], cap_bytes=8, first_cap_bytes=2) == [[0, 1], [2]]


def test_tiny_cap_gives_one_parameter_per_bucket():
    assert assign_buckets([40, 4, 400], cap_bytes=1) == [[0], [1], [2]]


def test_one_dtype_per_bucket_ordered_by_first_index():
    keys = ["f32", "f16", "f32", "f16", "f32"]
    # per key: f32 → [0, 2] (8) full, [4]; f16 → [1, 3] (4) open until the end
    assert assign_buckets([4, 2, 4, 2, 4], cap_bytes=8, keys=keys) == [[0, 2], [1, 3], [4]]


def test_rejects_a_non_positive_cap():
    with pytest.raises(ValueError, match="cap_bytes=0"):
        assign_buckets([4], cap_bytes=0)


def test_bucket_views_share_the_flat_buffer():
    params = [nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(4))]
    bucket = Bucket(0, params, ["w", "b"], comm_dtype=None, process_group=None)
    assert bucket.size_bytes == 10 * 4 and [v.shape for v in bucket.views] == [(2, 3), (4,)]
    bucket.views[1].fill_(7.0)
    assert bucket.flat[6:].tolist() == [7.0] * 4


def bucket_of(grads, world_size, as_view=False):
    """A Bucket over parameters whose .grad are `grads` (no process group: nothing is launched)."""
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    return Bucket(0, params, [f"p{j}" for j in range(len(params))], comm_dtype=None, process_group=None,
                  world_size=world_size, as_view=as_view)


def test_a_copied_gradient_is_multiplied_by_the_reciprocal_as_torchs_reducer_does():
    # torch's reducer (copy_grad_to_bucket / mark_variable_ready_dense): mul_out(bucket_view, grad, 1/world).
    # Worked by hand at world size 3: float32(1/3) = 0.3333333432674408, 5 x that = 1.666666716... which
    # rounds to 1.6666667461395264; a true division 5/3 rounds to 1.6666666269302368 instead.
    bucket = bucket_of([torch.tensor([5.0, 6.0])], world_size=3)
    assert bucket.add(0) is True and bucket.pending == 0
    assert bucket.views[0].tolist() == [1.6666667461395264, 2.0]
    # and on a random gradient in every float dtype: bit-identical to mul by a Python 1/3 (torch's wrapped
    # double scalar), which is not what a division gives
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        g = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(dtype)
        bucket = bucket_of([g], world_size=3)
        bucket.add(0)
        assert torch.equal(bucket.views[0], torch.mul(g, 1 / 3)), dtype
        assert bucket.params[0].grad is not bucket.views[0]  # copy mode: .grad stays its own tensor
    assert not torch.equal(torch.mul(g.float(), 1 / 3), g.float() / 3)  # the check above can tell them apart


def test_a_gradient_already_in_its_view_is_divided_once_at_launch():
    # torch's reducer divides a gradient accumulated into its bucket view in place (bucket_view.div_);
    # ddp_core does it once for the bucket when every gradient is in place, per view when only some are
    grads = [torch.tensor([5.0, 7.0]), torch.tensor([10.0])]
    for in_place in ([0, 1], [1]):
        bucket = bucket_of(grads, world_size=3, as_view=True)
        for j in in_place:  # autograd accumulated into the view (gradient_as_bucket_view)
            bucket.views[j].copy_(grads[j])
            bucket.params[j].grad = bucket.views[j]
        assert [bucket.add(j) for j in range(2)] == [False, True]
        bucket._complete()
        for j, g in enumerate(grads):
            expected = g / 3 if j in in_place else torch.mul(g, 1 / 3)
            assert torch.equal(bucket.views[j], expected), (in_place, j)
            assert bucket.params[j].grad.data_ptr() == bucket.views[j].data_ptr()  # .grad is the view now
        assert bucket.undivided == []


def test_world_size_one_copies_without_arithmetic_and_an_absent_gradient_adds_zeros():
    bucket = bucket_of([torch.tensor([5.0]), torch.tensor([2.0])], world_size=1)
    bucket.views[1].fill_(9.0)
    bucket.params[1].grad = None  # an unused parameter without a local gradient
    bucket.add(0), bucket.add(1)
    assert bucket.flat.tolist() == [5.0, 0.0] and bucket.params[1].grad is None


def test_copy_out_writes_every_gradient_but_the_skipped_ones():
    grads = [torch.tensor([1.0]), torch.tensor([2.0, 3.0])]
    bucket = bucket_of(grads, world_size=1)
    bucket.flat.copy_(torch.tensor([10.0, 20.0, 30.0]))  # "the reduced result"
    bucket.copy_out()  # every .grad defined: the one-call path
    assert [p.grad.tolist() for p in bucket.params] == [[10.0], [20.0, 30.0]]
    bucket.params[0].grad = None
    bucket.params[1].grad = torch.tensor([2.0, 3.0])
    bucket.copy_out(skip={1})  # a globally unused parameter keeps its .grad; an undefined one gets a copy
    assert bucket.params[0].grad.tolist() == [10.0] and bucket.params[0].grad is not bucket.views[0]
    assert bucket.params[1].grad.tolist() == [2.0, 3.0]


def test_batched_grad_copy_defers_the_copies_and_divides_the_bucket_once():
    # torch's batched_grad_copy (flush_deferred_copies): _foreach_copy_ of the deferred gradients, then one
    # div_ of the flat bucket, so a gradient of 5 at world size 3 enters as 5/3 = 1.6666666269302368 (a true
    # division), where the default path's multiplication by float32(1/3) gives 1.6666667461395264
    grads = [torch.tensor([5.0, 7.0]), torch.tensor([10.0])]
    for as_view in (False, True):
        bucket = bucket_of(grads, world_size=3, as_view=as_view)
        if as_view:  # one gradient already in its view, one outside: both end divided once
            bucket.views[1].copy_(grads[1])
            bucket.params[1].grad = bucket.views[1]
        bucket.batched = True
        assert [bucket.add(j) for j in range(2)] == [False, True]
        assert bucket.views[0].tolist() == [0.0, 0.0]  # deferred: nothing copied before the launch
        bucket._complete()
        assert bucket.views[0][0].item() == 1.6666666269302368
        assert torch.equal(bucket.flat, torch.cat([g / 3 for g in grads]))
        assert (bucket.params[0].grad.data_ptr() == bucket.views[0].data_ptr()) == as_view
        assert bucket.deferred == [] and bucket.undivided == []
