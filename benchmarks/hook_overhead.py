"""Host time each engine adds per parameter tensor in a backward (world size 1, gloo, one thread).

Models of n tiny Linear layers make backward's own compute negligible, so (step with the engine − step of
the bare module) / n is the per-tensor cost of the engine's hooks, bucket copies and end-of-backward work.
On a GPU this is host time that hides behind the device's kernels unless the host is the bottleneck.

    python benchmarks/hook_overhead.py      (prints one line per model size; ~1 minute on 2 cores)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ddp_core import DistributedDataParallel

SIZES = (40, 160, 320)  # parameter tensors (the 360M transformer has ~290, ResNet-50 161)
WARMUP, STEPS = 20, 300


def tiny_layers(n: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(n // 2)])


def per_round_steps_s(models: dict[str, nn.Module], x: torch.Tensor) -> dict[str, list[float]]:
    """Every model stepped once per round, the first one rotating (noise lands on all alike)."""
    names = list(models)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(WARMUP + STEPS):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            t0 = time.perf_counter()
            models[name](x).sum().backward()
            if r >= WARMUP:
                times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0,
                                world_size=1)
        x = torch.randn(4, 8)
        for n in SIZES:
            models = {"bare": tiny_layers(n), "torch": nn.parallel.DistributedDataParallel(tiny_layers(n))}
            for strategy in ("bucketed", "overlap"):
                models[strategy] = DistributedDataParallel(tiny_layers(n), strategy=strategy)
            times = per_round_steps_s(models, x)
            # per round: engine step − bare step, so a slow round cancels; median over rounds
            extra = {name: statistics.median(t - b for t, b in zip(times[name], times["bare"])) / n * 1e6
                     for name in models if name != "bare"}
            print(f"{n} tensors: host µs per parameter tensor beyond the bare module (median of per-round "
                  "differences): " + ", ".join(f"{name} {us:.1f}" for name, us in extra.items()))
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
