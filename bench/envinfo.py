"""env.json: the fingerprint of the machine and software a run measured (keys read by the report).

No TF32 flags here: the launcher never runs a cell, so its flags are not the cells'. Each cell sets them
for its precision and records them in its row (matmul_fp32_precision, cudnn_fp32_precision).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench import nvidia
from bench.peaks import lookup, no_peak_reason

# Variables that change GPU or communication numbers, recorded in env_vars (the report imports this module
# for timing_warnings; torch is imported inside the functions that need it, not here).
ENV_PREFIXES = ("NCCL_", "TORCH_", "OMP_", "GLOO_", "CUDA_", "PYTORCH_", "CUBLAS", "NVIDIA_", "SLURM_",
                "UCX_", "FI_")
IB_DIR = Path("/sys/class/infiniband")  # <dev>/ports/<n>/{rate,state,link_layer}
# Written by scripts/setup_env.py (its RECORD, the owner of the format) into the environment's prefix.
SETUP_RECORD = ".ddpbench-setup.json"


def _run(cmd: list[str]) -> str | None:
    """stdout of a short command, or None when it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() or None


def timing_warnings(env_vars: dict) -> list[str]:
    """Sentences for variables that make a run's GPU numbers unlike a normal run's (empty when none)."""
    out = []
    blocking = env_vars.get("CUDA_LAUNCH_BLOCKING")
    if blocking is not None and blocking.strip() not in ("", "0"):
        out.append(f"CUDA_LAUNCH_BLOCKING={blocking}: every kernel launch waits for the kernel to finish, so "
                   "communication cannot overlap compute and the step times are those of a debugging run; "
                   "unset it to benchmark.")
    tf32 = env_vars.get("NVIDIA_TF32_OVERRIDE")
    if tf32 is not None:
        out.append(f"NVIDIA_TF32_OVERRIDE={tf32}: cuBLAS and cuDNN ignore the TF32 mode torch sets (0 turns "
                   "TF32 off everywhere), so a row's matmul_fp32_precision may not be what ran.")
    return out


def infiniband(ib_dir: Path = IB_DIR) -> list[dict] | None:
    """Every InfiniBand/RoCE port: device, port, rate, state, link_layer (sysfs text); None without the
    sysfs class (no RDMA driver loaded)."""
    if not ib_dir.is_dir():
        return None
    return [{"device": port.parent.parent.name, "port": port.name,
             **{name: _read(port / name) for name in ("rate", "state", "link_layer")}}
            for port in sorted(ib_dir.glob("*/ports/*"))]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _driver_fallback() -> tuple[str | None, str | None, str]:
    """(driver version, the newest CUDA it supports, where from) without nvidia-smi: pynvml, then torch
    (torch has no driver-version API; `_cuda_getDriverVersion`, where it exists, gives the CUDA version)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        return driver, f"{cuda // 1000}.{cuda % 1000 // 10}", "pynvml"
    except Exception:  # not installed, or no driver: NVML raises its own error classes
        pass
    import torch

    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is not None and torch.cuda.is_available():
        cuda = get()
        return None, f"{cuda // 1000}.{cuda % 1000 // 10}", "torch"
    return None, None, ""


def machine_facts(gpu_names: list[str], ib_dir: Path = IB_DIR) -> dict:
    """The GPU node's facts that change numbers, beside the existing keys: per-GPU nvidia-smi query, driver
    and its CUDA, NVLink, InfiniBand, PCI bus ids, MFU peak per GPU name. Each is None where its tool is
    missing, and `unavailable` says why per key."""
    why: dict[str, str] = {}
    has_smi = shutil.which("nvidia-smi") is not None
    no_smi = "nvidia-smi is not on PATH" if not has_smi else None
    gpu_smi = nvidia.query_gpus()
    if gpu_smi is None:
        why["gpu_smi"] = no_smi or "nvidia-smi --query-gpu failed or printed nothing"
    driver, driver_cuda = nvidia.driver_versions()
    source = "nvidia-smi" if driver else ""
    if driver is None:
        fb_driver, fb_cuda, source = _driver_fallback()
        driver, driver_cuda = fb_driver, driver_cuda or fb_cuda
    no_nvml = "pynvml is not importable or finds no driver"
    if driver is None:
        why["driver"] = f"{no_smi or 'nvidia-smi printed no driver version'}; {no_nvml}"
    if driver_cuda is None:
        why["driver_cuda"] = (f"{no_smi or 'nvidia-smi printed no CUDA version'}; {no_nvml}; torch has no "
                              "_cuda_getDriverVersion or no CUDA")
    # nvidia-smi prints nothing for `nvlink -s` without NVLink (seen on a 1×H100 node): "" then, not None
    nvlink = (nvidia.smi("nvlink", "-s") or "") if has_smi else None
    if nvlink is None:
        why["nvlink"] = no_smi
    ib = infiniband(ib_dir)
    if ib is None:
        why["infiniband"] = f"{ib_dir} is absent (no InfiniBand/RoCE driver loaded)"
    # nvidia-smi's bus ids have an 8-digit domain (00000000:00:06.0), /proc's a 4-digit one (0000:00:06.0)
    bus_ids = [g["pci_bus_id"] for g in gpu_smi] if gpu_smi else nvidia.proc_bus_ids() or None
    if bus_ids is None:
        why["pci_bus_ids"] = f"no GPU in nvidia-smi --query-gpu or {nvidia.PROC_GPUS}"
    peaks = {}
    for name in sorted(set(gpu_names)):
        peak = lookup(name)
        peaks[name] = ({"peak": peak.name, "source": peak.source} if peak
                       else {"peak": None, "reason": no_peak_reason(name)})
    if not gpu_names:
        why["sm_count"] = "torch sees no CUDA device (gpus is empty)"
    return {"driver": driver, "driver_source": source or None, "driver_cuda": driver_cuda, "gpu_smi": gpu_smi,
            "pci_bus_ids": bus_ids, "nvlink": nvlink, "infiniband": ib, "mfu_peak": peaks,
            "unavailable": why}


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def setup_record(prefix: Path | None = None, torch_version: str | None = None) -> dict | None:
    """What `make setup` recorded about this interpreter's torch (python, torch, build, nccl, torch_source).

    None when set-up never ran for this environment (a torch and ddpbench installed by hand), or when the
    record describes another torch than the one imported (torch changed after the last set-up).
    """
    path = Path(sys.prefix if prefix is None else prefix) / SETUP_RECORD
    if not path.exists():
        return None
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    record = json.loads(path.read_text())
    return record if record.get("torch") == torch_version else None


def collect(device: str, backend: str, command: list[str], extra: dict | None = None) -> dict:
    """Everything env.json holds; `extra` (e.g. threads per rank) is merged in."""
    import torch

    cuda = torch.cuda.is_available()
    gpus = []
    for i in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(i)
        gpus.append({"name": props.name, "memory_mb": props.total_memory // 2**20,
                     "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count})
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError):
            nccl = None
    repo = Path(__file__).resolve().parent.parent
    record = setup_record()
    env_vars = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    facts = machine_facts([g["name"] for g in gpus])
    info = {
        "torch": torch.__version__,
        "torch_source": record["torch_source"] if record else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "gpus": gpus,
        "gpu_count": len(gpus),
        "driver": facts.pop("driver"),
        "topology": nvidia.smi("topo", "-m"),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "env_vars": env_vars,
        "env_warnings": timing_warnings(env_vars),
        "git_sha": _run(["git", "-C", str(repo), "rev-parse", "HEAD"]),
        "hostname": socket.gethostname(),
        "command": " ".join(command),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "device": device,
        "backend": backend,
    }
    return info | facts | (extra or {})
