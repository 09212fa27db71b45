"""What the NVIDIA driver says about the machine: nvidia-smi's output and /proc/driver/nvidia, parsed here.

Nothing here imports torch: these facts must be readable on a node where torch cannot use the GPUs (a wheel
newer than the driver, a CPU-only wheel), which is when `unusable_gpus` is asked. Every function returns
None (or an empty list) when nvidia-smi is missing or fails; callers say so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

PROC_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the kernel driver bound, named by bus id
# env.json key -> nvidia-smi --query-gpu field (NVIDIA's names; `nvidia-smi --help-query-gpu` lists them).
QUERY_FIELDS = {
    "name": "name",
    "pci_bus_id": "pci.bus_id",
    "driver": "driver_version",
    "sm_clock_max_mhz": "clocks.max.sm",
    "memory_clock_max_mhz": "clocks.max.memory",
    "power_limit_w": "power.limit",
    "persistence_mode": "persistence_mode",
    "ecc_mode": "ecc.mode.current",
    "mig_mode": "mig.mode.current",
}
_NUMERIC = {"sm_clock_max_mhz", "memory_clock_max_mhz", "power_limit_w"}


def smi(*args: str) -> str | None:
    """stdout of `nvidia-smi ARGS`, or None when nvidia-smi is missing, fails or prints nothing."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() or None


def driver_gpus(proc_dir: Path | None = None) -> list[str]:
    """The GPUs the driver sees, whatever torch says: `nvidia-smi -L` lines, else /proc bus ids."""
    listing = smi("-L")
    if listing:
        return [line.split(" (UUID")[0] for line in listing.splitlines() if line.startswith("GPU ")]
    return proc_bus_ids(proc_dir)


def proc_bus_ids(proc_dir: Path | None = None) -> list[str]:
    """The kernel driver's GPUs by PCI bus id (/proc/driver/nvidia/gpus/*); [] without the driver."""
    try:
        return sorted(p.name for p in (PROC_GPUS if proc_dir is None else proc_dir).iterdir())
    except OSError:
        return []


def driver_versions() -> tuple[str | None, str | None]:
    """(driver version, the newest CUDA it supports) from nvidia-smi's banner ("CUDA Version: 13.0")."""
    banner = smi() or ""
    driver = re.search(r"Driver Version:\s*(\S+)", banner)
    cuda = re.search(r"CUDA Version:\s*(\S+)", banner)
    return (driver.group(1) if driver else None), (cuda.group(1) if cuda else None)


def query_gpus() -> list[dict] | None:
    """Per GPU, the QUERY_FIELDS values (numbers as floats; "[N/A]"/"[Not Supported]" as None)."""
    out = smi(f"--query-gpu={','.join(QUERY_FIELDS.values())}", "--format=csv,noheader,nounits")
    if not out:
        return None
    gpus = []
    for line in out.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(QUERY_FIELDS):
            return None  # an older nvidia-smi without one of the fields prints an error, not a row
        gpu = {}
        for key, value in zip(QUERY_FIELDS, values):
            if value.startswith("[") or value in ("", "N/A"):
                gpu[key] = None
            elif key in _NUMERIC:
                try:
                    gpu[key] = float(value)
                except ValueError:
                    gpu[key] = None
            else:
                gpu[key] = value
        gpus.append(gpu)
    return gpus


def _version(text: str | None) -> tuple[int, ...] | None:
    found = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def unusable_gpus(torch_version: str, torch_cuda: str | None, proc_dir: Path | None = None,
                  environ: dict | None = None) -> str | None:
    """Why the driver's GPUs are out of torch's reach, or None when the driver shows no GPU.

    Asked only after torch.cuda.is_available() said False; the sentence names torch's CUDA build (or a
    CPU-only build), the driver and the newest CUDA it supports, and an empty CUDA_VISIBLE_DEVICES.
    """
    gpus = driver_gpus(proc_dir)
    if not gpus:
        return None
    env = os.environ if environ is None else environ
    driver, driver_cuda = driver_versions()
    causes = []
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() in ("", "none", "nodevfiles", "-1"):
        causes.append(f"CUDA_VISIBLE_DEVICES={visible!r} hides them")
    if torch_cuda is None:
        causes.append(f"torch {torch_version} is a CPU-only build")
    else:
        built, supported = _version(torch_cuda), _version(driver_cuda)
        newer = built and supported and built > supported
        causes.append(f"torch {torch_version} is built for CUDA {torch_cuda}"
                      + (" (newer than the driver supports)" if newer else ""))
    causes.append(f"driver {driver or 'version unknown'}, supporting CUDA up to {driver_cuda or 'unknown'}")
    shown = ", ".join(gpus[:2]) + (f" and {len(gpus) - 2} more" if len(gpus) > 2 else "")
    return (f"the NVIDIA driver shows {len(gpus)} GPU(s) ({shown}) but torch.cuda.is_available() is False: "
            + "; ".join(causes))


# ---- the topology env.json holds (`nvidia-smi topo -m`) --------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def topology_has_nvlink(topology: str | None) -> bool:
    """True when `nvidia-smi topo -m`'s matrix connects two GPUs by NVLink: an NV<n> cell (a bonded set of n
    NVLinks; the legend's "NV#" is not one)."""
    if not topology:
        return False
    return any(re.fullmatch(r"NV\d+", cell) for cell in _ANSI.sub("", topology).split())
