"""MRPC-shaped sentence-pair data for sequence models: synthetic pairs, or the real GLUE MRPC files.

Both sources end up in one `PairDataset`: right-padded token ids, attention masks and labels held on the
device, cut into batches padded to the longest sample in the batch rounded up to a multiple of 8, as the
seeds' collate does (dynamic padding with `pad_to_multiple_of=8`).

Synthetic lengths. A pair is encoded as `[BOS] sentence1 [SEP] sentence2 [SEP]`; its length in tokens
is drawn from a log-normal with median 49 and sigma 0.27, rounded and clipped to [15, 105]: a mean of
about 51 (sd 14), 1st/99th percentiles 26/91, a right tail cut at 105 — the shape of MRPC's training
pairs after a BPE tokenizer (mean ≈ 50, range ≈ 15-105), skewed right as sentence lengths are. It
matters because it sets a batch's padded width: batches of 16 pad to 80 tokens at the median (5-95%:
64-104), batches of 8 to 72 (56-104). Labels are 67.4% positive, MRPC's training-set share (2,474 of
3,668 pairs), assigned exactly and then shuffled.
"""

from __future__ import annotations

import math
import re
import zlib
from pathlib import Path
from typing import NamedTuple

import torch

from .base import Batch, SyntheticDataset

MRPC_TRAIN_PAIRS = 3668          # GLUE MRPC train.tsv rows
MRPC_POSITIVE_FRACTION = 2474 / MRPC_TRAIN_PAIRS   # 67.4%: paraphrases in GLUE MRPC train
PAIR_LEN_MEDIAN, PAIR_LEN_SIGMA = 49.0, 0.27
PAIR_LEN_MIN, PAIR_LEN_MAX = 15, 105
PAD_MULTIPLE = 8

# Token ids of the built-in tokenizer; every other id is a hashed word.
PAD_ID, BOS_ID, SEP_ID = 0, 1, 2
N_SPECIAL = 3

MRPC_HEADER = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
_WORD = re.compile(r"\w+|[^\w\s]")


class DataFileNotFoundError(FileNotFoundError, ValueError):
    """A `data` path that is not a file; also a ValueError, so config validation reports it."""


def check_data(data: str) -> None:
    """Fail early (at config time, before anything is created) when `data` is neither "synthetic" nor a
    readable MRPC file: the whole file is parsed here (3,668 rows for GLUE's train.tsv, milliseconds), so a
    file that exists but is not MRPC is named now, with its line, not found later inside the ranks."""
    if data == "synthetic":
        return
    try:
        read_mrpc(data)
    except DataFileNotFoundError:
        raise
    except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"data={data!r}: not a GLUE MRPC file ({e})") from None


def _mrpc_file(data: str | Path) -> Path:
    """The file `data` names; DataFileNotFoundError when there is none."""
    path = Path(data).expanduser()
    if not path.is_file():
        raise DataFileNotFoundError(f"data={str(data)!r}: no such MRPC file; use \"synthetic\" or the path "
                                    "of a GLUE MRPC train.tsv or msr_paraphrase_train.txt")
    return path


def round_up(n: int, multiple: int = PAD_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


class StagedPairs(NamedTuple):
    """A batch's indices as `PairDataset.stage` prepares them: rows on the device, width on the host."""

    rows: torch.Tensor
    width: int


class PairDataset(SyntheticDataset):
    """Right-padded sequences on the device; `batch` trims each batch to its own padded width.

    `tokens` is [N, W] int64 (PAD_ID after each sample's length), `lengths` [N] the real lengths.
    The lengths also stay on the CPU so that a batch's width is found without a device sync: `stage`
    computes it from the CPU indices before any step runs, so a staged batch is cut with no sync at all.
    `full_width=True` serves every batch at the full width W instead (fixed-length timing).
    """

    def __init__(self, tokens: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor,
                 device: torch.device, full_width: bool = False):
        self.full_width = full_width
        positions = torch.arange(tokens.shape[1])
        self.lengths = lengths.cpu()
        self.input_ids = tokens.to(device)
        self.attention_mask = (positions[None, :] < self.lengths[:, None]).long().to(device)
        self.labels = labels.to(device)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def width(self, indices: torch.Tensor) -> int:
        """Padded width of the batch: the longest sample, rounded up to a multiple of 8."""
        if self.full_width:
            return self.input_ids.shape[1]
        longest = int(self.lengths[indices.cpu()].max())
        return min(round_up(longest), self.input_ids.shape[1])

    def stage(self, indices: torch.Tensor, device: torch.device) -> StagedPairs:
        return StagedPairs(indices.to(device), self.width(indices))

    def batch(self, indices: torch.Tensor | StagedPairs) -> Batch:
        if isinstance(indices, StagedPairs):
            rows, width = indices
        else:  # note: device indices make width() a device→host copy, a CPU-GPU sync point
            rows, width = indices.to(self.input_ids.device), self.width(indices)
        return {
            "input_ids": self.input_ids.index_select(0, rows)[:, :width],
            "attention_mask": self.attention_mask.index_select(0, rows)[:, :width],
            "labels": self.labels.index_select(0, rows),
        }


def mrpc_lengths(num_samples: int, generator: torch.Generator, max_len: int) -> torch.Tensor:
    """Pair lengths in tokens, MRPC-shaped (see the module docstring), truncated at `max_len`."""
    normal = torch.randn(num_samples, generator=generator, dtype=torch.float64)
    lengths = torch.exp(math.log(PAIR_LEN_MEDIAN) + PAIR_LEN_SIGMA * normal).round().long()
    return lengths.clamp(PAIR_LEN_MIN, PAIR_LEN_MAX).clamp(max=max_len)


def balanced_labels(num_samples: int, generator: torch.Generator) -> torch.Tensor:
    """Binary labels with exactly MRPC's positive share, in a random order."""
    labels = torch.zeros(num_samples, dtype=torch.long)
    labels[: round(MRPC_POSITIVE_FRACTION * num_samples)] = 1
    return labels[torch.randperm(num_samples, generator=generator)]


def synthetic_pairs(num_samples: int, vocab_size: int, seq_len: int, fixed_length: bool,
                    device: torch.device, seed: int) -> PairDataset:
    """`num_samples` random sentence pairs; every length `seq_len` when `fixed_length`, else MRPC-like.

    Generated on the CPU from `seed` and copied to the device once (a few MB), so CPU and GPU runs see
    the same data.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if fixed_length:
        lengths = torch.full((num_samples,), seq_len, dtype=torch.long)
    else:
        lengths = mrpc_lengths(num_samples, gen, seq_len)
    width = seq_len if fixed_length else round_up(int(lengths.max()))
    tokens = torch.randint(N_SPECIAL, vocab_size, (num_samples, width), generator=gen)
    positions = torch.arange(width)[None, :]
    # [BOS] s1 [SEP] s2 [SEP]: the first sentence takes 40-60% of the words.
    first = ((lengths - 3) * (0.4 + 0.2 * torch.rand(num_samples, generator=gen))).long() + 1
    tokens[:, 0] = BOS_ID
    tokens[positions == first[:, None]] = SEP_ID
    tokens[positions == (lengths - 1)[:, None]] = SEP_ID
    tokens[positions >= lengths[:, None]] = PAD_ID
    return PairDataset(tokens, lengths, balanced_labels(num_samples, gen), device, full_width=fixed_length)


def hash_tokenize(text: str, vocab_size: int) -> list[int]:
    """A deterministic stand-in for a BPE tokenizer: one id per word or punctuation mark, by CRC32.

    Lower-cased words map to N_SPECIAL..vocab_size-1, the same on every machine and Python run (unlike
    `hash()`); collisions are harmless for timing and for a sanity-check fine-tune.
    """
    return [N_SPECIAL + zlib.crc32(w.encode("utf-8")) % (vocab_size - N_SPECIAL)
            for w in _WORD.findall(text.lower())]


def read_mrpc(path: str | Path) -> list[tuple[int, str, str]]:
    """(label, sentence1, sentence2) rows of a GLUE MRPC `train.tsv` or `msr_paraphrase_*.txt` file.

    Both share the header `Quality, #1 ID, #2 ID, #1 String, #2 String`, tab-separated with no quoting
    (sentences may contain quote characters). Malformed rows raise ValueError naming file and line.
    """
    path = _mrpc_file(path)
    rows = []
    with path.open(encoding="utf-8-sig") as f:   # the MSR release starts with a byte-order mark
        header = tuple(f.readline().rstrip("\r\n").split("\t"))
        if header != MRPC_HEADER:
            raise ValueError(f"{path}:1: expected the MRPC header {MRPC_HEADER}, got {header}")
        for line_no, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != len(MRPC_HEADER):
                raise ValueError(f"{path}:{line_no}: expected {len(MRPC_HEADER)} tab-separated fields "
                                 f"(Quality, #1 ID, #2 ID, #1 String, #2 String), got {len(fields)}")
            if fields[0] not in ("0", "1"):
                raise ValueError(f"{path}:{line_no}: Quality must be 0 or 1, got {fields[0]!r}")
            rows.append((int(fields[0]), fields[3], fields[4]))
    if not rows:
        raise ValueError(f"{path}: no data rows after the header")
    return rows


def mrpc_file_pairs(path: str | Path, num_samples: int, vocab_size: int, seq_len: int,
                    fixed_length: bool, device: torch.device) -> PairDataset:
    """The pairs of a local MRPC file, tokenized by `hash_tokenize` and truncated to `seq_len`.

    The dataset holds `num_samples` samples: the file's rows in order, cycling when it is shorter.
    With `fixed_length` every batch is padded to `seq_len` wide.
    """
    rows = read_mrpc(path)
    encoded = [[BOS_ID, *hash_tokenize(s1, vocab_size), SEP_ID, *hash_tokenize(s2, vocab_size), SEP_ID]
               [:seq_len] for _, s1, s2 in rows]
    picks = [i % len(rows) for i in range(num_samples)]
    lengths = torch.tensor([len(encoded[i]) for i in picks], dtype=torch.long)
    width = seq_len if fixed_length else round_up(int(lengths.max()))
    tokens = torch.full((num_samples, width), PAD_ID, dtype=torch.long)
    for row, i in enumerate(picks):
        tokens[row, : len(encoded[i])] = torch.tensor(encoded[i])
    labels = torch.tensor([rows[i][0] for i in picks], dtype=torch.long)
    return PairDataset(tokens, lengths, labels, device, full_width=fixed_length)
