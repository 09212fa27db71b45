"""The workload registry: the runner selects a workload by family name and size.

`hf:<local path>` is the one name outside the table: a local Hugging Face checkpoint (see `hf.py`).
"""

from __future__ import annotations

from .base import Workload, WorkloadOptions
from .hf import PREFIX as HF_PREFIX
from .hf import HFWorkload
from .mlp import MLPWorkload
from .resnet import ResNetWorkload
from .transformer import TransformerWorkload

WORKLOADS: dict[str, type[Workload]] = {
    "mlp": MLPWorkload,
    "transformer": TransformerWorkload,
    "resnet": ResNetWorkload,
}


def get_workload(model: str, size: str, options: WorkloadOptions | None = None) -> Workload:
    """Build the workload `model` at `size`; unknown names raise ValueError naming the key and value."""
    if model.startswith(HF_PREFIX):
        return HFWorkload(model[len(HF_PREFIX):], size, options)
    if model not in WORKLOADS:
        raise ValueError(f"model={model!r} is not a known workload; choose from "
                         f"{sorted(WORKLOADS)} or 'hf:<local path>'")
    return WORKLOADS[model](size, options)
