"""The peak table: `torch.cuda.get_device_name()` strings resolve to the right part; others to None."""

from __future__ import annotations

import pytest

from bench.metrics import mfu
from bench.peaks import PEAKS, lookup, no_peak_reason, peak_flops_per_s

T = 1e12


@pytest.mark.parametrize("name, part", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM (40GB/80GB)"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM (40GB/80GB)"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe (40GB/80GB)"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe (40GB/80GB)"),
    ("NVIDIA L40S", "L40S"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"),
    ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
    ("nvidia a100-sxm4-80gb", "A100 SXM (40GB/80GB)"),
])
def test_device_names_resolve(name, part):
    assert lookup(name).name == part


@pytest.mark.parametrize("name", ["cpu", "", "NVIDIA A10", "NVIDIA A100X-Unknown", "NVIDIA GH200 480GB",
                                  "NVIDIA L40", "NVIDIA GeForce RTX 4090", "AMD Instinct MI300X"])
def test_unknown_devices_give_none(name):
    assert peak_flops_per_s(name, "bf16") is None


def test_known_figures():
    assert peak_flops_per_s("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4 * T)
    assert peak_flops_per_s("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(67 * T)
    assert peak_flops_per_s("NVIDIA A100-SXM4-80GB", "tf32") == pytest.approx(156 * T)
    assert peak_flops_per_s("NVIDIA A100-SXM4-80GB", "fp16") == pytest.approx(312 * T)
    assert peak_flops_per_s("Tesla V100-SXM2-16GB", "fp16") == pytest.approx(125 * T)
    assert peak_flops_per_s("Tesla V100-SXM2-16GB", "bf16") is None   # no bf16 tensor cores


def test_every_entry_is_dense_sourced_and_ordered():
    for peak in PEAKS.values():
        assert "datasheet" in peak.source
        f = peak.flops
        assert f["fp32"] <= f["tf32"] <= f["fp16"] < 2000 * T   # dense: no sparsity figures
        assert f.get("bf16", f["fp16"]) == f["fp16"]


def test_bad_precision_is_an_error_and_mfu_composes():
    with pytest.raises(ValueError, match="precision='int8'"):
        peak_flops_per_s("NVIDIA H200", "int8")
    assert mfu(494.7 * T, peak_flops_per_s("NVIDIA H200", "bf16")) == pytest.approx(0.5, rel=1e-3)
    assert mfu(1e12, peak_flops_per_s("cpu", "fp32")) is None


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H100 80GB HBM3 MIG 7g.80gb",
                                  "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H200 MIG 3g.71gb"])
def test_mig_slices_have_no_peak_and_say_why(name):
    # a 1g slice has 1/7 of an H100's SMs: the whole GPU's peak would understate MFU up to 7x
    assert lookup(name) is None
    assert all(peak_flops_per_s(name, p) is None for p in ("fp32", "tf32", "bf16", "fp16"))
    assert "MIG" in no_peak_reason(name)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200"])
def test_full_gpus_keep_their_peak(name):
    assert no_peak_reason(name) is None and peak_flops_per_s(name, "bf16") > 300 * T


def test_unknown_device_reason_names_it():
    assert "'NVIDIA A10'" in no_peak_reason("NVIDIA A10")
