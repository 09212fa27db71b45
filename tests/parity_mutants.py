"""Test-only broken engines for the parity gate's tests (tests/test_parity.py) and its margin benchmark
(benchmarks/parity_margin.py). Each keeps every rank's parameters identical (the ranks-agree check cannot see
it) and hands the optimizer a wrong gradient:

- `drop8`: torch DDP whose comm hook zeroes every 8th element of each averaged bucket;
- `sum`: torch DDP whose comm hook sums the ranks' gradients instead of averaging (world size × too large);
- `stale`: torch DDP whose comm hook hands back the bucket it reduced at the previous step (one step stale);
- `no-sync`: fsdp2 whose gradient sync is off for good (a no_sync without `finally`): its shards get none.

And one honest engine whose trajectory is not torch DDP's:
- `skip1`: its first step's loss is infinite (its first leaf module's output × inf, once), so an fp16 cell's
  GradScaler skips that step and halves its scale; its weights are then a step behind the reference's,
  which the teacher-forced gate must not see (the trajectory gate called this `diverged`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

MUTANTS = ("drop8", "sum", "stale", "no-sync", "skip1")


def _reduced(bucket, divide: bool):
    tensor = bucket.buffer()
    fut = dist.all_reduce(tensor, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(dist.get_world_size()) if divide else f.value()[0])


def comm_hook(mutant: str):
    """A DDP comm hook that breaks the sync as `mutant` says (torch's register_comm_hook signature)."""
    previous: dict[int, torch.Tensor] = {}

    def hook(state, bucket):
        if mutant == "sum":
            return _reduced(bucket, divide=False)

        def after(fut):
            out = fut.value()
            if mutant == "drop8":
                out[::8] = 0
                return out
            stale = previous.get(bucket.index(), out).clone()
            previous[bucket.index()] = out.clone()
            return stale
        return _reduced(bucket, divide=True).then(after)
    return hook


def mutate(trainer, mutant: str) -> None:
    """Break a freshly built trainer (before its first step) as `mutant` says."""
    if mutant == "no-sync":
        trainer.model.set_requires_gradient_sync(False)
    elif mutant == "skip1":
        leaf = next(m for m in trainer.model.modules() if not list(m.children()) and list(m.parameters()))

        def once(module, inputs, output):
            handle.remove()
            return output * math.inf
        handle = leaf.register_forward_hook(once)
    else:
        trainer.model.register_comm_hook(state=None, hook=comm_hook(mutant))


def gate_cases(rank: int, world_size: int, model: str, model_size: str, precision: str, steps: int,
               engines: list[str]) -> list[dict]:
    """One process group's side of the gate's cases for one model and precision (the test's and the
    margin benchmark's): each of `engines` — "fsdp2", "torch+inductor", "ddp_core", or "<engine> <mutant>"
    — built and stepped `steps` times (their weights then differ from the reference's, as a run's do after
    its timed rounds), then gated as a run gates it (parity.References, parity.gate). Per engine the gate's
    row and its ratio (the larger of error / bound over all tensors and on the worst tensor)."""
    from bench.config import load_config
    from bench.matrix import expand
    from bench.worker import parity
    from bench.worker.trainer import Trainer

    def cell_for(engine: str, compile_: bool = False):
        sets = [f"workload.model={model}", f"workload.model_size={model_size}", f"matrix.engine={engine}",
                f"matrix.world_size={world_size}", f"matrix.precision={precision}", "matrix.grad_accum=1",
                "matrix.scaling=strong", "workload.global_batch=8", "matrix.bucket_cap_mb=1"]
        sets += ["workload.seq_len=32"] * (model == "transformer")
        sets += ["matrix.compile=inductor"] if compile_ else []
        sets += ["matrix.reshard_after_forward=true"] if engine == "fsdp2" else []
        config = load_config("cpu-smoke", sets)
        (cell,) = expand(config)
        return cell, config

    device = torch.device("cpu")
    torch_cell, config = cell_for("torch")
    schedule = max(steps, parity.GATE_STEPS)  # the gate reads the first GATE_STEPS steps' batches
    reference = Trainer(torch_cell, config, device, rank, world_size, schedule)
    trainers = {}
    for name in engines:
        engine, _, mutant = name.partition(" ")
        if engine == "torch+inductor":
            cell = cell_for("torch", compile_=True)[0]
        else:
            cell = cell_for(engine)[0]
        trainers[name] = Trainer(cell, config, device, rank, world_size, schedule)
        if mutant:
            mutate(trainers[name], mutant)
    for _ in range(steps):
        reference.step()
        for trainer in trainers.values():
            trainer.step()
    references = parity.References([reference], config, rank, world_size)
    rows = []
    for name, trainer in trainers.items():
        skipped = trainer.precision.skipped_steps()  # the gate leaves the scaler alone
        row = parity.gate(trainer, references) | {"skipped_before_gate": skipped}
        ratio = max(row["parity_grad_error"] / row["parity_grad_bound"],
                    row["parity_tensor_error"] / row["parity_tensor_bound"])
        rows.append(row | {"engine": name, "ratio": ratio if math.isfinite(ratio) else math.inf})
    return rows
