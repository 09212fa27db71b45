"""ddp_core: a small, readable DistributedDataParallel engine, comparable line by line with torch's DDP."""

from .buckets import assign_buckets
from .distributed import DistributedDataParallel, Options

DDP = DistributedDataParallel

__all__ = ["DDP", "DistributedDataParallel", "Options", "assign_buckets"]
