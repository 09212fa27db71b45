"""Workloads: a model, its synthetic data, its loss and its FLOPs, behind one interface.

The public interface is `Workload` (with `SyntheticDataset` for its data and `WorkloadOptions` for the
`[workload]` keys): the built-in families (`mlp`, `transformer`, `resnet`, `hf:<dir>`) implement it, and so
does a user's own class, named by `workload.model = "path/to/file.py:Name"` or `"package.module:Name"`.
"""

from .base import Batch, SyntheticDataset, Workload, WorkloadOptions
from .registry import WORKLOADS, get_workload
from .user import (
    UserModelError,
    check_model_unchanged,
    describe_model_spec,
    is_user_spec,
    load_workload_class,
    model_label,
    resolve_model_spec,
)

__all__ = ["Batch", "SyntheticDataset", "Workload", "WorkloadOptions", "WORKLOADS", "get_workload",
           "UserModelError", "check_model_unchanged", "describe_model_spec", "is_user_spec",
           "load_workload_class", "model_label", "resolve_model_spec"]
