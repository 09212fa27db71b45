"""`mlp`: a plain multi-layer perceptron, width and depth configurable, to isolate communication."""

from __future__ import annotations

import torch
from torch import nn

from .base import Batch, SyntheticDataset, Workload

# name -> (input features, hidden width, hidden layers, classes)
MLP_SIZES = {
    "tiny": (64, 128, 2, 10),
    "small": (512, 1024, 4, 10),
    "10m": (1024, 1024, 10, 10),     # ≈ 10.5M parameters: the microbenchmark's size
    "100m": (4096, 4096, 6, 10),
}


class MLPDataset(SyntheticDataset):
    """Gaussian inputs and uniform class labels, generated on the device."""

    def __init__(self, num_samples: int, in_features: int, classes: int, device: torch.device, seed: int):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.x = torch.randn(num_samples, in_features, generator=gen).to(device)
        self.y = torch.randint(0, classes, (num_samples,), generator=gen).to(device)

    def __len__(self) -> int:
        return self.x.shape[0]

    def batch(self, indices: torch.Tensor) -> Batch:
        indices = indices.to(self.x.device)
        return {"x": self.x.index_select(0, indices), "y": self.y.index_select(0, indices)}


class MLPWorkload(Workload):
    """Linear-ReLU stacks; `size` is a key of MLP_SIZES."""

    family = "mlp"
    uses_options = ()

    def __init__(self, size, options=None):
        if size not in MLP_SIZES:
            raise ValueError(f"model_size={size!r} is not an mlp size; choose from {sorted(MLP_SIZES)}")
        super().__init__(size, options)
        self.in_features, self.width, self.depth, self.classes = MLP_SIZES[size]

    def build_model(self) -> nn.Module:
        layers, d = [], self.in_features
        for _ in range(self.depth):
            layers += [nn.Linear(d, self.width), nn.ReLU()]
            d = self.width
        layers.append(nn.Linear(d, self.classes))
        return nn.Sequential(*layers)

    def make_dataset(self, num_samples, device, seed):
        return MLPDataset(num_samples, self.in_features, self.classes, device, seed)

    def loss(self, model, batch):
        return nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    def train_flops_per_sample(self, batch=None):
        # 2 FLOPs per multiply-add forward, twice that backward (input and weight gradients): 6 per weight.
        dims = [self.in_features] + [self.width] * self.depth + [self.classes]
        return float(sum(6 * a * b for a, b in zip(dims[:-1], dims[1:])))
