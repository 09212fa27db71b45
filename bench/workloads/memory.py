"""What trainers hold on their device: the model the side-by-side groups are sized with
(bench/worker/groups.py) and the GPU presets are checked against (tests/test_memory_model.py).

One trainer stepping a micro-batch of b samples holds, allocated:

    resident state (its engine's layout: Engine.state_bytes_per_rank — parameters, gradients with their
    flat bucket copy, AdamW's two moments)
  + the precision's weight copies (autocast casts every weight a matmul reads to bf16/fp16 once per forward
    and keeps it for backward: 2 bytes per parameter)
  + the activations its backward saves: b × activation_bytes_per_sample(precision), measured by a probe
    (`saved_bytes`: the tensors autograd saves during one forward and loss on the CPU, parameters left out),

and every other trainer of its group, waiting its turn, holds its resident state (counted whole: between
steps a replicating engine frees its gradients but keeps their flat bucket copy; the bound errs high). The
device then shows the caching allocator's reserve above what is allocated (RESERVED_OVER_ALLOCATED) and the
CUDA context, cuBLAS's workspaces and, above one rank, NCCL's buffers (CONTEXT_BYTES, NCCL_RESERVE_BYTES).

Validated on one H200 (2026-11-28, smollm2-360m, seq 512, torch DDP, one trainer: tests/data/gpu_evidence):
the probe gives 1.631 MiB a token at bf16 and 2.431 at fp32, against 1.651 (the slope between 12 × 512 and
48 × 512 tokens) and 2.335 measured; the model's allocated peak is within 2 % of all three cells
(17,612 / 47,675 / 21,837 MiB predicted against 17,903 / 48,326 / 22,104 measured) and its device total
within 3 %. fsdp2 (whose bf16 activations are smaller: its residual stream is bf16) and a compiled cell
(which saves less) measured 13.7 and 14.5 GB against torch's 17.9: the model errs high for them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

# CUDA context, cuBLAS workspaces and the allocator's own: device used − reserved, the same 1,326.9 MiB in
# all six H200 cells (one process, one rank, torch 2.11); per process
CONTEXT_BYTES = 1327 * 2**20
# NCCL's device buffers for one communicator above one rank: NCCL_BUFFSIZE (4 MiB by default) per
# connection for the Simple protocol, twice for LL128 and LL, × 2 peers per channel × 32 channels = 512 MiB,
# rounded up to 1 GiB for tree and NVLS connections (assumed, not measured: no multi-GPU run yet)
NCCL_RESERVE_BYTES = 2**30
# torch's caching allocator reserves above its allocated peak: 1.031-1.052 in the H200 cells
RESERVED_OVER_ALLOCATED = 1.06
# autocast's cast weights, kept from forward to backward: 2 bytes per parameter at bf16 / fp16
HALF_PRECISIONS = ("bf16", "fp16")


def saved_bytes(model: torch.nn.Module, forward, precision: str) -> int:
    """Bytes of the tensors autograd saves for backward while `forward()` runs (the loss included), the
    model's parameters left out, each storage once; on the CPU under CPU autocast at bf16/fp16 (fp16 is
    measured as bf16: the same two bytes an element)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    half = precision in HALF_PRECISIONS
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
        forward()
    return sum(seen.values())


@lru_cache(maxsize=64)
def _per_sample(model: str, size: str, options, precision: str) -> float | None:
    from bench.workloads import get_workload

    workload = get_workload(model, size, options)
    own = getattr(workload, "activation_bytes_per_sample", None)
    try:
        if own is not None:
            return own(precision)
        return probe_per_sample(workload, precision)
    except Exception:  # noqa: BLE001 - a model the probe cannot run: no estimate (groups fall back)
        return None


def activation_bytes_per_sample(model: str, size: str, options, precision: str) -> float | None:
    """Bytes of saved activations per sample of a micro-batch at `precision` (fp32 for tf32): the
    workload's own `activation_bytes_per_sample` where it has one (the transformer probes two layers and
    scales), else the generic probe (`probe_per_sample`); None when neither can run. Cached per workload."""
    return _per_sample(model, size, options, "fp32" if precision == "tf32" else precision)


def probe_per_sample(workload, precision: str) -> float:
    """The generic probe: the workload's model built on the CPU, its loss on 2 and on 4 samples of its own
    data (2, not 1: BatchNorm refuses one); half the difference is one sample's activations."""
    torch.manual_seed(0)
    model = workload.build_model()
    data = workload.make_dataset(4, torch.device("cpu"), 0)
    sizes = []
    for n in (2, 4):
        batch = data.batch(torch.arange(n))
        sizes.append(saved_bytes(model, lambda b=batch: workload.loss(model, b), precision))
    return max(0.0, (sizes[1] - sizes[0]) / 2)


def trainer_bytes(state: dict[str, int], n_params: int, precision: str, per_sample: float | None,
                  micro_batch: int) -> tuple[int, int]:
    """(allocated while stepping, allocated while waiting) of one trainer: its engine's resident `state`
    (Engine.state_bytes_per_rank's three figures); stepping adds the precision's weight copies and the
    micro-batch's saved activations (0 when not estimated)."""
    resident = sum(state.values())
    copies = 2 * n_params if precision in HALF_PRECISIONS else 0
    activations = 0 if per_sample is None else math.ceil(per_sample * micro_batch)
    return resident + copies + activations, resident


def device_bytes(stepping: int, waiting: list[int], device_type: str, world_size: int) -> int:
    """What the device shows used with one trainer stepping and the others waiting: the allocated peak with
    the allocator's reserve, the CUDA context, NCCL's buffers above one rank (CPU: the allocated bytes)."""
    allocated = stepping + sum(waiting)
    if device_type != "cuda":
        return allocated
    return (math.ceil(RESERVED_OVER_ALLOCATED * allocated) + CONTEXT_BYTES
            + (NCCL_RESERVE_BYTES if world_size > 1 else 0))
