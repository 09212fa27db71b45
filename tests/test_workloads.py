"""Workloads: registry, shapes, parameter counts, forward/backward on CPU, padding, the `hf:` errors."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from bench.workloads import WORKLOADS, WorkloadOptions, get_workload
from bench.workloads.mrpc import PAD_ID
from bench.workloads.resnet import RESNET_SIZES
from bench.workloads.transformer import TRANSFORMER_SIZES

CPU = torch.device("cpu")


def n_params(workload) -> int:
    """Parameters of the workload's model, built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = workload.build_model()
    return sum(p.numel() for p in model.parameters())


def test_registry_lists_families_and_rejects_unknown_names():
    assert {"mlp", "transformer", "resnet"} <= set(WORKLOADS)
    with pytest.raises(ValueError, match="model='gpt'"):
        get_workload("gpt", "tiny")
    for family in ("mlp", "transformer", "resnet"):
        with pytest.raises(ValueError, match="model_size='huge'"):
            get_workload(family, "huge")
    with pytest.raises(ValueError, match="task='mlm'"):
        get_workload("transformer", "tiny", WorkloadOptions(task="mlm"))


# Published counts: SmolLM2 config.json shapes (LM: tied embeddings, no extra head weights);
# the 2-label classifier adds a bias-free score layer, hidden × 2.
@pytest.mark.parametrize("size, lm_params, hidden", [
    ("smollm2-135m", 134_515_008, 576),
    ("smollm2-360m", 361_821_120, 960),
])
def test_smollm2_parameter_counts_match_the_released_models(size, lm_params, hidden):
    assert n_params(get_workload("transformer", size, WorkloadOptions(task="lm"))) == lm_params
    assert n_params(get_workload("transformer", size)) == lm_params + 2 * hidden


def test_smollm2_360m_shapes():
    with torch.device("meta"):
        model = get_workload("transformer", "smollm2-360m").build_model()
    dec = model.model
    assert len(dec.layers) == 32 and dec.embed_tokens.weight.shape == (49152, 960)
    attn, mlp = dec.layers[0].self_attn, dec.layers[0].mlp
    assert (attn.heads, attn.kv_heads, attn.head_dim) == (15, 5, 64)
    assert attn.k_proj.weight.shape == (320, 960) and mlp.gate_proj.weight.shape == (2560, 960)
    assert dec.cfg.rope_theta == 100000.0


def test_lm_head_is_tied_to_the_embedding():
    model = get_workload("transformer", "tiny", WorkloadOptions(task="lm")).build_model()
    ids = torch.randint(3, 100, (2, 16))
    assert model(ids).shape == (2, 16, TRANSFORMER_SIZES["tiny"].vocab_size)
    model.model.embed_tokens.weight.data.zero_()
    assert model(ids).abs().max() == 0   # the head reads the same tensor


# torchvision's counts with 1000 classes.
@pytest.mark.parametrize("size, expected", [
    ("resnet18", 11_689_512), ("resnet34", 21_797_672), ("resnet50", 25_557_032), ("resnet101", 44_549_160),
])
def test_resnet_parameter_counts_match_torchvision(size, expected):
    assert n_params(get_workload("resnet", size)) == expected


@pytest.mark.parametrize("model, size, options", [
    ("mlp", "tiny", WorkloadOptions()),
    ("transformer", "tiny", WorkloadOptions(seq_len=32)),
    ("transformer", "tiny", WorkloadOptions(seq_len=32, task="lm")),
    ("transformer", "tiny", WorkloadOptions(seq_len=32, fixed_length=False)),
    ("resnet", "tiny", WorkloadOptions()),
    ("resnet", "resnet18", WorkloadOptions(image_size=32)),
])
def test_forward_backward_on_cpu(model, size, options):
    torch.manual_seed(0)
    workload = get_workload(model, size, options)
    net = workload.build_model()
    batch = workload.make_dataset(16, CPU, seed=0).batch(torch.arange(4))
    loss = workload.loss(net, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_build_is_deterministic_under_the_callers_seed():
    workload = get_workload("transformer", "tiny")
    torch.manual_seed(3)
    a = workload.build_model().state_dict()
    torch.manual_seed(3)
    b = workload.build_model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_classification_is_invariant_to_right_padding():
    """A pair's logits do not depend on how many pads follow it (the pooling reads its last real token)."""
    torch.manual_seed(0)
    model = get_workload("transformer", "tiny").build_model().eval()
    ids = torch.randint(3, 1000, (1, 13))
    alone = model(ids, torch.ones_like(ids))
    padded = torch.cat([ids, torch.full((1, 11), PAD_ID)], dim=1)
    mask = (torch.arange(24) < 13).long()[None]
    torch.testing.assert_close(model(padded, mask), alone, rtol=1e-5, atol=1e-5)


def test_lm_loss_ignores_padded_targets():
    torch.manual_seed(0)
    workload = get_workload("transformer", "tiny", WorkloadOptions(task="lm"))
    model = workload.build_model()
    ids = torch.randint(3, 1000, (1, 13))
    mask = torch.ones_like(ids)
    padded_ids = torch.cat([ids, torch.full((1, 3), PAD_ID)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    alone = workload.loss(model, {"input_ids": ids, "attention_mask": mask})
    padded = workload.loss(model, {"input_ids": padded_ids, "attention_mask": padded_mask})
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-6)


def test_tokens_in_batch_counts_real_tokens_only():
    workload = get_workload("transformer", "tiny", WorkloadOptions(fixed_length=False))
    ds = workload.make_dataset(32, CPU, seed=0)
    idx = torch.arange(8)
    assert workload.tokens_in_batch(ds.batch(idx)) == int(ds.lengths[idx].sum())
    assert get_workload("resnet", "tiny").tokens_in_batch({}) is None


def test_image_size_option_and_dataset():
    workload = get_workload("resnet", "resnet18", WorkloadOptions(image_size=64))
    batch = workload.make_dataset(10, CPU, seed=1).batch(torch.tensor([0, 9]))
    assert batch["x"].shape == (2, 3, 64, 64) and batch["y"].shape == (2,)
    assert get_workload("resnet", "resnet50").image_size == 224
    assert get_workload("resnet", "tiny").image_size == RESNET_SIZES["tiny"][4]
    with pytest.raises(ValueError, match="image_size=16"):
        get_workload("resnet", "tiny", WorkloadOptions(image_size=16))


def test_hf_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(FileNotFoundError, match="no-such-checkpoint"):
        get_workload(f"hf:{missing}", "local")
    with pytest.raises(FileNotFoundError, match="config.json"):
        get_workload(f"hf:{tmp_path}", "local")   # a directory, but no checkpoint in it
    with pytest.raises(ValueError):               # also a ValueError: config validation reports it
        get_workload(f"hf:{missing}", "local")


def test_hf_without_transformers_says_how_to_install(tmp_path):
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed here; the missing-package error cannot be exercised")
    (tmp_path / "config.json").write_text('{"vocab_size": 1000, "model_type": "llama"}')
    with pytest.raises(ImportError, match=r"`transformers`.*pip install transformers"):
        get_workload(f"hf:{tmp_path}", "local")
    with pytest.raises(ValueError, match="transformers"):
        get_workload(f"hf:{tmp_path}", "local")


def test_hf_checkpoints_load_in_float32_under_the_argument_transformers_reads():
    # transformers v5 loads a checkpoint in its own dtype (bf16, mostly) unless told: an "fp32" cell would
    # train bf16 weights. 4.56 renamed torch_dtype to dtype; earlier versions read only torch_dtype.
    from bench.workloads.hf import NUM_LABELS, load_kwargs

    for version, name in (("5.0.0", "dtype"), ("4.56.1", "dtype"), ("4.57.0.dev0", "dtype"),
                          ("4.55.4", "torch_dtype"), ("4.46.3", "torch_dtype")):
        kwargs = load_kwargs(version)
        assert kwargs == {"num_labels": NUM_LABELS, "local_files_only": True, name: torch.float32}, version
