"""Built-in workloads: models built in code, synthetic data generated on the device, FLOP counts."""

from .base import Batch, SyntheticDataset, Workload, WorkloadOptions
from .registry import WORKLOADS, get_workload

__all__ = ["Batch", "SyntheticDataset", "Workload", "WorkloadOptions", "WORKLOADS", "get_workload"]
