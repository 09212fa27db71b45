"""A run's environment fingerprint (env.json) in words and as a table."""

from __future__ import annotations

import pandas as pd

from bench.run_folder import Run


def gpu_summary(env: dict) -> str:
    """'4 × NVIDIA H100 80GB HBM3' from env.json, 'none' without GPUs."""
    gpus = env.get("gpus") or []
    names = sorted({g.get("name", "?") for g in gpus})
    return f"{env.get('gpu_count', len(gpus))} × {', '.join(names)}" if gpus else "none"


def _distinct(values) -> str | None:
    """'a, b' of the distinct non-empty values (one per GPU usually gives one), None when there are none."""
    seen = sorted({str(v) for v in values if v is not None and v != ""})
    return ", ".join(seen) or None


def _nvlink(text: str | None) -> str | None:
    """`nvidia-smi nvlink -s` in a few words: links, GPUs and speeds; 'none' when it printed no link."""
    if text is None:
        return None
    links = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("Link")]
    gpus = sum(1 for line in text.splitlines() if line.startswith("GPU "))
    if not links:
        return "none (nvidia-smi nvlink -s printed no link)"
    return f"{len(links)} links on {gpus} GPU(s) at {_distinct(links)}"


def _infiniband(ports: list | None) -> str | None:
    if ports is None:
        return None
    words = ("rate", "state", "link_layer")
    return "; ".join(f"{p.get('device')}/{p.get('port')} " + " ".join(str(p.get(w)) for w in words)
                     for p in ports) or "none (no port under /sys/class/infiniband)"


def _peaks(peaks: dict | None) -> str | None:
    if not peaks:
        return None
    return "; ".join(f"{name}: {p['peak']}" if p.get("peak") else f"{name}: none ({p.get('reason')})"
                     for name, p in peaks.items())


def machine_facts(env: dict) -> list[tuple[str, str | None, str]]:
    """The GPU node's facts that change numbers, as (field, value, env.json key); value None where env.json
    does not have it (an older run, or `unavailable[key]` says why). Read by the run page and by compare."""
    smi = env.get("gpu_smi") or []
    gpus = env.get("gpus") or []

    def per_gpu(key):
        return _distinct(g.get(key) for g in smi)

    return [
        ("SM count", _distinct(g.get("sm_count") for g in gpus), "sm_count"),
        ("driver's newest CUDA", env.get("driver_cuda"), "driver_cuda"),
        ("SM clock max (MHz)", per_gpu("sm_clock_max_mhz"), "gpu_smi"),
        ("memory clock max (MHz)", per_gpu("memory_clock_max_mhz"), "gpu_smi"),
        ("power limit (W)", per_gpu("power_limit_w"), "gpu_smi"),
        ("persistence mode", per_gpu("persistence_mode"), "gpu_smi"),
        ("ECC mode", per_gpu("ecc_mode"), "gpu_smi"),
        ("MIG mode", per_gpu("mig_mode"), "gpu_smi"),
        ("NVLink", _nvlink(env.get("nvlink")), "nvlink"),
        ("InfiniBand", _infiniband(env.get("infiniband")), "infiniband"),
        ("PCI bus ids", _distinct(env.get("pci_bus_ids") or []), "pci_bus_ids"),
        ("MFU peak", _peaks(env.get("mfu_peak")), "mfu_peak"),
    ]


def environment_table(run: Run) -> pd.DataFrame:
    """The run's environment fingerprint as (field, value) rows, "—" where env.json does not say."""
    env = run.env
    gpus = env.get("gpus") or []
    tf32 = env.get("tf32") or {}
    # A CPU run has no GPU facts to give: one line says so instead of a dozen "nvidia-smi is not on PATH"
    facts = machine_facts(env) if gpus or env.get("device", run.device) == "cuda" else []
    rows = [
        ("device / backend", f"{env.get('device', run.device)} / {env.get('backend', '')}"),
        ("GPUs", gpu_summary(env)),
        (
            "GPU memory (MB) / capability",
            ", ".join(sorted({f"{g.get('memory_mb')} / {g.get('capability')}" for g in gpus})) or "",
        ),
        ("driver", env.get("driver")),
        *((field, _missing(env, key) if value is None else value) for field, value, key in facts),
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


def _missing(env: dict, key: str) -> str | None:
    """'— (why)' for a fact env.json says it could not get; None (shown as —) when it says nothing."""
    why = (env.get("unavailable") or {}).get(key)
    return f"— ({why})" if why else None
