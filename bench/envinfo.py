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

import torch

ENV_PREFIXES = ("NCCL_", "TORCH_", "OMP_", "GLOO_", "CUDA_VISIBLE_DEVICES")
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
    record = json.loads(path.read_text())
    return record if record.get("torch") == (torch_version or torch.__version__) else None


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
    record = setup_record()
    info = {
        "torch": torch.__version__,
        "torch_source": record["torch_source"] if record else None,
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
