"""The workload registry: the runner selects a workload by family name and size."""

from __future__ import annotations

from .base import Workload, WorkloadOptions
from .mlp import MLPWorkload

WORKLOADS: dict[str, type[Workload]] = {
    "mlp": MLPWorkload,
}


def get_workload(model: str, size: str, options: WorkloadOptions | None = None) -> Workload:
    """Build the workload `model` at `size`; unknown names raise ValueError naming the key and value."""
    if model not in WORKLOADS:
        raise ValueError(f"model={model!r} is not a known workload; choose from {sorted(WORKLOADS)}")
    return WORKLOADS[model](size, options)
