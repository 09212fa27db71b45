"""The workload interface the runner builds against: a model, its synthetic data, its loss, its FLOPs.

A workload is chosen by `model` and `size`: a built-in family ("mlp", "transformer", "resnet") registered
in `bench.workloads.registry`, or your own subclass of `Workload`, named by
`workload.model = "path/to/file.py:Name"` or `"package.module:Name"` (see `bench.workloads.user`).
The runner only ever calls what `Workload` and `SyntheticDataset` declare below.
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

    Contract:
    - `__len__()`: the number of samples.
    - `batch(indices)`: a dict of tensors (`Batch`) whose keys are the workload's own: only its `loss`,
      `tokens_in_batch` and `train_flops_per_sample` read them. `batch` runs inside the timed step (it is
      the trace's `data_movement`), so keep it to indexing: on GPU, no `.item()` or other host sync.
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


def options_set(options: WorkloadOptions) -> dict[str, object]:
    """The options given a value other than their default."""
    default = WorkloadOptions()
    return {f: getattr(options, f) for f in default.__dataclass_fields__
            if getattr(options, f) != getattr(default, f)}


class Workload(abc.ABC):
    """A model at one size: builds the model, its data, its loss, and counts its FLOPs.

    Subclass it for your own model and name it with `workload.model = "path/to/file.py:Name"` (or
    `"package.module:Name"`); the runner then constructs `Name(model_size, options)`, as for the built-ins.

    Constructor `__init__(size, options)`: `size` is `workload.model_size` (a string: what it means is the
    workload's business), `options` a `WorkloadOptions` (the other `[workload]` keys; ignore those that mean
    nothing to you). Call `super().__init__(size, options)`. It runs in the launcher when the config is
    validated and again in every rank, possibly more than once per process: keep it cheap (build nothing
    large here) and raise ValueError naming the key and value for a size or option you do not support.

    Required: `build_model`, `make_dataset`, `loss` (below).
    Optional, each with a default that means "unknown" and leaves its columns empty:
    - `default_num_samples()`: the size of the dataset the workload stands for; None: just enough samples
      for a few steps are generated.
    - `train_flops_per_sample(batch)`: gives `model_tflops_per_s` and, on a GPU with a known peak, `mfu`.
    - `tokens_in_batch(batch)`: gives `tokens_per_s`.
    - attribute `seq_len`: tokens per sample, reported in the `seq_len` column.
    These are called outside the timed steps.
    """

    family: str = ""
    size: str = ""
    # The WorkloadOptions fields this workload reads; setting another one to a non-default value is a
    # config error naming it (a silently ignored option is a mis-measured run). None: not declared (a user
    # workload may read any), nothing is checked.
    uses_options: tuple[str, ...] | None = None
    # The runner calls build_model under `with torch.device(<the cell's device>)`, so the parameters are
    # created and initialised there (a GPU initialises a 360M-parameter model in a fraction of the time a
    # CPU takes, and nothing is copied). False: built on CPU, then moved (for a model loaded from files).
    build_on_device: bool = True

    def __init__(self, size: str, options: WorkloadOptions | None = None):
        self.size = size
        self.options = options or WorkloadOptions()

    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model; deterministic under the caller's `torch.manual_seed`.

        Called once per cell on every rank, after `torch.manual_seed(run.seed)`, under
        `with torch.device(device)` (unless `build_on_device` is False): tensors created without an explicit
        device land on the cell's device. The runner then moves it to the device (a tensor placed elsewhere
        explicitly is moved there) and wraps it in the cell's engine. Every parameter that requires a
        gradient must get one in every step (the engines reject unused parameters). Buffers (e.g.
        BatchNorm's) are allowed.
        """

    @abc.abstractmethod
    def make_dataset(self, num_samples: int, device: torch.device, seed: int) -> SyntheticDataset:
        """`num_samples` synthetic samples generated on `device` from `seed` (identical on every rank)."""

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Forward `batch` through `model` and return the scalar mean loss.

        `model` is the engine's wrapper: call `model(...)`, never `model.module`, because the wrapper's
        forward is where the engines prepare gradient synchronisation. Runs under `torch.autocast` for
        bf16/fp16 cells.
        """

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's repeated units, each sharded and gathered as one group by the fsdp2 engine (then the
        root: what no block holds). Default, as torchtitan shards its models: the members of every
        `nn.ModuleList` / `nn.ModuleDict` in the model, outermost first (a list inside a chosen block stays
        in it) — the decoder layers of a Hugging Face or torchtitan model (`model.layers`); a model with no
        such list, its direct children. Only modules that hold parameters; a container without a forward of
        its own (a list inside a list) gives its members, since fully_shard refuses a module it cannot call.
        A workload whose blocks are elsewhere says so."""
        chosen: list[str] = []
        for name, module in model.named_modules():
            inside = name in chosen or any(name.startswith(c + ".") for c in chosen)
            if inside or not isinstance(module, CONTAINERS):
                continue
            chosen += [f"{name}.{child}" if name else child for child, _ in module.named_children()]
        modules = dict(model.named_modules())
        found = [modules[n] for n in chosen] if chosen else list(model.children())
        return [b for m in found for b in callable_members(m)]

    def default_num_samples(self) -> int | None:
        """The dataset size the workload stands for (MRPC: 3,668 pairs); None when it has none."""
        return None

    def train_flops_per_sample(self, batch: Batch | None = None) -> float | None:
        """Analytic training FLOPs (forward + backward) per sample of `batch`; None when unknown.

        The convention is 2 FLOPs per multiply-add forward and twice the forward backward (6 per MAC).
        `batch` is None for the `--dry-run` estimate: return the typical sample's count (or None).
        """
        return None

    def tokens_in_batch(self, batch: Batch) -> int | None:
        """Tokens in `batch` (padded positions excluded) for sequence models; None otherwise."""
        return None


# Containers that hold modules but have no forward of their own: fully_shard refuses them ("fully_shard does
# not support containers that do not implement forward: ModuleList").
CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def callable_members(module: nn.Module) -> list[nn.Module]:
    """`module` as blocks: itself when it holds parameters and has a forward, its members' blocks when it
    is a container without one, nothing when it holds no parameter."""
    if not any(True for _ in module.parameters()):
        return []
    if isinstance(module, CONTAINERS):
        return [b for child in module.children() for b in callable_members(child)]
    return [module]
