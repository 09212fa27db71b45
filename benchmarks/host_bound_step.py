"""Is a training step host-bound on this GPU? smollm2-135m's classifier at sequence length 128 on one GPU,
without DDP, for batch 12 and 64, bf16 (autocast) and fp32 (TF32 off), foreach and fused AdamW: the wall
time per step, the host time spent enqueueing it, the kernel time per step (torch.profiler) and the kernels
per step; then the host cost of one tiny CUDA op. One unpaired run per configuration: a reading, not a
comparison. README "What one lent H100 showed" quotes it (an H100 in a VM, 2026-11-25).

    PYTHONPATH=. python benchmarks/host_bound_step.py      # needs a CUDA device
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from bench.workloads.transformer import TRANSFORMER_SIZES, TransformerForSequenceClassification

STEPS, PROFILED, TINY_OPS = 20, 5, 20000


def reading(device: torch.device, batch: int, precision: str, fused: bool) -> str:
    torch.manual_seed(0)
    model = TransformerForSequenceClassification(TRANSFORMER_SIZES["smollm2-135m"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, foreach=None if fused else True)
    x = torch.randint(0, 49152, (batch, 128), device=device)
    y = torch.randint(0, 2, (batch,), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16" else nullcontext():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize(device)
    host, t0 = 0.0, time.perf_counter()
    for _ in range(STEPS):
        h0 = time.perf_counter()
        step()
        host += time.perf_counter() - h0
    torch.cuda.synchronize(device)
    wall = (time.perf_counter() - t0) / STEPS * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            step()
        torch.cuda.synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / PROFILED / 1e3
    return (f"batch {batch:3d} {precision} fused={fused!s:5} wall/step {wall:7.2f} ms  host enqueue/step "
            f"{host / STEPS * 1e3:7.2f} ms  kernel time/step {busy:7.2f} ms  "
            f"kernels/step {len(kernels) // PROFILED}")


def main() -> None:
    device = torch.device("cuda", 0)
    torch.backends.cuda.matmul.fp32_precision = "ieee"  # fp32 means fp32, as the suite's fp32 cells
    for batch in (12, 64):
        for precision in ("bf16", "fp32"):
            for fused in (False, True):
                print(reading(device, batch, precision, fused), flush=True)
    x = torch.zeros(16, device=device)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(TINY_OPS):
        x.add_(1)
    t1 = time.perf_counter()
    torch.cuda.synchronize(device)
    print(f"tiny CUDA op: host {(t1 - t0) / TINY_OPS * 1e6:.1f} us/op, "
          f"wall {(time.perf_counter() - t0) / TINY_OPS * 1e6:.1f} us/op")


if __name__ == "__main__":
    main()
