"""Test-only corruptions of an engine's gradients, for the parity gate's tests (tests/test_parity.py) and its
margin benchmark (benchmarks/parity_margin.py): each is a gradient-dropping or -corrupting engine the gate
must call `diverged` at every precision, applied to a built trainer on each rank.

- `no-sync`: fsdp2 whose gradient sync is off for good (a no_sync without `finally`): its sharded
  parameters never get a gradient, so they never move;
- `drop-tensor`: the smallest parameter's gradient zeroed before every optimizer step;
- `drop-1%`: a fixed 1 % of every gradient's elements zeroed;
- `drop-shard`: the last rank's shard of every gradient zeroed (a rank whose reduce-scatter output is lost);
- `noise`: Gaussian noise of 10 % of each gradient's RMS added.
"""

from __future__ import annotations

import math

import torch

MUTANTS = ("no-sync", "drop-tensor", "drop-1%", "drop-shard", "noise")


def mutate(trainer, mutant: str, rank: int, world_size: int) -> None:
    """Apply `mutant` to the trainer's sharded gradients (each rank its own shard), from now on."""
    if mutant == "no-sync":
        trainer.model.set_requires_gradient_sync(False)
        return
    params = list(trainer.model.parameters())
    smallest = min(range(len(params)), key=lambda i: params[i].numel())
    generator = torch.Generator().manual_seed(rank)
    masks: dict[int, torch.Tensor] = {}

    def corrupt(optimizer, args, kwargs):
        for i, p in enumerate(params):
            if p.grad is None:
                continue
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            if mutant == "drop-tensor" and i == smallest:
                grad.zero_()
            elif mutant == "drop-1%":
                grad[masks.setdefault(i, torch.rand(grad.shape, generator=generator) < 0.01)] = 0
            elif mutant == "drop-shard" and rank == world_size - 1:
                grad.zero_()
            elif mutant == "noise":
                rms = grad.float().pow(2).mean().sqrt()
                grad.add_(torch.randn(grad.shape, generator=generator).to(grad.dtype) * rms * 0.1)

    trainer.optimizer.register_step_pre_hook(corrupt)


def gate_cases(rank: int, world_size: int, model: str, model_size: str, precision: str, steps: int,
               seeds: int, engines: list[str]) -> list[dict]:
    """One process group's side of the gate's cases for one model and precision (the test's and the margin
    benchmark's): eager torch DDP (the reference), `seeds` rerounded twins (seed 0 is the gate's own, as
    parity.References builds it), and each of `engines` — "fsdp2", "torch+inductor", or "fsdp2 <mutant>" —
    all stepped `steps` times through the same batches from the same weights. Returns per engine and twin
    the gate's row and its ratio (the largest distance / bound of its checks: ≤ 1 passes)."""
    import torch

    from bench.config import load_config
    from bench.matrix import expand
    from bench.worker import parity
    from bench.worker.trainer import Trainer

    def cell_for(engine: str, compile_: bool):
        sets = [f"workload.model={model}", f"workload.model_size={model_size}", f"matrix.engine={engine}",
                f"matrix.world_size={world_size}", f"matrix.precision={precision}", "matrix.grad_accum=1",
                "matrix.scaling=strong", "workload.global_batch=8", "matrix.bucket_cap_mb=25"]
        sets += ["workload.seq_len=32"] * (model == "transformer")
        sets += ["matrix.compile=inductor"] if compile_ else []
        sets += ["matrix.reshard_after_forward=true"] if engine == "fsdp2" else []
        config = load_config("cpu-smoke", sets)
        (cell,) = expand(config)
        return cell, config

    device = torch.device("cpu")
    fsdp2, config = cell_for("fsdp2", False)
    baseline = parity.baseline_cell(fsdp2)
    reference = Trainer(baseline, config, device, rank, world_size, steps)
    trainers = {}
    for name in engines:
        if name == "torch+inductor":
            trainers[name] = Trainer(cell_for("torch", True)[0], config, device, rank, world_size, steps)
            continue
        trainers[name] = Trainer(fsdp2, config, device, rank, world_size, steps)
        if " " in name:
            mutate(trainers[name], name.split(" ", 1)[1], rank, world_size)
    raised: dict[str, str] = {}  # an engine whose step raised (a fp16 no-sync: its GradScaler finds no
    for _ in range(steps):      # gradient to check): a failed cell in a run, never a passed one
        reference.step()
        for name, trainer in trainers.items():
            if name not in raised:
                try:
                    trainer.step()
                except Exception as e:  # noqa: BLE001 - every failure of a mutant is the mutant's
                    raised[name] = f"{type(e).__name__}: {e}"
    rows = [{"engine": name, "seed": seed, "parity_gate": f"failed: {error}", "ratio": math.inf}
            for name, error in raised.items() for seed in range(seeds)]
    # the reference and twins each engine is judged against, replayed as the gate's References builds them
    # (seed 0 is the gate's own); an fp16 engine's extra skips forced on both (References.compared)
    built: dict[tuple, Trainer] = {}

    def replay(seed: int | None, skips: frozenset) -> Trainer:
        if (seed, skips) not in built:
            twin = Trainer(baseline, config, device, rank, world_size, steps)
            twin.forced_skips = set(skips)
            if seed is not None:
                twin.rerounding = parity.Rerounding(
                    twin.model, parity.ULP[precision],
                    config.run.seed + parity.SEED_OFFSET + 1000 * seed + rank, device)
            for _ in range(steps):
                twin.step()
            built[seed, skips] = twin
        return built[seed, skips]

    ref_skips = parity.skipped_at(reference)
    for name, trainer in trainers.items():
        if name in raised:
            continue
        skips = parity.skipped_at(trainer)
        extra = frozenset(skips - ref_skips)
        judge = replay(None, extra) if extra else reference
        judged = (skips, parity.skipped_at(judge))
        for seed in range(seeds):
            row = parity.gate(trainer, judge, replay(seed, extra), judged)
            checks = [(row["param_update_distance"], row["parity_update_bound"]),
                      (row["param_update_distance_max"], row["parity_tensor_bound"]),
                      (row["loss_rel_distance"], row["parity_loss_bound"])]
            rows.append(row | {"engine": name, "seed": seed,
                               "ratio": max(v / b for v, b in checks if b is not None)})
    return rows
