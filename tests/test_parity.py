"""The parity gate of sharded and compiled engines (bench/worker/parity.py): its thresholds and distances
by hand, and on real ranks (gloo, world size 2) that honest engines pass on a transformer and an MLP while
engines that drop or corrupt part of the gradient come out `diverged`."""

from __future__ import annotations

import math

import pytest
import torch

from bench.config import load_config
from bench.matrix import expand
from bench.worker import parity
from bench.worker.trainer import Trainer
from tests.dist_utils import run_distributed

STEPS = 6  # cpu-smoke's optimizer steps before the gate: 2 warm-up, 3 timed, 1 phase


def test_thresholds_from_the_precisions_rounding():
    """update 2·√e, worst tensor 4·√e, loss 4·e: bf16 e = 2^-8 → 0.125, 0.25, 0.015625; fp32 e = 2^-18 →
    2^-8, 2^-7, 2^-16; compiled fp32 e = 2^-12 → 2^-5, 2^-4, 2^-10; compiled bf16 keeps bf16's."""
    assert parity.thresholds("bf16") == parity.Thresholds(0.125, 0.25, 0.015625)
    assert parity.thresholds("fp32") == parity.Thresholds(2.0**-8, 2.0**-7, 2.0**-16)
    assert parity.thresholds("fp32", compiled=True) == parity.Thresholds(2.0**-5, 2.0**-4, 2.0**-10)
    assert parity.thresholds("bf16", compiled=True) == parity.thresholds("bf16")
    assert parity.thresholds("fp16").update == pytest.approx(2 * 2.0**-5.5)
    # a tensor of n elements has room for one flip, 2/√n: bf16 √(0.25² + 4/256) = 0.2795; n = 4: 1.0308
    assert parity.thresholds("bf16").tensor(256) == pytest.approx(0.279508, rel=1e-5)
    assert parity.thresholds("bf16").tensor(4) == pytest.approx(1.030776, rel=1e-5)


def test_update_distances_by_hand():
    """θ_0 = 0; the reference moved two one-element tensors to 1 and 1 (‖Δ‖ = √2); the engine moved only
    the first: overall 1/√2, per tensor 0 and 1 (it did not move at all). A tensor the reference left
    where it was (0/0) has no distance of its own."""
    t = lambda *v: torch.tensor(v)  # noqa: E731
    initial, ref, mine = [t(0.0), t(0.0), t(5.0)], [t(1.0), t(1.0), t(5.0)], [t(1.0), t(0.0), t(5.0)]
    overall, tensors = parity.update_distances(mine, ref, initial)
    assert overall == pytest.approx(1 / math.sqrt(2)) and tensors == [(0.0, 1), (1.0, 1)]
    assert parity.update_distances(ref, ref, initial) == (0.0, [(0.0, 1), (0.0, 1)])


def _mutate(trainer: Trainer, mutant: str, rank: int) -> None:
    """Test-only corruptions of the engine's sharded gradient, applied before every optimizer step on each
    rank's own shard: `drop-tensor` zeroes the smallest parameter's gradient; `drop-1%` a fixed 1 % of
    every gradient's elements; `noise` adds Gaussian noise of 10 % of each gradient's RMS; `no-sync` never
    reduce-scatters (each rank keeps its own gradients: its shards get none)."""
    if mutant == "no-sync":
        trainer.model.set_requires_gradient_sync(False)
        return
    params = list(trainer.model.parameters())
    smallest = min(range(len(params)), key=lambda i: params[i].numel())
    generator = torch.Generator().manual_seed(rank)
    masks: dict[int, torch.Tensor] = {}

    def corrupt(optimizer, args, kwargs):
        for i, p in enumerate(params):
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            if mutant == "drop-tensor" and i == smallest:
                grad.zero_()
            elif mutant == "drop-1%":
                grad[masks.setdefault(i, torch.rand(grad.shape, generator=generator) < 0.01)] = 0
            elif mutant == "noise":
                rms = grad.float().pow(2).mean().sqrt()
                grad.add_(torch.randn(grad.shape, generator=generator) * rms * 0.1)

    trainer.optimizer.register_step_pre_hook(corrupt)


def _gates(rank: int, world_size: int, cases: list[tuple[str, str, str, str | None]]) -> dict:
    out = {}
    for model, precision, compile_, mutant in cases:
        sets = [f"workload.model={model}", "workload.model_size=tiny", "matrix.world_size=2",
                "matrix.precision=" + precision, "matrix.grad_accum=1", "matrix.scaling=strong",
                "workload.global_batch=8", "matrix.bucket_cap_mb=25"]
        sets += ["workload.seq_len=16"] * (model == "transformer")
        sets += ["matrix.engine=torch", "matrix.compile=inductor"] if compile_ else [
            "matrix.engine=fsdp2", "matrix.reshard_after_forward=true"]
        config = load_config("cpu-smoke", sets)
        (cell,) = expand(config)
        device = torch.device("cpu")
        trainer = Trainer(cell, config, device, rank, world_size, STEPS)
        ddp = Trainer(parity.baseline_cell(cell), config, device, rank, world_size, STEPS)
        if mutant:
            _mutate(trainer, mutant, rank)
        for _ in range(STEPS):
            trainer.step()
            ddp.step()
        out[(model, precision, compile_, mutant)] = parity.gate(trainer, ddp)
    return out


@pytest.mark.timeout(600)
def test_honest_engines_pass_and_corrupted_gradients_diverge():
    """fsdp2 at fp32 and bf16 on transformer.tiny and mlp.tiny (bf16 there: FSDP2 casts every parameter,
    norms and residual included, where autocast keeps fp32; the per-element gate called it 309× over),
    torch + inductor on mlp.tiny: passed. fsdp2 whose gradient loses one tensor, 1 % of its elements
    (fp32), gains 10 % noise (bf16), or is never reduced: diverged, with the figures in the reason."""
    honest = [("transformer", "bf16", False, None), ("transformer", "fp32", False, None),
              ("mlp", "bf16", False, None), ("mlp", "fp32", True, None)]
    broken = [("transformer", "bf16", False, "drop-tensor"), ("mlp", "fp32", False, "drop-1%"),
              ("mlp", "bf16", False, "noise"), ("mlp", "fp32", False, "no-sync")]
    gates = run_distributed(_gates, 2, honest + broken, timeout_s=560)[0]
    for case in honest:
        assert gates[case]["parity_gate"] == "passed", (case, gates[case])
    # the per-element bound this gate replaced (steps · lr · 2^-8) called honest bf16 diverged
    assert gates[honest[0]]["param_max_abs_diff"] > STEPS * 1e-4 * 2.0**-8
    for case in broken:
        assert gates[case]["parity_gate"] == "diverged", (case, gates[case])
        assert "trains differently from eager torch DDP" in gates[case]["parity_failure"]
