"""Test-only user models that fail: in the ranks (tests/test_cell_guard.py: each cell must fail with the
model's own cause, not a neighbour's and not torchrun's), and in the launcher's pre-flight check
(tests/test_bad_models.py: exit 2, one line, no run folder)."""

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


# ---- models the launcher's pre-flight refuses (bench/workloads/preflight.py), each with exit 2 ----------

class ReadsValues(Plain):
    """Reads a weight while building: fine on CPU, impossible on the meta device."""

    def build_model(self):
        model = super().build_model()
        if model[0].weight.sum().item() > 1e9:
            raise AssertionError("unreachable")
        return model


class ForwardRaises(Plain):
    def loss(self, model, batch):
        raise RuntimeError("shape mismatch in the user's forward\n(expected 7 features, got 6)")


class ForwardTuple(Plain):
    """Its forward returns (output, aux) and the loss hands the tuple on to mse_loss."""

    def loss(self, model, batch):
        out = model(batch["inputs"])
        return nn.functional.mse_loss((out, out), batch["targets"])


class LossDict(Plain):
    def loss(self, model, batch):
        return {"loss": super().loss(model, batch)}


class LossNone(Plain):
    def loss(self, model, batch):
        super().loss(model, batch)


class NoTrainable(Plain):
    def build_model(self):
        return super().build_model().requires_grad_(False)


class NotAModule(Plain):
    def build_model(self):
        return lambda x: x


class ForwardRaisesOnRank1(Plain):
    """Raises on rank 1 of a launch only (RANK: torchrun's), so only the ranks can find it out."""

    def loss(self, model, batch):
        import os

        if os.environ.get("RANK") == "1":
            raise RuntimeError("the user's forward fails on rank 1 only")
        return super().loss(model, batch)


class MaskedForward(Plain):
    """Selects by a boolean mask (a data-dependent shape): meta cannot step it, so the launcher lets it
    through with a note and the ranks run it."""

    def loss(self, model, batch):
        out = model(batch["inputs"])
        keep = batch["targets"] > -1e9   # every sample: the loss is the plain one
        return nn.functional.mse_loss(out[keep], batch["targets"][keep])
