"""Test-only user models that fail in the ranks (tests/test_cell_guard.py): each cell must fail with the
model's own cause, not a neighbour's and not torchrun's."""

from __future__ import annotations

import torch
from torch import nn

from bench.workloads import SyntheticDataset, Workload


class Pairs(SyntheticDataset):
    def __init__(self, n, device, seed):
        gen = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(n, 6, generator=gen).to(device)
        self.targets = torch.randn(n, 1, generator=gen).to(device)

    def __len__(self):
        return self.inputs.shape[0]

    def batch(self, indices):
        i = indices.to(self.inputs.device)
        return {"inputs": self.inputs[i], "targets": self.targets[i]}


class Plain(Workload):
    def build_model(self):
        return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 1))

    def make_dataset(self, num_samples, device, seed):
        return Pairs(num_samples, device, seed)

    def loss(self, model, batch):
        return nn.functional.mse_loss(model(batch["inputs"]), batch["targets"])


class BuildRaises(Plain):
    def build_model(self):
        raise ValueError("no such layer: build_model of the user's model")


class NanLoss(Plain):
    def loss(self, model, batch):
        return super().loss(model, batch) * float("nan")


class NeverUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(6, 1), nn.Linear(6, 1)

    def forward(self, x):
        return self.used(x)


class UnusedParameter(Plain):
    def build_model(self):
        return NeverUsed()
