"""env.json: the fingerprint of the machine and software a run measured (keys read by the report).

No TF32 flags here: the launcher never runs a cell, so its flags are not the cells'. Each cell sets them
for its precision and records them in its row (matmul_fp32_precision, cudnn_fp32_precision).
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

ENV_PREFIXES = ("NCCL_", "TORCH_", "OMP_", "GLOO_", "CUDA_VISIBLE_DEVICES")


def _run(cmd: list[str]) -> str | None:
    """stdout of a short command, or None when it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() or None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect(device: str, backend: str, command: list[str], extra: dict | None = None) -> dict:
    """Everything env.json holds; `extra` (e.g. threads per rank) is merged in."""
    cuda = torch.cuda.is_available()
    gpus = []
    for i in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(i)
        gpus.append({"name": props.name, "memory_mb": props.total_memory // 2**20,
                     "capability": f"{props.major}.{props.minor}"})
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError):
            nccl = None
    repo = Path(__file__).resolve().parent.parent
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "gpus": gpus,
        "gpu_count": len(gpus),
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "topology": _run(["nvidia-smi", "topo", "-m"]),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "env_vars": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "git_sha": _run(["git", "-C", str(repo), "rev-parse", "HEAD"]),
        "hostname": socket.gethostname(),
        "command": " ".join(command),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "device": device,
        "backend": backend,
    }
    if info["driver"]:
        info["driver"] = info["driver"].splitlines()[0]
    return info | (extra or {})
