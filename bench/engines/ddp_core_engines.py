"""`naive`, `bucketed`, `overlap`: ddp_core's three strategies (ddp_core/distributed.py)."""

from __future__ import annotations

from bench.engines.base import Engine, compile_line, flag
from bench.schema import DEFAULT_BUCKET_MB, WIRE_DTYPES


class DdpCore(Engine):
    def wrap(self, module, bucket_cap_mb, comm_dtype, device, gradient_as_bucket_view=False):
        import torch

        import ddp_core

        dtype = WIRE_DTYPES[comm_dtype].torch_dtype
        return ddp_core.DistributedDataParallel(module, strategy=self.name, bucket_cap_mb=bucket_cap_mb,
                                                comm_dtype=getattr(torch, dtype) if dtype else None,
                                                gradient_as_bucket_view=bool(gradient_as_bucket_view))

    def wrap_cell(self, module, cell, workload, device):
        # the option only where this engine takes it (a subclass's `wrap` may not know the keyword)
        views = {} if cell.gradient_as_bucket_view is None else {
            "gradient_as_bucket_view": cell.gradient_as_bucket_view}
        return self.wrap(module, cell.wrap_bucket_mb, cell.comm_dtype, device, **views)

    def bucket_sizes_bytes(self, model, bucket_cap_mb):
        return [int(s) for s in model.bucket_sizes_bytes]  # naive: one per parameter

    def script_wrap(self, row):
        """This repository's package (pip install -e .): ddp_core's DistributedDataParallel."""
        wire = WIRE_DTYPES[row["comm_dtype"]]
        dtype = f"torch.{wire.torch_dtype}" if wire.torch_dtype else "None"
        bucket = row["bucket_cap_mb"]
        bucket = DEFAULT_BUCKET_MB if bucket is None or bucket != bucket else bucket
        return ["from ddp_core import DistributedDataParallel"], [
            *compile_line(row),
            f'model = DistributedDataParallel(model, strategy="{self.name}", bucket_cap_mb={bucket:g},',
            f"                                comm_dtype={dtype}, "
            f"gradient_as_bucket_view={flag(row.get('gradient_as_bucket_view'))})"]

    def sync_wait_ms(self, model, device):
        """ddp_core's `last_sync_wait_ms`, on CPU only. With gloo a collective's `wait()` blocks the host
        until the reduction is done, so host time is the wait; with NCCL `wait()` only makes the current
        stream wait and returns at once (the host time would be the time to enqueue)."""
        return None if device.type == "cuda" else getattr(model, "last_sync_wait_ms", None)


ENGINES = (
    DdpCore("naive", "ddp_core: one blocking all-reduce per parameter after backward", has_buckets=False,
            overlaps_backward=False),
    DdpCore("bucketed", "ddp_core: flat buckets reduced after backward", overlaps_backward=False,
            options=("gradient_as_bucket_view",)),
    DdpCore("overlap", "ddp_core: a bucket's async all-reduce starts from the hook that completes it",
            options=("gradient_as_bucket_view",)),
)
