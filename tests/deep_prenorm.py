"""A user's deep model, written as a user would (not the suite's transformer): 32 pre-norm blocks of width
128 in an `nn.ModuleList`, LayerNorm and GELU, attention with separate q, k, v projections that carry
biases (the key bias's gradient is ~0 by symmetry: softmax ignores a shift common to every key), a
language-model loss. The parity gate's held-out model (tests/test_parity.py, benchmarks/parity_margin.py):
on it the old trajectory gate called honest fsdp2 bf16 `diverged` and passed a reducer that sums."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.workloads import SyntheticDataset, Workload

SIZES = {"deep": (32, 128), "tiny": (4, 128)}  # blocks, width
VOCAB, SEQ, HEADS = 256, 32, 4


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, HEADS, d // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Net(nn.Module):
    def __init__(self, blocks: int, width: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(blocks))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


class Tokens(SyntheticDataset):
    def __init__(self, n: int, device, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=gen).to(device)

    def __len__(self):
        return self.tokens.shape[0]

    def batch(self, indices):
        return {"tokens": self.tokens[indices.to(self.tokens.device)]}


class DeepPreNorm(Workload):
    def build_model(self):
        return Net(*SIZES[self.size])

    def make_dataset(self, num_samples, device, seed):
        return Tokens(num_samples, device, seed)

    def loss(self, model, batch):
        tokens = batch["tokens"]
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
