"""Analytic training FLOPs against torch's FlopCounterMode (one forward + backward).

What the counter sees: matmuls (mm/addmm/bmm), convolutions and their backward; not norms,
activations, softmax, pooling, rotary or the loss. The analytic formulas count exactly the same
operations, so they must agree to rounding (REL_TOL), with one stated exception for ResNets: the stem's
input gradient, which the formula counts by convention and autograd never computes.

On CPU, SDPA's fused kernel is invisible to the counter, so attention runs on the MATH backend there
(explicit bmm's: QKᵀ and AV forward, two matmuls each backward = 12·T²·H·d_head per layer, the formula's
attention term). On the meta device the counter sees SDPA as bmm's too, which lets the full-size models
be checked without allocating them.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench.workloads import WorkloadOptions, get_workload

REL_TOL = 1e-9


def counted_train_flops(workload, model, batch) -> int:
    with FlopCounterMode(display=False) as counter:
        workload.loss(model, batch).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("task", ["classification", "lm"])
@pytest.mark.parametrize("fixed_length", [True, False])
def test_transformer_formula_matches_counter_on_cpu(task, fixed_length):
    torch.manual_seed(0)
    workload = get_workload("transformer", "tiny", WorkloadOptions(task=task, seq_len=40,
                                                                   fixed_length=fixed_length))
    model = workload.build_model()
    batch = workload.make_dataset(16, torch.device("cpu"), seed=0).batch(torch.arange(3))
    with sdpa_kernel(SDPBackend.MATH):
        counted = counted_train_flops(workload, model, batch)
    expected = 3 * workload.train_flops_per_sample(batch)
    assert counted == pytest.approx(expected, rel=REL_TOL)


@pytest.mark.parametrize("task", ["classification", "lm"])
def test_smollm2_formula_matches_counter_on_meta(task):
    workload = get_workload("transformer", "smollm2-135m", WorkloadOptions(task=task))
    with torch.device("meta"):
        model = workload.build_model()
    t = 128
    batch = {"input_ids": torch.zeros(2, t, dtype=torch.long, device="meta"),
             "attention_mask": torch.ones(2, t, dtype=torch.long, device="meta"),
             "labels": torch.zeros(2, dtype=torch.long, device="meta")}
    counted = counted_train_flops(workload, model, batch)
    assert counted == pytest.approx(2 * workload.train_flops_per_sample(batch), rel=REL_TOL)


def test_transformer_flops_are_6N_per_token_plus_attention():
    """The formula in words: 6 · (matmul weights incl. the tied head) · T + 12 · L · T² · d_model."""
    workload = get_workload("transformer", "smollm2-360m", WorkloadOptions(task="lm", seq_len=128))
    with torch.device("meta"):
        model = workload.build_model()
    n = sum(p.numel() for name, p in model.named_parameters() if "norm" not in name)
    t, layers, d = 128, 32, 960
    assert workload.train_flops_per_sample() == 6 * n * t + 12 * layers * t * t * d


@pytest.mark.parametrize("size, side, device", [
    ("tiny", 32, "cpu"), ("resnet18", 32, "cpu"), ("resnet50", 224, "meta"),
])
def test_resnet_formula_matches_counter_plus_stem_input_gradient(size, side, device):
    torch.manual_seed(0)
    workload = get_workload("resnet", size, WorkloadOptions(image_size=side))
    with torch.device(device):
        model = workload.build_model()
    batch = {"x": torch.randn(2, 3, side, side, device=device),
             "y": torch.zeros(2, dtype=torch.long, device=device)}
    counted = counted_train_flops(workload, model, batch) / 2
    stem_forward = _stem_forward_flops(model, side)
    assert counted + stem_forward == pytest.approx(workload.train_flops_per_sample(), rel=REL_TOL)
    # Against the raw counter the convention over-counts by the stem's share of the work.
    excess = workload.train_flops_per_sample() / counted - 1
    assert excess == pytest.approx(STEM_SHARE[size], abs=0.001)


# (formula − counter) / counter, measured: the stem's forward over the rest of training.
STEM_SHARE = {"tiny": 0.145, "resnet18": 0.022, "resnet50": 0.0097}


def _stem_forward_flops(model, side) -> int:
    conv = model.stem[0]
    out = (side + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
    return 2 * out * out * conv.out_channels * conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]


def test_resnet50_forward_macs_match_the_published_4_1_gmacs():
    workload = get_workload("resnet", "resnet50")
    assert workload.train_flops_per_sample() / 6 == pytest.approx(4.09e9, rel=0.005)


def test_mlp_formula_matches_counter():
    workload = get_workload("mlp", "small")
    model = workload.build_model()
    batch = workload.make_dataset(4, torch.device("cpu"), seed=0).batch(torch.arange(4))
    # The first layer's input gradient is not computed (inputs need none): the counter sees 2·a·b fewer.
    first = 2 * workload.in_features * workload.width
    counted = counted_train_flops(workload, model, batch) / 4
    assert counted + first == pytest.approx(workload.train_flops_per_sample(), rel=REL_TOL)
