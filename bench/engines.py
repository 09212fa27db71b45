"""The four engines behind one call: wrap a module, and ask the wrapped module about its buckets.

`torch` is torch.nn.parallel.DistributedDataParallel (compressed comm via the default fp16/bf16 comm
hooks); `naive | bucketed | overlap` are ddp_core strategies. The training loop is the same for all.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.schema import COMM_DTYPES, DEFAULT_BUCKET_MB, MiB

# bench.schema.COMM_DTYPES → the dtype gradients travel in (None: their own dtype, no compression)
COMM_TORCH_DTYPES = dict(zip(COMM_DTYPES, (None, torch.float16, torch.bfloat16), strict=True))


def wrap(engine: str, module: nn.Module, bucket_cap_mb: float | None, comm_dtype: str,
         device: torch.device) -> nn.Module:
    """`module` (already on `device`) wrapped by `engine`; the default process group is used."""
    bucket = DEFAULT_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb
    if engine == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=bucket)
        hook = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
        if comm_dtype in hook:
            model.register_comm_hook(state=None, hook=hook[comm_dtype])
        return model
    import ddp_core

    return ddp_core.DistributedDataParallel(module, strategy=engine, bucket_cap_mb=bucket,
                                            comm_dtype=COMM_TORCH_DTYPES[comm_dtype])


def bucket_sizes_bytes(engine: str, model: nn.Module, bucket_cap_mb: float | None) -> list[int]:
    """The all-reduce message sizes the engine uses, as far as it tells.

    ddp_core reports them (`bucket_sizes_bytes`; one per parameter for naive). torch DDP's reducer does
    not expose them publicly: compute them with ddp_core's `assign_buckets`, which follows the rule of
    torch's `compute_bucket_assignment_by_size` (reverse parameter order, a bucket closes once it reaches
    the cap, one dtype per bucket). With an explicit bucket_cap_mb, as here, torch 2.13 uses that cap for
    the first bucket too. The real layout after torch's rebuild follows gradient-ready order, which for
    most models is this order.
    """
    if hasattr(model, "bucket_sizes_bytes"):
        return [int(s) for s in model.bucket_sizes_bytes]
    from ddp_core import assign_buckets

    params = list(reversed([p for p in model.parameters() if p.requires_grad]))
    sizes = [p.numel() * p.element_size() for p in params]
    cap = int((DEFAULT_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb) * MiB)
    groups = assign_buckets(sizes, max(1, cap), keys=[(p.dtype, p.device) for p in params])
    return [sum(sizes[i] for i in group) for group in groups]


def sync_wait_ms(model: nn.Module, device: torch.device) -> float | None:
    """The time the last backward spent reducing/waiting for its gradients at its end: ddp_core's
    `last_sync_wait_ms` on CPU; None for torch DDP (it does not say) and on CUDA.

    ddp_core measures host time. With gloo a collective's `wait()` blocks the host until the reduction is
    done, so host time is the wait. With NCCL `wait()` only makes the current stream wait for the NCCL
    stream and returns at once: the host time is the time to enqueue, not the time the GPU waited. Device
    time would need CUDA events recorded inside the engine's end-of-backward callback, which ddp_core does
    not expose; the profiled pass's `sync_grads` range and `exposed_comm_ms` show the wait on CUDA.
    """
    if device.type == "cuda":
        return None
    return getattr(model, "last_sync_wait_ms", None)
