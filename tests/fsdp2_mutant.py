"""A test-only engine, registered through DDPBENCH_ENGINE_MODULES (tests/test_peers.py): fsdp2 that never
synchronises gradients (its gradient sync switched off at wrap and never back on: the no_sync without a
`finally` that picotron's DDP has). Each rank keeps its gradients unreduced and its sharded parameters
never get a gradient, so the parity gate against torch DDP must fail: the cell is `diverged`."""

from __future__ import annotations

import dataclasses

from bench.engines.fsdp2 import ENGINE as FSDP2


class NeverSyncs(type(FSDP2)):
    def wrap_cell(self, module, cell, workload, device):
        model = super().wrap_cell(module, cell, workload, device)
        model.set_requires_gradient_sync(False)
        return model


ENGINE = NeverSyncs(**{f.name: getattr(FSDP2, f.name) for f in dataclasses.fields(FSDP2)}
                    | {"name": "fsdp2nosync", "summary": "test-only: fsdp2 that never reduces gradients",
                       "options": ("reshard_after_forward",)})
