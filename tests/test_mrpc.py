"""MRPC-like data: length distribution, the padding rules, label balance, and the GLUE file loader."""

from __future__ import annotations

import pytest
import torch

from bench.workloads import WorkloadOptions, get_workload
from bench.workloads.mrpc import (
    BOS_ID,
    MRPC_TRAIN_PAIRS,
    PAD_ID,
    SEP_ID,
    hash_tokenize,
    mrpc_file_pairs,
    read_mrpc,
    synthetic_pairs,
)

CPU = torch.device("cpu")
VOCAB = 8192
HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
ROWS = [
    "1\t702876\t702977\tAmrozi accused his brother , whom he called \" the witness \" , of lying .\t"
    "Referring to him as only \" the witness \" , Amrozi accused his brother of lying .\n",
    "0\t2108705\t2108831\tYucaipa owned Dominick 's before selling the chain in 1998 .\t"
    "Yucaipa bought Dominick 's in 1995 for $ 693 million .\n",
    "1\t1330381\t1330521\tThey had published an advertisement on the Internet on June 10 .\t"
    "On June 10 , the ship 's owners had published an advertisement on the Internet .\n",
]


@pytest.fixture(scope="module")
def mrpc_like():
    return synthetic_pairs(MRPC_TRAIN_PAIRS, VOCAB, seq_len=128, fixed_length=False, device=CPU, seed=0)


def test_lengths_resemble_mrpc(mrpc_like):
    lengths = mrpc_like.lengths.float()
    assert len(mrpc_like) == MRPC_TRAIN_PAIRS
    assert 48 <= lengths.mean() <= 54
    assert lengths.min() >= 15 and lengths.max() <= 105
    assert 0.8 < ((lengths >= 30) & (lengths <= 80)).float().mean() < 0.99


def test_labels_have_mrpcs_positive_share(mrpc_like):
    assert int(mrpc_like.labels.sum()) == 2474   # MRPC train: 2,474 paraphrases of 3,668 pairs
    assert 0 < mrpc_like.labels[:100].sum() < 100                          # shuffled, not sorted


def test_batches_pad_to_the_longest_rounded_up_to_8(mrpc_like):
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        idx = torch.randperm(len(mrpc_like), generator=gen)[:16]
        batch = mrpc_like.batch(idx)
        longest = int(mrpc_like.lengths[idx].max())
        width = batch["input_ids"].shape[1]
        assert width % 8 == 0 and longest <= width < longest + 8
        real = batch["attention_mask"].bool()
        assert torch.equal(real.sum(1), mrpc_like.lengths[idx])
        assert (batch["input_ids"][~real] == PAD_ID).all() and (batch["input_ids"][real] != PAD_ID).all()
        assert (batch["input_ids"][:, 0] == BOS_ID).all()
        assert ((batch["input_ids"] == SEP_ID).sum(1) == 2).all()   # [BOS] s1 [SEP] s2 [SEP]


def test_lengths_are_truncated_at_seq_len():
    ds = synthetic_pairs(500, VOCAB, seq_len=40, fixed_length=False, device=CPU, seed=0)
    assert ds.lengths.max() == 40 and ds.batch(torch.arange(500))["input_ids"].shape[1] == 40


def test_fixed_length_batches_are_seq_len_wide_without_padding():
    ds = synthetic_pairs(64, VOCAB, seq_len=100, fixed_length=True, device=CPU, seed=0)
    batch = ds.batch(torch.arange(8))
    assert batch["input_ids"].shape == (8, 100) and bool(batch["attention_mask"].all())


def test_same_seed_same_data():
    a = synthetic_pairs(64, VOCAB, 128, False, CPU, seed=5).batch(torch.arange(64))
    b = synthetic_pairs(64, VOCAB, 128, False, CPU, seed=5).batch(torch.arange(64))
    c = synthetic_pairs(64, VOCAB, 128, False, CPU, seed=6).batch(torch.arange(64))
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["input_ids"], c["input_ids"])


def test_hash_tokenizer_is_deterministic_and_stays_in_the_vocabulary():
    ids = hash_tokenize("Amrozi accused his brother , whom he called \" the witness \" .", VOCAB)
    assert ids == hash_tokenize("AMROZI accused his brother , whom he called \" the witness \" .", VOCAB)
    assert len(ids) == 13 and all(3 <= i < VOCAB for i in ids)


@pytest.mark.parametrize("bom", ["", "\ufeff"])   # msr_paraphrase_train.txt starts with a byte-order mark
def test_reads_glue_mrpc_files(tmp_path, bom):
    path = tmp_path / "train.tsv"
    path.write_text(bom + HEADER + "".join(ROWS), encoding="utf-8")
    rows = read_mrpc(path)
    assert [r[0] for r in rows] == [1, 0, 1]
    assert rows[1][2] == "Yucaipa bought Dominick 's in 1995 for $ 693 million ."


def test_file_dataset_encodes_pairs_and_cycles(tmp_path):
    path = tmp_path / "msr_paraphrase_train.txt"
    path.write_text(HEADER + "".join(ROWS), encoding="utf-8")
    ds = mrpc_file_pairs(path, num_samples=7, vocab_size=VOCAB, seq_len=128, fixed_length=False, device=CPU)
    assert len(ds) == 7 and ds.labels.tolist() == [1, 0, 1, 1, 0, 1, 1]
    batch = ds.batch(torch.tensor([1]))
    s1, s2 = ("Yucaipa owned Dominick 's before selling the chain in 1998 .",
              "Yucaipa bought Dominick 's in 1995 for $ 693 million .")
    expected = [BOS_ID, *hash_tokenize(s1, VOCAB), SEP_ID, *hash_tokenize(s2, VOCAB), SEP_ID]
    assert batch["input_ids"][0, : len(expected)].tolist() == expected
    assert batch["input_ids"].shape[1] == -(-len(expected) // 8) * 8
    fixed = mrpc_file_pairs(path, 3, VOCAB, seq_len=24, fixed_length=True, device=CPU)
    assert fixed.batch(torch.arange(3))["input_ids"].shape == (3, 24) and fixed.lengths.max() == 24


def test_workload_reads_a_local_file(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text(HEADER + "".join(ROWS), encoding="utf-8")
    workload = get_workload("transformer", "tiny", WorkloadOptions(data=str(path), fixed_length=False))
    ds = workload.make_dataset(6, CPU, seed=0)
    torch.manual_seed(0)
    assert torch.isfinite(workload.loss(workload.build_model(), ds.batch(torch.arange(6))))


@pytest.mark.parametrize("content, message", [
    (HEADER + ROWS[0] + "1\t1\t2\tonly four fields\n", r"train\.tsv:3: expected 5 tab-separated fields"),
    (HEADER + ROWS[0] + ROWS[1].replace("0", "x", 1), r"train\.tsv:3: Quality must be 0 or 1, got 'x'"),
    ("label\tsentence1\tsentence2\n" + ROWS[0], r"train\.tsv:1: expected the MRPC header"),
    (HEADER, r"train\.tsv: no data rows"),
])
def test_malformed_files_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "train.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_mrpc(path)


def test_missing_file_is_named_when_the_workload_is_configured(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_mrpc(tmp_path / "nope.tsv")
    with pytest.raises(ValueError, match="nope.tsv"):   # at config time, before anything is launched
        get_workload("transformer", "tiny", WorkloadOptions(data=str(tmp_path / "nope.tsv")))
