"""The workload interface the runner builds against: a model family, its synthetic data and its loss.

A workload is chosen by `model` (family, e.g. "mlp", "transformer", "resnet") and `size` (a preset within
the family, e.g. "tiny", "360m"). The runner only ever calls the methods below, so adding a workload is
adding a subclass and registering it in `bench.workloads.registry`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
from torch import nn

Batch = dict[str, torch.Tensor]


class SyntheticDataset(abc.ABC):
    """A map-style dataset that lives on the target device, indexed in whole batches.

    Batches are cut from device tensors by index (no per-sample Python collate, no host→device copy),
    so that a timed step measures the model and the communication, not data loading.
    `DistributedSampler` supplies the indices; `len()` is what it shards.
    """

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def batch(self, indices) -> Batch:
        """Return the batch for these sample indices, on the dataset's device: a 1-D int64 tensor (on the
        CPU or the dataset's device), or what `stage` returned for them."""

    def stage(self, indices: torch.Tensor, device: torch.device):
        """`indices` (a 1-D int64 CPU tensor) made ready for `batch` once, before any step runs.

        The runner stages its whole index schedule up front so that a step reads only device memory: a
        CPU index tensor copied to the GPU inside a step is a blocking host→device copy, i.e. a CPU-GPU
        sync point in every micro-step. This default moves the indices to `device`; a dataset that needs
        values on the host to cut a batch (a padded width) computes them here instead of in `batch`.
        """
        return indices.to(device)


@dataclass(frozen=True)
class WorkloadOptions:
    """Options shared by all workloads; a workload ignores those that mean nothing to it.

    These are exactly the optional keys of a preset's `[workload]` table besides `model` and `model_size`.
    """

    seq_len: int | None = None       # sequence models: fixed length, or the maximum when lengths vary
    fixed_length: bool = True        # sequence models: False draws MRPC-like lengths, padded per batch
    task: str = "classification"     # sequence models: "classification" (MRPC pairs) | "lm" (causal LM)
    data: str = "synthetic"  # "synthetic", or a local GLUE MRPC file (train.tsv, msr_paraphrase_*.txt)
    image_size: int | None = None    # image models: square input side in pixels


class Workload(abc.ABC):
    """A model family at one size: builds the model, its data, its loss, and counts its FLOPs."""

    family: str = ""
    size: str = ""

    def __init__(self, size: str, options: WorkloadOptions | None = None):
        self.size = size
        self.options = options or WorkloadOptions()

    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model on CPU; deterministic under the caller's `torch.manual_seed`."""

    @abc.abstractmethod
    def make_dataset(self, num_samples: int, device: torch.device, seed: int) -> SyntheticDataset:
        """`num_samples` synthetic samples generated on `device` from `seed` (identical on every rank)."""

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Forward `batch` through `model` and return the scalar mean loss."""

    def default_num_samples(self) -> int | None:
        """The dataset size the workload stands for (MRPC: 3,668 pairs); None when it has none."""
        return None

    def train_flops_per_sample(self, batch: Batch | None = None) -> float | None:
        """Analytic training FLOPs (forward + backward) per sample; None when unknown."""
        return None

    def tokens_in_batch(self, batch: Batch) -> int | None:
        """Tokens in `batch` (padded positions excluded) for sequence models; None otherwise."""
        return None
