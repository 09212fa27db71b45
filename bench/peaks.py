"""Peak dense throughput of common data-centre GPUs, per precision, for MFU.

Figures are NVIDIA's datasheet numbers in FLOP/s for one GPU at boost clock, *dense*: where a datasheet
quotes tensor-core figures "with sparsity" (marked *), the dense figure is half of it. `fp32` is the
non-tensor-core FP32 rate (what fp32 training gets with TF32 disabled, PyTorch's default for matmuls);
`tf32`, `bf16` and `fp16` are tensor-core rates with FP32 accumulation. V100 has neither TF32 nor BF16
tensor cores: a `tf32` run there computes in fp32, so its `tf32` entry is the fp32 rate, and `bf16` is
absent (emulated, no meaningful peak).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

T = 1e12


@dataclass(frozen=True)
class Peak:
    name: str
    flops: dict[str, float]   # precision -> dense FLOP/s
    source: str


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/), "
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/), "
_H100_SXM_SRC = _H100 + "H100 SXM column; dense values from the H100 architecture whitepaper"
_H100_PCIE_SRC = _H100 + "H100 PCIe column"
_H100_NVL_SRC = _H100 + "H100 NVL column"
_H200_SRC = _H200 + "H200 SXM column"
_H200_NVL_SRC = _H200 + "H200 NVL column"
_A100_SRC = ("NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100/); "
             "the 40GB and 80GB, SXM and PCIe parts share these peaks")
_L40S_SRC = "NVIDIA L40S GPU datasheet (nvidia.com/en-us/data-center/l40s/)"
_V100_SRC = "NVIDIA Tesla V100 GPU datasheet (nvidia.com/en-us/data-center/v100/)"

# Keys are what `_identify` returns. Datasheet figures with sparsity are halved; H100/H200 SXM use the
# unrounded dense values of NVIDIA's H100 architecture whitepaper (989.4 = 1,978.9* / 2; datasheet: 1,979*).
PEAKS: dict[str, Peak] = {
    "h100-sxm": Peak("H100 SXM", {"fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T},
                     _H100_SXM_SRC),
    "h100-pcie": Peak("H100 PCIe", {"fp32": 51 * T, "tf32": 378 * T, "bf16": 756.5 * T, "fp16": 756.5 * T},
                      _H100_PCIE_SRC),
    "h100-nvl": Peak("H100 NVL", {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T},
                     _H100_NVL_SRC),
    "h200": Peak("H200 SXM", {"fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T},
                 _H200_SRC),
    "h200-nvl": Peak("H200 NVL", {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T},
                     _H200_NVL_SRC),
    "a100-sxm": Peak("A100 SXM (40GB/80GB)",
                     {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T}, _A100_SRC),
    "a100-pcie": Peak("A100 PCIe (40GB/80GB)",
                      {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T}, _A100_SRC),
    "l40s": Peak("L40S", {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362.05 * T, "fp16": 362.05 * T},
                 _L40S_SRC),
    "v100-sxm": Peak("V100 SXM2", {"fp32": 15.7 * T, "tf32": 15.7 * T, "fp16": 125 * T}, _V100_SRC),
    "v100-pcie": Peak("V100 PCIe", {"fp32": 14 * T, "tf32": 14 * T, "fp16": 112 * T}, _V100_SRC),
    "v100s-pcie": Peak("V100S PCIe", {"fp32": 16.4 * T, "tf32": 16.4 * T, "fp16": 130 * T}, _V100_SRC),
}


# A MIG slice reports its parent's name plus its profile ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"). It has a
# fraction of the parent's SMs (1/7 for 1g on an H100), so the whole GPU's peak would understate MFU up to
# 7x. Scaling by SM count is not done: a slice's share of memory bandwidth and clocks is not its SM share,
# and the profile-to-SM map differs per part. No peak, so MFU is empty rather than wrong.
MIG_REASON = ("a MIG slice: the whole GPU's datasheet peak does not apply to a fraction of its SMs, "
              "so MFU is left empty")


def _words(device_name: str) -> set[str]:
    return set(re.split(r"[\s\-_/]+", device_name.upper())) - {"NVIDIA", "TESLA", ""}


def no_peak_reason(device_name: str) -> str | None:
    """Why `device_name` has no peak (a MIG slice, an unknown device), or None when it has one."""
    if "MIG" in _words(device_name):
        return MIG_REASON
    if _identify(device_name) is None:
        return f"{device_name!r} is not in bench/peaks.py's table (MFU is left empty)"
    return None


def _identify(device_name: str) -> str | None:
    """The PEAKS key for a `torch.cuda.get_device_name()` string, or None.

    Matches whole words after dropping vendor words and separators, so "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3" and "Tesla V100-SXM2-16GB" resolve, while
    "NVIDIA A10", "NVIDIA GH200 480GB" or "NVIDIA L40" do not resolve to a neighbour's figures.
    A MIG slice resolves to None (MIG_REASON).
    """
    words = _words(device_name)
    if "MIG" in words:
        return None
    pcie, nvl = "PCIE" in words, "NVL" in words
    if "H200" in words:
        return "h200-nvl" if nvl else "h200"
    if "H100" in words:   # SXM parts report as "H100 80GB HBM3" or "H100 SXM5 80GB"
        return "h100-pcie" if pcie else "h100-nvl" if nvl else "h100-sxm"
    if "A100" in words:
        return "a100-pcie" if pcie else "a100-sxm"
    if "L40S" in words:
        return "l40s"
    if "V100S" in words:
        return "v100s-pcie"
    if "V100" in words:
        return "v100-pcie" if pcie else "v100-sxm"
    return None


def lookup(device_name: str) -> Peak | None:
    """The peak table entry for a device name, or None for an unknown device or a CPU."""
    key = _identify(device_name)
    return PEAKS[key] if key else None


def peak_flops_per_s(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of one `device_name` GPU at `precision` (fp32 | tf32 | bf16 | fp16).

    None when the device is unknown (CPUs included), is a MIG slice (MIG_REASON) or has no figure for
    that precision: the MFU cell is then left empty rather than computed against a guess.
    """
    if precision not in ("fp32", "tf32", "bf16", "fp16"):
        raise ValueError(f"precision={precision!r} is not one of ['fp32', 'tf32', 'bf16', 'fp16']")
    peak = lookup(device_name)
    return peak.flops.get(precision) if peak else None
