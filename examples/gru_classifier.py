"""Bring your own model: a GRU sequence classifier as a ddpbench workload, complete in one file.

    python -m bench run --config cpu-smoke --set workload.model=examples/gru_classifier.py:GRUClassifier

A workload is a subclass of `bench.workloads.Workload`, built as `GRUClassifier(model_size, options)`.
It supplies the model (`build_model`), its synthetic data on the device (`make_dataset`: a
`SyntheticDataset` whose batches are this file's own dictionary: tokens, lengths, label), the loss, and,
optionally, the counts that fill the FLOP and token columns (`train_flops_per_sample`, `tokens_in_batch`)
and the dataset size it stands for (`default_num_samples`). Leave an optional method out and its columns
stay empty.

The model: token embedding → a stacked GRU over every position of the padded batch → a linear head on the
hidden state after each sequence's last real token. `[workload]` keys it reads: `model_size` ("tiny",
"small"), `seq_len` (the padded width), `fixed_length` (false: lengths drawn uniformly in [seq_len/4,
seq_len]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.workloads import Batch, SyntheticDataset, Workload


@dataclass(frozen=True)
class GRUShape:
    vocab: int
    embed: int
    hidden: int
    layers: int
    classes: int
    seq_len: int   # the padded width when `[workload] seq_len` is not set


SIZES = {
    "tiny": GRUShape(vocab=512, embed=32, hidden=64, layers=2, classes=4, seq_len=16),
    "small": GRUShape(vocab=8192, embed=256, hidden=1024, layers=2, classes=4, seq_len=128),
}
PAD = 0
DATASET_SIZE = 4096   # the number of sequences this workload stands for


class GRUNet(nn.Module):
    def __init__(self, shape: GRUShape):
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.embed, padding_idx=PAD)
        self.gru = nn.GRU(shape.embed, shape.hidden, num_layers=shape.layers, batch_first=True)
        self.head = nn.Linear(shape.hidden, shape.classes)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(tokens))                    # (batch, width, hidden), pads included
        last = out[torch.arange(out.shape[0], device=out.device), lengths - 1]
        return self.head(last)


class TokenSequences(SyntheticDataset):
    """Random token sequences padded on the right to `width`, their lengths and uniform class labels."""

    def __init__(self, num_samples: int, shape: GRUShape, width: int, fixed_length: bool,
                 device: torch.device, seed: int):
        gen = torch.Generator().manual_seed(seed)   # on CPU, then moved: the same data on every device
        if fixed_length:
            lengths = torch.full((num_samples,), width, dtype=torch.long)
        else:
            lengths = torch.randint(max(1, width // 4), width + 1, (num_samples,), generator=gen)
        tokens = torch.randint(PAD + 1, shape.vocab, (num_samples, width), generator=gen)
        tokens[torch.arange(width) >= lengths[:, None]] = PAD
        labels = torch.randint(0, shape.classes, (num_samples,), generator=gen)
        self.tokens, self.lengths, self.labels = tokens.to(device), lengths.to(device), labels.to(device)

    def __len__(self) -> int:
        return self.labels.shape[0]

    def batch(self, indices: torch.Tensor) -> Batch:
        i = indices.to(self.labels.device)
        return {"tokens": self.tokens[i], "lengths": self.lengths[i], "label": self.labels[i]}


class GRUClassifier(Workload):
    """A GRU sequence classifier; `size` is a key of SIZES."""

    family = "gru"

    def __init__(self, size, options=None):
        if size not in SIZES:
            raise ValueError(f"model_size={size!r} is not a GRUClassifier size; choose from {sorted(SIZES)}")
        super().__init__(size, options)
        self.shape = SIZES[size]
        self.seq_len = self.options.seq_len or self.shape.seq_len   # also fills the `seq_len` column

    def build_model(self) -> nn.Module:
        return GRUNet(self.shape)

    def make_dataset(self, num_samples, device, seed):
        return TokenSequences(num_samples, self.shape, self.seq_len, self.options.fixed_length, device, seed)

    def loss(self, model, batch):
        return F.cross_entropy(model(batch["tokens"], batch["lengths"]), batch["label"])

    # ---- optional: without these, the dataset is just big enough and the FLOP/token columns stay empty ----

    def default_num_samples(self):
        return DATASET_SIZE

    def train_flops_per_sample(self, batch=None):
        """6 × multiply-adds of one sample's forward: the GRU at every position of the padded width T,
        3 gates × (input + hidden) × hidden per layer, then the head. Embedding lookups, gate activations
        and the loss are not counted. The initial hidden state's gradient is counted too although autograd
        never computes it (h0 is zeros): the FLOP counter sees 2·3·H² per layer and sample fewer."""
        s = self.shape
        width = batch["tokens"].shape[1] if batch is not None else self.seq_len
        inputs = [s.embed] + [s.hidden] * (s.layers - 1)   # each layer's input width
        gru = sum(3 * s.hidden * (i + s.hidden) for i in inputs)
        return 6.0 * (width * gru + s.hidden * s.classes)

    def tokens_in_batch(self, batch):
        # note: a device sync on GPU; the runner calls it outside the timed steps.
        return int(batch["lengths"].sum())
