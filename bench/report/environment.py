"""A run's environment fingerprint (env.json) in words and as a table."""

from __future__ import annotations

import pandas as pd

from bench.report.load import Run


def gpu_summary(env: dict) -> str:
    """'4 × NVIDIA H100 80GB HBM3' from env.json, 'none' without GPUs."""
    gpus = env.get("gpus") or []
    names = sorted({g.get("name", "?") for g in gpus})
    return f"{env.get('gpu_count', len(gpus))} × {', '.join(names)}" if gpus else "none"


def environment_table(run: Run) -> pd.DataFrame:
    """The run's environment fingerprint as (field, value) rows, "—" where env.json does not say."""
    env = run.env
    gpus = env.get("gpus") or []
    tf32 = env.get("tf32") or {}
    rows = [
        ("device / backend", f"{env.get('device', run.device)} / {env.get('backend', '')}"),
        ("GPUs", gpu_summary(env)),
        (
            "GPU memory (MB) / capability",
            ", ".join(sorted({f"{g.get('memory_mb')} / {g.get('capability')}" for g in gpus})) or "",
        ),
        ("driver", env.get("driver")),
        ("CUDA", env.get("cuda")),
        ("cuDNN", env.get("cudnn")),
        ("NCCL", env.get("nccl")),
        ("torch", env.get("torch")),
        ("python", env.get("python")),
        ("TF32 (matmul / cudnn)", f"{tf32.get('matmul')} / {tf32.get('cudnn')}" if tf32 else None),
        ("CPU", f"{env.get('cpu_model', '')} ({env.get('cpu_cores', '?')} cores)"),
        ("host", env.get("hostname")),
        ("git sha", env.get("git_sha")),
        ("started", env.get("time")),
        ("command", env.get("command")),
        (
            "environment variables",
            ", ".join(f"{k}={v}" for k, v in sorted((env.get("env_vars") or {}).items())),
        ),
    ]
    return pd.DataFrame(
        [(k, "—" if v is None or v == "" else str(v)) for k, v in rows], columns=["field", "value"]
    )
