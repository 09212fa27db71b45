"""The four engines behind one call: wrap a module, and ask the wrapped module about its buckets.

`torch` is torch.nn.parallel.DistributedDataParallel (compressed comm via the default fp16/bf16 comm
hooks); `naive | bucketed | overlap` are ddp_core strategies. The training loop is the same for all.
"""

from __future__ import annotations

import torch
from torch import nn

COMM_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_BUCKET_MB = 25.0  # torch DDP's default; the value naive (no buckets) passes to ddp_core
MiB = 1024 * 1024


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
                                            comm_dtype=COMM_DTYPES[comm_dtype])


def bucket_sizes_bytes(engine: str, model: nn.Module, bucket_cap_mb: float | None) -> list[int]:
    """The all-reduce message sizes the engine uses, as far as it tells.

    ddp_core reports them (`bucket_sizes_bytes`; one per parameter for naive). torch DDP's reducer does
    not expose them publicly: approximate by cutting the gradient bytes at bucket_cap_mb, in reverse
    parameter order, never splitting a parameter (what its reducer does after the first iteration).
    """
    if hasattr(model, "bucket_sizes_bytes"):
        return [int(s) for s in model.bucket_sizes_bytes]
    cap = (DEFAULT_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb) * MiB
    sizes, current = [], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        nbytes = p.numel() * p.element_size()
        if current and current + nbytes > cap:
            sizes.append(current)
            current = 0
        current += nbytes
    if current:
        sizes.append(current)
    return sizes


def sync_wait_ms(model: nn.Module) -> float | None:
    """Host time the last backward spent reducing/waiting at its end (ddp_core only); None otherwise."""
    return getattr(model, "last_sync_wait_ms", None)
