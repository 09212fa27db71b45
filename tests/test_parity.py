"""The parity gate (bench/worker/parity.py): its errors, floors and bounds by hand, and on real ranks
(gloo, world size 2) that honest engines pass — on a user's 32-block pre-norm model (tests/deep_prenorm.py)
and on transformer.tiny — while engines that keep every rank identical but hand the optimizer a wrong
gradient (tests/parity_mutants.py: every 8th element dropped, a sum instead of the mean, last step's
gradient) come out `diverged`. The trajectory gate this replaced passed the sum at every precision and
called honest fsdp2 bf16 diverged on the deep model: these cases fail under it."""

from __future__ import annotations

import math

import pytest
import torch

from bench.worker import parity
from tests.dist_utils import run_distributed
from tests.parity_mutants import gate_cases

STEPS = 3  # the trainers' own steps before the gate (weights apart from the reference's, as in a run)
DEEP = "tests/deep_prenorm.py:DeepPreNorm"


def test_errors_by_hand():
    """Two tensors, reference gradients (3, 4) and (0, 0) — the second ~0 by symmetry — over two steps.
    The engine's are (3, 4) + (0.3, 0.4) and (0.01, 0) at step 1, exact at step 2: over all tensors
    √(0.25 + 0.0001) / √(2 · 25) = 0.070718; the first tensor √0.25 / √50 = 0.070711; the second's
    denominator is floored at TENSOR_FLOOR_SHARE (0.05) of its even share √(50 · 2/4) = 5: 0.01 / 0.25."""
    errors = parity.Errors([2, 2])
    t = lambda *v: torch.tensor(v)  # noqa: E731
    errors.add([t(3.3, 4.4), t(0.01, 0.0)], [t(3.0, 4.0), t(0.0, 0.0)])
    errors.add([t(3.0, 4.0), t(0.0, 0.0)], [t(3.0, 4.0), t(0.0, 0.0)])
    assert errors.total() == pytest.approx(math.sqrt(0.2501 / 50))
    assert errors.tensors() == pytest.approx([math.sqrt(0.25 / 50), 0.01 / (0.05 * 5)])
    assert parity.relative(0.0, 0.0) == 0.0 and parity.relative(1.0, 0.0) == math.inf


def test_a_sum_instead_of_the_mean_is_one_whole_gradient_out():
    """At world size 2 a reducer that sums hands over 2g for g: ‖2g − g‖ / ‖g‖ = 1, at any scale of g."""
    g = [torch.randn(50, generator=torch.Generator().manual_seed(0)) * 1e-6]
    errors = parity.Errors([50])
    errors.add([2 * x for x in g], g)
    assert errors.total() == pytest.approx(1.0)


def test_the_bounds_come_from_torch_ddps_own_error():
    """torch DDP (0.002, 0.006) from the reference per tensor of equal norms, so √((0.002² + 0.006²)/2) =
    0.004472 over all; bf16: over all BOUND_FACTOR (4) × 0.004472 = 0.01789; per tensor TENSOR_FACTOR (8)
    × max(its own, the total, bf16's ULP 2^-7 = 0.0078125): 0.0625 for both. With (0.002, 0.03): the total
    0.02126 and 8 × 0.02126, 8 × 0.03. At fp32 with torch DDP at 0 the floor decides: 4 × MIN_ERROR."""
    ddp = parity.Errors([4, 4], diff2=[0.002**2 * 25, 0.006**2 * 25], ref2=[25.0, 25.0])
    total, tensors = parity.bounds(ddp, parity.MIN_ERROR, "bf16")
    assert total == pytest.approx(4 * 0.00447214) and tensors == pytest.approx([0.0625, 0.0625])
    ddp = parity.Errors([4, 4], diff2=[0.002**2 * 25, 0.03**2 * 25], ref2=[25.0, 25.0])
    total, tensors = parity.bounds(ddp, parity.MIN_ERROR, "bf16")
    assert ddp.total() == pytest.approx(0.0212603) and total == pytest.approx(4 * 0.0212603)
    assert tensors == pytest.approx([8 * 0.0212603, 8 * 0.03])
    exact = parity.Errors([4], diff2=[0.0], ref2=[1.0])
    assert parity.bounds(exact, parity.MIN_ERROR, "fp32")[0] == pytest.approx(4 * 2.5e-5)


def test_a_comm_hooks_wire_rounding_is_allowed_for():
    """An fp16 comm hook rounds every gradient element once where torch DDP does not: the floor is fp16's
    ULP (2^-10); a cell without one keeps fp32's MIN_ERROR."""
    class Cell:
        comm_hook = "fp16"
    assert parity.floor_error(Cell()) == 2.0**-10
    Cell.comm_hook = "none"
    assert parity.floor_error(Cell()) == parity.MIN_ERROR


HONEST = ("fsdp2", "overlap", "torch+inductor", "fsdp2 skip1")
CASES = [(DEEP, "deep", "bf16", ["fsdp2", "torch drop8", "torch sum", "torch stale"]),
         (DEEP, "deep", "fp32", ["fsdp2", "torch drop8", "torch sum", "torch stale"]),
         ("transformer", "tiny", "fp32", ["torch+inductor", "overlap", "fsdp2 no-sync", "torch sum"]),
         ("transformer", "tiny", "fp16", ["fsdp2", "fsdp2 skip1", "torch stale"])]


@pytest.mark.integration   # 2 ranks a case, 10-40 s each: `make test` runs them, `make test-fast` does not
@pytest.mark.timeout(400)
@pytest.mark.parametrize("model,size,precision,engines", CASES,
                         ids=[f"{m.rsplit(':', 1)[-1]}.{s}-{p}" for m, s, p, _ in CASES])
def test_honest_engines_pass_and_broken_ones_diverge(model, size, precision, engines):
    """Honest engines pass; every broken one is diverged with a reason naming a tensor and its bound, and
    the worst honest error/bound is at most a third of the weakest broken one's."""
    rows = run_distributed(gate_cases, 2, model, size, precision, STEPS, engines, timeout_s=380)[0]
    for row in rows:
        if row["engine"] in HONEST:
            assert row["parity_gate"].startswith("passed"), row
        else:
            assert row["parity_gate"] == "diverged", row
            assert "against" in row["parity_failure"] and "torch DDP" in row["parity_failure"]
        assert row["parity_gate_steps"] == parity.GATE_STEPS and row["parity_grad_bound"] > 0
        if row["engine"].endswith("skip1"):  # a step behind, judged at the same weights
            assert row["skipped_before_gate"] == 1, row
    honest = max(r["ratio"] for r in rows if r["engine"] in HONEST)
    broken = min(r["ratio"] for r in rows if r["engine"] not in HONEST)
    assert 3 * honest <= broken and broken > 1.0, (honest, broken)
