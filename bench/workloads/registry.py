"""The workload registry: the runner selects a workload by family name and size.

Two kinds of name live outside the table: `hf:<local path>`, a local Hugging Face checkpoint (see `hf.py`),
and a user spec, `path/to/file.py:Name` or `package.module:Name` (see `user.py`).
"""

from __future__ import annotations

from .base import Workload, WorkloadOptions
from .hf import PREFIX as HF_PREFIX
from .hf import HFWorkload
from .mlp import MLPWorkload
from .resnet import ResNetWorkload
from .transformer import TransformerWorkload
from .user import build_user_workload, is_user_spec

WORKLOADS: dict[str, type[Workload]] = {
    "mlp": MLPWorkload,
    "transformer": TransformerWorkload,
    "resnet": ResNetWorkload,
}


def get_workload(model: str, size: str, options: WorkloadOptions | None = None) -> Workload:
    """Build the workload `model` at `size`; unknown names raise ValueError naming the key and value.

    A user spec is imported (once per process and file content) and built as `Name(size, options)`.
    """
    if model.startswith(HF_PREFIX):
        return HFWorkload(model[len(HF_PREFIX):], size, options)
    if is_user_spec(model):
        return build_user_workload(model, size, options)
    if model not in WORKLOADS:
        raise ValueError(f"model={model!r} is not a known workload; choose from {sorted(WORKLOADS)}, "
                         "'hf:<local path>', 'path/to/file.py:Name' or 'package.module:Name'")
    return WORKLOADS[model](size, options)
