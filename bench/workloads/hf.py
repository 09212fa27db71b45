"""`hf:<local path>`: a Hugging Face checkpoint as a 2-label sequence classifier, loaded offline.

Needs the optional `transformers` package; nothing is downloaded (`local_files_only=True`). The weights
are loaded in float32 whatever the checkpoint holds (`load_kwargs`), as every built-in model's are. The
data is the same MRPC-like pairs as `transformer`, tokenized by the built-in hashing tokenizer into the
checkpoint's vocabulary (ids 0-2 reserved for PAD/BOS/SEP): the timing does not depend on which tokens
they are.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .base import Workload
from .mrpc import MRPC_TRAIN_PAIRS, PAD_ID, check_data, mrpc_file_pairs, synthetic_pairs
from .transformer import DEFAULT_SEQ_LEN, NUM_LABELS

PREFIX = "hf:"
# transformers renamed from_pretrained's `torch_dtype` to `dtype` in 4.56 (huggingface/transformers#39782)
# and deprecated the old name.
DTYPE_KWARG_SINCE = (4, 56)


def load_kwargs(transformers_version: str) -> dict:
    """from_pretrained's arguments besides the path: offline, two labels, and float32 weights said
    explicitly. The cell's precision (autocast over fp32 weights) decides the compute dtype; without the
    dtype, transformers v5 loads the checkpoint's own (dtype="auto" by default: bf16 for most recent
    checkpoints), and an "fp32" cell would train bf16 weights."""
    major_minor = tuple(int(x) for x in re.findall(r"\d+", transformers_version)[:2])
    dtype_kwarg = "dtype" if major_minor >= DTYPE_KWARG_SINCE else "torch_dtype"
    return {"num_labels": NUM_LABELS, "local_files_only": True, dtype_kwarg: torch.float32}


# Also ValueErrors, so that config validation (which catches ValueError) reports them before launching.
class CheckpointNotFoundError(FileNotFoundError, ValueError):
    """The `hf:` path is not a directory holding config.json."""


class TransformersMissingError(ImportError, ValueError):
    """`hf:` models need the optional `transformers` package."""


class HFWorkload(Workload):
    """`AutoModelForSequenceClassification` from a local directory holding config.json and weights."""

    family = "hf"
    uses_options = ("seq_len", "fixed_length", "data")

    def __init__(self, path: str, size: str = "local", options=None):
        super().__init__(size, options)
        self.path = Path(path).expanduser()
        config_file = self.path / "config.json"
        if not self.path.is_dir():
            raise CheckpointNotFoundError(
                f"model={PREFIX}{path!r}: no such directory {str(self.path)!r}; `hf:` takes a local "
                "directory holding a Hugging Face checkpoint")
        if not config_file.is_file():
            raise CheckpointNotFoundError(
                f"model={PREFIX}{path!r}: {config_file} does not exist; point `hf:` at a local directory "
                "holding a Hugging Face checkpoint (config.json and weights)")
        if importlib.util.find_spec("transformers") is None:
            raise TransformersMissingError(
                f"model={PREFIX}{path!r} needs the `transformers` package, which is not installed; install "
                "it with `pip install transformers` (the checkpoint is then loaded offline from the path)")
        check_data(self.options.data)
        config = json.loads(config_file.read_text())
        self.vocab_size = int(config["vocab_size"])
        self.layers = config.get("num_hidden_layers")
        self.hidden = config.get("hidden_size")
        self.seq_len = self.options.seq_len or DEFAULT_SEQ_LEN
        self._non_embedding_params: int | None = None

    # from_pretrained reads the weights from files on CPU; under a default-device context its placement
    # depends on the transformers version, which no test here covers on a GPU: built on CPU, then moved.
    build_on_device = False

    def build_model(self) -> nn.Module:
        import transformers
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(
            self.path, **load_kwargs(transformers.__version__))
        if model.config.pad_token_id is None:   # batched classification needs it to find the last token
            model.config.pad_token_id = PAD_ID
        embedding = model.get_input_embeddings().weight.numel()
        self._non_embedding_params = sum(p.numel() for p in model.parameters()) - embedding
        return model

    def default_num_samples(self) -> int | None:
        return MRPC_TRAIN_PAIRS

    def make_dataset(self, num_samples, device, seed):
        if self.options.data == "synthetic":
            return synthetic_pairs(num_samples, self.vocab_size, self.seq_len, self.options.fixed_length,
                                   device, seed)
        return mrpc_file_pairs(self.options.data, num_samples, self.vocab_size, self.seq_len,
                               self.options.fixed_length, device)

    def loss(self, model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return F.cross_entropy(logits, batch["labels"])

    def train_flops_per_sample(self, batch=None):
        """6·N·T + 12·L·T²·d with N the non-embedding parameters (known once built); None before."""
        if self._non_embedding_params is None or self.layers is None or self.hidden is None:
            return None
        t = batch["input_ids"].shape[1] if batch is not None else self.seq_len
        return float(6 * self._non_embedding_params * t + 12 * self.layers * t * t * self.hidden)

    def tokens_in_batch(self, batch):
        # note: a device sync on GPU; call it outside the timed window.
        return int(batch["attention_mask"].sum())
