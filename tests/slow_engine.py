"""A test-only engine, registered through DDPBENCH_ENGINE_MODULES (tests/test_race_run.py): torch DDP that
sleeps SLOW_MS in every forward, so a race has a candidate slower than the others in every round, whatever
the machine's load."""

from __future__ import annotations

import time

from bench.engines.torch_ddp import TorchDDP

SLOW_MS = 40.0  # tens of times the tiny MLP's step on the CPU: no round of a race goes its way


class SlowTorch(TorchDDP):
    def wrap(self, module, bucket_cap_mb, comm_dtype, device, **options):
        model = super().wrap(module, bucket_cap_mb, comm_dtype, device, **options)
        model.register_forward_pre_hook(lambda *_: time.sleep(SLOW_MS / 1e3))
        return model


ENGINE = SlowTorch("slowtorch", f"test-only: torch DDP sleeping {SLOW_MS:g} ms in every forward")
