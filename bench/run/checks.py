"""The checks of a configuration that need the machine, made by `bench run` before anything is created:
world sizes within the GPUs present (× nodes), precisions the device can run, CPU ranks per core, and what
torch can use of the machine (`machine`, `cuda_for_auto`, `device_memory_bytes`). Values alone are checked
where they are read (bench/config/); these need to know where the run is.
"""

from __future__ import annotations

from bench.config import BenchConfig, ConfigError, fail, usable_cpus

OVERSUBSCRIBE_FACTOR = 4  # CPU ranks per core beyond which a run is refused unless allowed


def cpu_oversubscription(config: BenchConfig, cores: int | None = None) -> str | None:
    """On CPU: a warning when a launch's ranks × threads exceed the cores (timings then measure the
    scheduler); ConfigError past OVERSUBSCRIBE_FACTOR ranks per core unless run.allow_oversubscribe."""
    if config.run.device != "cpu":
        return None
    cores = cores or usable_cpus()
    ws = max(config.matrix.world_size)
    if ws > OVERSUBSCRIBE_FACTOR * cores and not config.run.allow_oversubscribe:
        fail("matrix.world_size", ws, f"{ws} CPU ranks on {cores} cores is more than {OVERSUBSCRIBE_FACTOR} "
             "per core; set run.allow_oversubscribe=true to run it anyway")
    busy = ws * config.run.threads_for(ws)
    if busy > cores:
        return (f"warning: world size {ws} × {config.run.threads_for(ws)} thread(s) per rank = {busy} busy "
                f"threads on {cores} CPU cores: ranks share cores, so step times include waiting for them")
    return None


def check_device(config: BenchConfig, gpu_count: int, nnodes: int = 1) -> None:
    """World sizes within the GPUs present (× nodes) and precisions the device can run."""
    if config.run.device == "cuda":
        if gpu_count < 1:
            fail("run.device", "cuda", "no CUDA device is present")
        too_big = [ws for ws in config.matrix.world_size if ws > gpu_count * nnodes]
        if too_big and not config.run.skip_world_sizes_above_gpus:
            fail("matrix.world_size", too_big[0], f"above the {gpu_count * nnodes} GPUs present"
                 if nnodes == 1 else f"above the {gpu_count * nnodes} GPUs of {nnodes} nodes × {gpu_count}")
    else:
        for precision in config.matrix.precision:
            if precision in ("tf32", "fp16"):
                fail("matrix.precision", precision, "CPU cannot run it (CPU runs fp32 or bf16)")


def machine(config: BenchConfig) -> tuple[int, bool]:
    """(GPUs present, bf16 supported) for the run's device."""
    import torch

    if config.run.device != "cuda" or not torch.cuda.is_available():
        return 0, True
    # including_emulation=False: a V100 "supports" bf16 only by emulation, far below its fp16 rate
    return torch.cuda.device_count(), torch.cuda.is_bf16_supported(including_emulation=False)


def device_memory_bytes(config: BenchConfig) -> int | None:
    """The smallest GPU's total memory (bytes) on a CUDA run with a GPU present; None otherwise."""
    import torch

    if config.run.device != "cuda" or not torch.cuda.is_available() or not torch.cuda.device_count():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def unusable_gpus() -> str | None:
    """Why the driver's GPUs are out of torch's reach (bench.nvidia), None without a driver's GPU."""
    import torch

    from bench.nvidia import unusable_gpus as why

    return why(torch.__version__, torch.version.cuda)


def cuda_for_auto() -> bool:
    """run.device="auto": whether torch can use CUDA. ConfigError when it cannot but the NVIDIA driver shows
    GPUs (a wheel newer than the driver, a CPU-only wheel, an empty CUDA_VISIBLE_DEVICES): "auto" would
    otherwise benchmark the CPU of a GPU node and say nothing."""
    import torch

    if torch.cuda.is_available():
        return True
    reason = unusable_gpus()
    if reason:
        raise ConfigError(f"run.device='auto': {reason}. Install a torch this driver runs (make setup), or "
                          "pass --set run.device=cpu to measure the CPU on purpose")
    return False
