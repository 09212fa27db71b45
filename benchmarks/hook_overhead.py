"""Host time each engine adds per parameter tensor in a backward, and what it would cost on a GPU.

World size 1, gloo, one thread; engines interleaved round by round (bench.stats.round_order),
each round's engine time minus the bare module's in the same round, median over rounds, divided by the
number of parameter tensors. Two settings, because the answer depends on the cache:

- warm: models of n tiny Linear layers (n = 40, 160, 320 tensors), so backward's own compute is
  negligible and the hooks run back to back with the interpreter's code and data in cache;
- real: the backward of resnet/tiny, where the kernels between two hooks evict them, so every hook runs
  cold (several times slower per Python call: ddp_core/labels.py). Its 38 tensors hold 1.2 MB, so the
  work per byte (copies into and out of the buckets, the same in every engine) stays small beside the
  work per tensor; in a larger model it dominates and its noise hides a few µs per tensor.

Then the estimate for GPU nodes: (ddp_core − torch DDP) µs per tensor in the real backward × the tensors
of the gpu-node preset's model (and of ResNet-50), against that model's step time at an *assumed* 40 % MFU
on the datasheet bf16 peak of an H100 SXM and an A100 (bench.peaks) — an assumption, not a measurement.
On a GPU, host time hides behind the device's kernels unless the host is the bottleneck; the share
printed is what it would cost if it did not hide at all.

    python benchmarks/hook_overhead.py      (~1.5 minutes on 2 cores)
"""

from __future__ import annotations

import copy
import inspect
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from bench import stats
from bench.peaks import PEAKS
from bench.workloads import WorkloadOptions, get_workload
from ddp_core import DistributedDataParallel

SIZES = (40, 160, 320)  # parameter tensors (the 360M transformer has ~290, ResNet-50 161)
WARMUP, STEPS = 20, 300
REAL = ("resnet", "tiny", 16, 400)  # family, size, per-rank batch, rounds
ASSUMED_MFU = 0.40
# the gpu-node preset's model at its weak per-rank batch (12) and at 8-rank strong scaling (64 / 8), and
# ResNet-50 at NVIDIA's DGX A100 recipe batch (256 per GPU; tests/data/published_scaling)
GPU_MODELS = (("transformer", "smollm2-360m", 12), ("transformer", "smollm2-360m", 8),
              ("resnet", "resnet50", 256))
GPUS = ("h100-sxm", "a100-sxm")
ENGINES = ("torch", "bucketed", "overlap")


def engines_around(module: nn.Module) -> dict[str, nn.Module]:
    """The bare module and one copy of it under each engine (ddp_core with torch's 1 MiB first bucket),
    and under each engine's batched_grad_copy."""
    models = {"bare": module, "torch": nn.parallel.DistributedDataParallel(copy.deepcopy(module))}
    for strategy in ("bucketed", "overlap"):
        models[strategy] = DistributedDataParallel(copy.deepcopy(module), strategy=strategy,
                                                   first_bucket_mb=1.0)
    # both engines' batched_grad_copy: one foreach copy and one division per bucket (torch: when it has it)
    if "batched_grad_copy" in inspect.signature(nn.parallel.DistributedDataParallel).parameters:
        models["torch batched"] = nn.parallel.DistributedDataParallel(copy.deepcopy(module),
                                                                      batched_grad_copy=True)
    models["overlap batched"] = DistributedDataParallel(copy.deepcopy(module), first_bucket_mb=1.0,
                                                        batched_grad_copy=True)
    return models


def extra_us_per_tensor(models: dict[str, nn.Module], backward_s, rounds: int, n_tensors: int) -> dict:
    """Per engine: median over rounds of (engine's backward − bare module's backward) / tensors, in µs."""
    names = list(models)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(WARMUP + rounds):
        for name in (names[e] for e in stats.round_order(r, len(names))):
            seconds = backward_s(models[name])
            if r >= WARMUP:
                times[name].append(seconds)
    return {name: statistics.median(t - b for t, b in zip(times[name], times["bare"])) / n_tensors * 1e6
            for name in names if name != "bare"}


def warm(n: int) -> dict:
    torch.manual_seed(0)
    models = engines_around(nn.Sequential(*[nn.Linear(8, 8) for _ in range(n // 2)]))
    x = torch.randn(4, 8)

    def backward_s(model):
        t0 = time.perf_counter()
        model(x).sum().backward()
        return time.perf_counter() - t0

    return extra_us_per_tensor(models, backward_s, STEPS, n)


def real(family: str, size: str, per_rank: int, rounds: int) -> tuple[dict, int]:
    workload = get_workload(family, size)
    torch.manual_seed(0)
    base = workload.build_model()
    models = engines_around(base)
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in models.items()}
    samples = max(per_rank, workload.default_num_samples() or 0)
    batch = workload.make_dataset(samples, torch.device("cpu"), seed=0).batch(torch.arange(per_rank))
    by_model = {id(m): name for name, m in models.items()}

    def backward_s(model):  # the backward alone: forwards differ (torch DDP's Python pre/post forward)
        opts[by_model[id(model)]].zero_grad(set_to_none=True)
        loss = workload.loss(model, batch)
        t0 = time.perf_counter()
        loss.backward()
        return time.perf_counter() - t0

    n = sum(1 for p in base.parameters() if p.requires_grad)
    return extra_us_per_tensor(models, backward_s, rounds, n), n


def gpu_estimate(extra_us: float) -> None:
    """Print, per GPU model and GPU, the step time at ASSUMED_MFU and ddp_core's extra host time."""
    print(f"\nGPU estimate at an assumed {ASSUMED_MFU:.0%} MFU (bf16 datasheet peak), with ddp_core's "
          f"overlap {extra_us:+.1f} µs per tensor against torch DDP (the real backward above):")
    for family, size, per_rank in GPU_MODELS:
        options = WorkloadOptions(seq_len=128) if family == "transformer" else None  # the preset's
        workload = get_workload(family, size, options)
        with torch.device("meta"):
            n = sum(1 for p in workload.build_model().parameters() if p.requires_grad)
        flops = workload.train_flops_per_sample() * per_rank
        for gpu in GPUS:
            step_ms = flops / (ASSUMED_MFU * PEAKS[gpu].flops["bf16"]) * 1e3
            more_ms = extra_us * n / 1e3
            print(f"  {family}/{size} ({n} tensors), per-rank batch {per_rank}, {PEAKS[gpu].name}: step "
                  f"~{step_ms:.1f} ms; ddp_core {more_ms:+.2f} ms of host time per step against torch DDP "
                  f"({more_ms / step_ms:+.1%} of the step if none of it hid behind the GPU)")


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0,
                                world_size=1)
        print("host µs per parameter tensor beyond the bare module's backward (median of per-round "
              "differences)")
        for n in SIZES:
            extra = warm(n)
            print(f"  warm, {n} tiny tensors: " + ", ".join(f"{k} {v:.1f}" for k, v in extra.items()))
        family, size, per_rank, rounds = REAL
        extra, n = real(family, size, per_rank, rounds)
        print(f"  real, {family}/{size} ({n} tensors): "
              + ", ".join(f"{k} {v:.1f}" for k, v in extra.items()))
        dist.destroy_process_group()
    gpu_estimate(extra["overlap"] - extra["torch"])


if __name__ == "__main__":
    main()
