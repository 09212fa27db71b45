"""A test-only engine, registered through DDPBENCH_ENGINE_MODULES (tests/test_engines.py): ddp_core's
naive strategy under another name, with facts of its own, so the suite must ask the engine rather than
test a name."""

from __future__ import annotations

from bench.engines.ddp_core_engines import DdpCore


class RenamedNaive(DdpCore):
    def wrap(self, module, bucket_cap_mb, comm_dtype, device):
        import ddp_core

        return ddp_core.DistributedDataParallel(module, strategy="naive", bucket_cap_mb=bucket_cap_mb)


ENGINE = RenamedNaive("plainsync", "test-only: one blocking all-reduce per parameter", has_buckets=False,
                      overlaps_backward=False)
