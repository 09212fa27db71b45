"""A held-out user model for the racing search's cost measurements (docs/running.md "Racing instead of the
full grid"): a GRU language model, next-token prediction over synthetic token streams.

    python -m bench run --config default --set workload.model=tests/data/models/gru_lm.py:GRULanguageModel \
        --set matrix.world_size=2 --search race

Token embedding → a stacked GRU → a linear head over the vocabulary at every position; the loss is the
cross-entropy of each position's prediction of the next token. Sizes: "tiny" (tests), "small" (the
default preset's CPU size: 1.9M parameters, 8 tensors and a 1 MiB bucket's worth of several).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.workloads import Batch, SyntheticDataset, Workload


@dataclass(frozen=True)
class Shape:
    vocab: int
    embed: int
    hidden: int
    layers: int
    seq_len: int


SIZES = {
    "tiny": Shape(vocab=256, embed=16, hidden=32, layers=1, seq_len=8),
    "small": Shape(vocab=2048, embed=128, hidden=256, layers=2, seq_len=32),
}


class GRULM(nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.embed)
        self.gru = nn.GRU(shape.embed, shape.hidden, num_layers=shape.layers, batch_first=True)
        self.head = nn.Linear(shape.hidden, shape.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(tokens))
        return self.head(out)                        # (batch, width, vocab)


class TokenStreams(SyntheticDataset):
    """Random token sequences of `width + 1` tokens: inputs are the first width, targets the last."""

    def __init__(self, num_samples: int, shape: Shape, width: int, device: torch.device, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, shape.vocab, (num_samples, width + 1), generator=gen).to(device)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def batch(self, indices: torch.Tensor) -> Batch:
        return {"tokens": self.tokens[indices.to(self.tokens.device)]}


class GRULanguageModel(Workload):
    """A GRU next-token model; `size` is a key of SIZES."""

    family = "gru-lm"

    def __init__(self, size, options=None):
        if size not in SIZES:
            raise ValueError(f"model_size={size!r} is not a GRULanguageModel size; choose {sorted(SIZES)}")
        super().__init__(size, options)
        self.shape = SIZES[size]
        self.seq_len = self.options.seq_len or self.shape.seq_len

    def build_model(self) -> nn.Module:
        return GRULM(self.shape)

    def make_dataset(self, num_samples, device, seed):
        return TokenStreams(num_samples, self.shape, self.seq_len, device, seed)

    def loss(self, model, batch):
        tokens = batch["tokens"]
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def default_num_samples(self):
        return 2048

    def train_flops_per_sample(self, batch=None):
        """6 × multiply-adds of one sample's forward: the GRU's 3 gates × (input + hidden) × hidden per layer
        and the head's hidden × vocab, at every position."""
        s = self.shape
        inputs = [s.embed] + [s.hidden] * (s.layers - 1)
        gru = sum(3 * s.hidden * (i + s.hidden) for i in inputs)
        return 6.0 * self.seq_len * (gru + s.hidden * s.vocab)

    def tokens_in_batch(self, batch):
        return int(batch["tokens"].shape[0] * (batch["tokens"].shape[1] - 1))
