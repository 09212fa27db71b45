"""The checks of a configuration that need the machine, made by `bench run` before anything is created:
world sizes within the GPUs present (× nodes), precisions the device can run, CPU ranks per core. Values
alone are checked where they are read (bench/config.py); these need to know where the run is.
"""

from __future__ import annotations

from bench.config import BenchConfig, fail, usable_cpus

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
