"""A fake `nvidia-smi` for CPU machines, answering in the real formats.

Outputs are what nvidia-smi 580.159.04 printed on a real 1×H100 node (issue 22; /work/gpu-evidence/env.log
and the --query-gpu row from the same node). The query answers per requested field and, like the real
tool, fails on a field it does not know, so a misspelt field name in bench/nvidia.py fails the tests.
"""

from __future__ import annotations

import os
from pathlib import Path

BANNER = """\
Wed Nov 25 14:01:26 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:06.0 Off |                    0 |
| N/A   35C    P0            101W /  700W |       0MiB /  81559MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+
"""
LIST = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-c21258d6-0627-d1d1-b42a-199bcd100ea8)"
# --format=csv,noheader,nounits values of the real node, by NVIDIA's field name
FIELDS = {
    "name": "NVIDIA H100 80GB HBM3",
    "pci.bus_id": "00000000:00:06.0",
    "driver_version": "580.159.04",
    "clocks.max.sm": "1980",
    "clocks.max.memory": "2619",
    "power.limit": "700.00",
    "persistence_mode": "Enabled",
    "ecc.mode.current": "Enabled",
    "mig.mode.current": "Disabled",
}
# `nvidia-smi nvlink -s` printed nothing on the 1-GPU node (no NVLink); an NVLink node prints per GPU:
NVLINK_8GPU = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s"


def fake_smi(bin_dir: Path, fields: dict | None = None, banner: str = BANNER, listing: str = LIST,
             nvlink: str = "") -> Path:
    """Write `bin_dir/nvidia-smi` answering -L, nvlink -s, --query-gpu and the banner; returns bin_dir."""
    values = {**FIELDS, **(fields or {})}
    cases = "\n".join(f'      {k}) out="$out${{sep}}{v}";;' for k, v in values.items())
    script = f"""#!/bin/bash
if [ "$1" = "-L" ]; then cat <<'EOF'
{listing}
EOF
exit 0; fi
if [ "$1" = "nvlink" ]; then printf '%s' '{nvlink}'; exit 0; fi
case "$1" in --query-gpu=*)
  out=""; sep=""
  IFS=',' read -ra asked <<< "${{1#--query-gpu=}}"
  for f in "${{asked[@]}}"; do
    case "$f" in
{cases}
      *) echo "Field \\"$f\\" is not a valid field to query."; exit 2;;
    esac
    sep=", "
  done
  echo "$out"; exit 0;;
esac
cat <<'EOF'
{banner}
EOF
"""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(script)
    path.chmod(0o755)
    return bin_dir


def put_on_path(monkeypatch, bin_dir: Path) -> None:
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
