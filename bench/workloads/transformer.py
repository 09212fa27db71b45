"""`transformer`: a decoder-only LLaMA-style model (the SmolLM2 architecture), written here.

RMSNorm, rotary embeddings, grouped-query attention through `scaled_dot_product_attention(is_causal=True)`,
a SwiGLU MLP and tied input/output embeddings, with either a causal-LM head (`task="lm"`) or a
sequence-classification head (`task="classification"`, 2 labels) pooled at the last non-pad token as
HF's `LlamaForSequenceClassification` does. The `smollm2-*` sizes have the published shapes, so their
parameter counts match the released models (134,515,008 and 361,821,120 without the 2-label head).

Padding: the datasets here pad on the right. With right padding the causal mask alone keeps every real
token from seeing a pad (pads come after it), so no attention mask is passed and the fused kernels stay
usable; pads only affect the pad positions, which the pooling and the LM loss both skip.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .base import Workload
from .mrpc import MRPC_TRAIN_PAIRS, check_data, mrpc_file_pairs, synthetic_pairs

NUM_LABELS = 2
DEFAULT_SEQ_LEN = 128   # the seeds' max_length for MRPC
PROBE_TOKENS = 64       # the activation probe's sequence (activation_bytes_per_sample): a second on the CPU


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float = 100000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# SmolLM2 shapes from the released config.json files (HuggingFaceTB/SmolLM2-135M and -360M).
TRANSFORMER_SIZES = {
    "tiny": TransformerConfig(vocab_size=8192, hidden=256, layers=4, heads=4, kv_heads=2, intermediate=688),
    # SmolLM2-360M's depth (32 layers) at a width a CPU steps quickly: how rounding grows through depth
    # (the parity gate's deep case, tests/test_parity.py and benchmarks/parity_margin.py)
    "deep": TransformerConfig(vocab_size=8192, hidden=128, layers=32, heads=4, kv_heads=2, intermediate=344),
    "small": TransformerConfig(vocab_size=49152, hidden=512, layers=8, heads=8, kv_heads=4,
                               intermediate=1376),
    "smollm2-135m": TransformerConfig(vocab_size=49152, hidden=576, layers=30, heads=9, kv_heads=3,
                                      intermediate=1536),
    "smollm2-360m": TransformerConfig(vocab_size=49152, hidden=960, layers=32, heads=15, kv_heads=5,
                                      intermediate=2560),
}


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm: normalise in fp32, scale in the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_cos_sin(seq_len: int, head_dim: int, theta: float, device: torch.device):
    """cos and sin tables [seq_len, head_dim] in fp32 (LLaMA's half-split layout).

    Recomputed each forward rather than kept as a buffer: a buffer would be broadcast by DDP's
    `broadcast_buffers` every step and pollute the communication being measured.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query causal self-attention; key/value heads are repeated as HF's `repeat_kv` does."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Explicit repeat rather than enable_gqa=True: every SDPA backend (fp32 included) accepts it.
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Embeddings, decoder blocks and the final norm: hidden states [B, T, hidden]."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)

    def forward(self, input_ids):
        cos, sin = rotary_cos_sin(input_ids.shape[1], self.cfg.head_dim, self.cfg.rope_theta,
                                  input_ids.device)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


def _init_weights(module: nn.Module, std: float) -> None:
    """LLaMA's initialisation: normal(0, initializer_range) for linear and embedding weights."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)


class TransformerForCausalLM(nn.Module):
    """Decoder + LM head tied to the input embedding: logits [B, T, vocab]."""

    def __init__(self, cfg: TransformerConfig, init: bool = True):
        super().__init__()
        self.model = Decoder(cfg)
        if init:
            _init_weights(self, cfg.init_std)

    def forward(self, input_ids, attention_mask=None):
        return F.linear(self.model(input_ids), self.model.embed_tokens.weight)


class TransformerForSequenceClassification(nn.Module):
    """Decoder + a bias-free score head read at the last non-pad token: logits [B, num_labels]."""

    def __init__(self, cfg: TransformerConfig, num_labels: int = NUM_LABELS, init: bool = True):
        super().__init__()
        self.model = Decoder(cfg)
        self.score = nn.Linear(cfg.hidden, num_labels, bias=False)
        if init:
            _init_weights(self, cfg.init_std)

    def forward(self, input_ids, attention_mask=None):
        hidden = self.model(input_ids)
        b, t = input_ids.shape
        if attention_mask is None:
            last = torch.full((b,), t - 1, device=input_ids.device)
        else:
            # HF's rule: the rightmost position whose mask is set (the data here is right-padded).
            last = (torch.arange(t, device=input_ids.device) * attention_mask).argmax(-1)
        # Pool before the head (HF scores every position, then pools): same logits, less work.
        return self.score(hidden[torch.arange(b, device=hidden.device), last])


class TransformerWorkload(Workload):
    """A LLaMA-style decoder on MRPC-like pairs; `size` is a key of TRANSFORMER_SIZES."""

    family = "transformer"
    uses_options = ("seq_len", "fixed_length", "task", "data")

    def __init__(self, size, options=None):
        if size not in TRANSFORMER_SIZES:
            raise ValueError(f"model_size={size!r} is not a transformer size; "
                             f"choose from {sorted(TRANSFORMER_SIZES)}")
        super().__init__(size, options)
        if self.options.task not in ("classification", "lm"):
            raise ValueError(f"task={self.options.task!r} is not a transformer task; "
                             "choose from ['classification', 'lm']")
        self.cfg = TRANSFORMER_SIZES[size]
        self.seq_len = self.options.seq_len or DEFAULT_SEQ_LEN
        if self.seq_len < 8:
            raise ValueError(f"seq_len={self.seq_len} is too short for a sentence pair; use at least 8")
        check_data(self.options.data)

    def build_model(self) -> nn.Module:
        if self.options.task == "lm":
            return TransformerForCausalLM(self.cfg)
        return TransformerForSequenceClassification(self.cfg)

    def blocks(self, model):
        """The decoder layers (embeddings, final norm and head stay with the root's group)."""
        return [m for m in model.modules() if isinstance(m, Block)]

    def activation_bytes_per_sample(self, precision: str) -> float:
        """Saved activations of one sample of `seq_len` tokens (bench/workloads/memory.py), from the probe on
        1- and 2-layer slices of this shape on the CPU, at PROBE_TOKENS tokens and 1 and 2 samples: a
        layer's share per token is the difference the second layer makes, the rest (embeddings, final norm,
        head, loss) what is left; both grow with the tokens (flash attention keeps no T × T matrix), so
        they are scaled to seq_len and to every layer. Per sample, not per batch: what does not grow with
        the batch (autocast's weight copies) is the memory model's own term. Under a second on the CPU for
        smollm2-360m, where the whole model would take several."""
        from bench.workloads.memory import saved_bytes

        tokens = min(self.seq_len, PROBE_TOKENS)
        sizes = {}
        for layers in (1, 2):
            cfg = replace(self.cfg, layers=layers)
            # LLaMA's initialisation left out: only the saved tensors' sizes are read
            model = TransformerForCausalLM(cfg, init=False) if self.options.task == "lm" else \
                TransformerForSequenceClassification(cfg, init=False)
            data = synthetic_pairs(2, cfg.vocab_size, tokens, True, torch.device("cpu"), 0)
            for n in (1, 2):
                batch = data.batch(torch.arange(n))
                sizes[layers, n] = saved_bytes(model, lambda m=model, b=batch: self.loss(m, b), precision)
        one = sizes[1, 2] - sizes[1, 1]               # a sample through the 1-layer model
        per_layer = one - (sizes[2, 2] - sizes[2, 1])  # minus a sample through the 2-layer one: −1 layer
        per_layer = -per_layer
        return float((one + (self.cfg.layers - 1) * per_layer) * self.seq_len / tokens)

    def default_num_samples(self) -> int | None:
        return MRPC_TRAIN_PAIRS

    def make_dataset(self, num_samples, device, seed):
        if self.options.data == "synthetic":
            return synthetic_pairs(num_samples, self.cfg.vocab_size, self.seq_len,
                                   self.options.fixed_length, device, seed)
        return mrpc_file_pairs(self.options.data, num_samples, self.cfg.vocab_size, self.seq_len,
                               self.options.fixed_length, device)

    def loss(self, model, batch):
        input_ids, mask = batch["input_ids"], batch["attention_mask"]
        if self.options.task == "classification":
            return F.cross_entropy(model(input_ids, mask), batch["labels"])
        logits = model(input_ids, mask)
        # Next-token prediction over real tokens only: a pad target is ignored.
        targets = input_ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-100)

    def train_flops_per_sample(self, batch=None):
        """6·(L·P_layer + V·d [lm])·T + 12·L·T²·H·d_head + 6·d·C [classification], T the padded width.

        P_layer: the weights of one block's matmuls (q, k, v, o and the three MLP projections).
        Forward is 2 FLOPs per multiply-add, backward twice forward (input and weight gradients).
        Attention scores QKᵀ and the weighted sum AV are 2·T²·H·d_head each per layer forward; the
        full T×T square is counted, as PaLM's MFU and the FLOP counter do: the causal mask is not
        discounted. The LM head (tied: V·d) runs on every position; the classifier only on the pooled
        token. Norms, activations, softmax, rotary and the loss are not counted. Padded positions are
        computed, so T is the batch's padded width (`seq_len` when no batch is given).
        """
        c = self.cfg
        t = batch["input_ids"].shape[1] if batch is not None else self.seq_len
        attn_dim = c.heads * c.head_dim
        kv_dim = c.kv_heads * c.head_dim
        per_layer = 2 * c.hidden * attn_dim + 2 * c.hidden * kv_dim + 3 * c.hidden * c.intermediate
        flops = 6 * c.layers * per_layer * t + 12 * c.layers * t * t * attn_dim
        if self.options.task == "lm":
            flops += 6 * c.vocab_size * c.hidden * t
        else:
            flops += 6 * c.hidden * NUM_LABELS
        return float(flops)

    def tokens_in_batch(self, batch):
        # note: a device sync on GPU; call it outside the timed window.
        return int(batch["attention_mask"].sum())
