"""Bucket assignment: a pure function, checked against hand-worked expected lists (no processes)."""

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
