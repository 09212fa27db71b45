"""Test-only engines that fail, registered through DDPBENCH_ENGINE_MODULES (tests/test_cell_guard.py): one
raises in `wrap` (before its first step), one only after its timed rounds (asked for its bucket layout).
Beside torch DDP and naive in one side-by-side group, each must fail alone with its own error."""

from __future__ import annotations

from bench.engines.ddp_core_engines import DdpCore


class BoomInWrap(DdpCore):
    def wrap(self, module, bucket_cap_mb, comm_dtype, device):
        raise RuntimeError("boom-in-wrap")


class BoomLate(DdpCore):
    def wrap(self, module, bucket_cap_mb, comm_dtype, device):
        import ddp_core

        return ddp_core.DistributedDataParallel(module, strategy="naive", bucket_cap_mb=bucket_cap_mb)

    def bucket_sizes_bytes(self, model, bucket_cap_mb):
        raise RuntimeError("boom-late: no bucket layout")


ENGINES = [BoomInWrap("boom", "test-only: wrap raises", has_buckets=False, overlaps_backward=False),
           BoomLate("boomlate", "test-only: raises after its timed rounds", has_buckets=False,
                    overlaps_backward=False)]
