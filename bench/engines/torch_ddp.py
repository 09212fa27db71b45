"""`torch`: torch.nn.parallel.DistributedDataParallel, compressed communication through its default
fp16/bf16 comm hooks. The reference every other engine is compared with."""

from __future__ import annotations

from bench.engines.base import Engine
from bench.schema import WIRE_DTYPES, MiB


class TorchDDP(Engine):
    def skip_reason(self, comm_dtype: str, device: str) -> str:
        if comm_dtype == "bf16" and device == "cpu":
            return "engine=torch, comm_dtype=bf16: torch's bf16_compress_hook needs CUDA and NCCL"
        return ""

    def wrap(self, module, bucket_cap_mb, comm_dtype, device):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=bucket_cap_mb)
        hook = WIRE_DTYPES[comm_dtype].torch_hook
        if hook:
            model.register_comm_hook(state=None, hook=getattr(default_hooks, hook))
        return model

    def bucket_sizes_bytes(self, model, bucket_cap_mb):
        """The reducer's rebuilt layout when its logging data has it (`rebuilt_bucket_sizes`, as the parity
        tests read it: bytes, in gradient-ready order; torch records it only at some iterations and
        rebuilds only above world size 1), else torch's assignment rule over the trainable parameters,
        which is the order the rebuild follows for most models."""
        data = model._get_ddp_logging_data() if hasattr(model, "_get_ddp_logging_data") else {}
        text = data.get("rebuilt_bucket_sizes")
        if text:
            return [int(s) for s in str(text).split(",") if s.strip()]
        return assigned_sizes(model, bucket_cap_mb)


def assigned_sizes(model, bucket_cap_mb: float) -> list[int]:
    """torch's bucket assignment (compute_bucket_assignment_by_size, reverse parameter order, a bucket
    closes once it reaches the cap, one dtype per bucket) by ddp_core's `assign_buckets`. With an explicit
    bucket_cap_mb, as here, torch 2.13 uses that cap for the first bucket too."""
    from ddp_core import assign_buckets

    params = list(reversed([p for p in model.parameters() if p.requires_grad]))
    sizes = [p.numel() * p.element_size() for p in params]
    keys = [(p.dtype, p.device) for p in params]
    groups = assign_buckets(sizes, max(1, int(bucket_cap_mb * MiB)), keys=keys)
    return [sum(sizes[i] for i in group) for group in groups]


ENGINE = TorchDDP("torch", "torch.nn.parallel.DistributedDataParallel", reference=True)
