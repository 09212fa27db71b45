"""A rank's process set-up: where its rank comes from, its threads, its device and its process group."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from bench.schema import backend_for


def ranks_from_slurm() -> None:
    """Started by plain `srun` (one task per GPU) rather than torchrun: take the ranks from SLURM's
    variables. MASTER_ADDR and MASTER_PORT must be exported by the job script (env:// rendezvous)."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    os.environ["LOCAL_WORLD_SIZE"] = os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]


def pin_cpus(threads: int, local_rank: int, local_world_size: int) -> list[int] | None:
    """Bind this rank to its own `threads` CPUs (run.pin_cpus, CPU runs): the local_rank-th share of the CPUs
    this process may use (its affinity mask, inherited from the launcher: a SLURM or container cpuset
    included). Without it the scheduler moves ranks between cores mid-step, and two ranks may share one
    core for a while even when there are enough. Returns the CPUs, or None (left as is) when the ranks'
    shares do not fit in the mask (oversubscribed: run.allow_oversubscribe) or the OS has no affinity."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if threads * local_world_size > len(cpus):
        return None
    mine = cpus[local_rank * threads:(local_rank + 1) * threads]
    os.sched_setaffinity(0, mine)
    return mine


def pick_device(device_type: str, local_rank: int) -> torch.device:
    """This rank's device: the GPU `local_rank`, cuda:0 when this process sees exactly one GPU, or the CPU.

    torchrun shows every rank all of the node's GPUs (cuda:LOCAL_RANK); `srun --gpus-per-task=1` shows each
    task only its own, as cuda:0, where cuda:SLURM_LOCALID would be an invalid ordinal for local ranks >= 1.
    With two GPUs visible or more, a local rank past them is an error rather than a wrap: wrapping would put
    two ranks on one GPU (NCCL refuses that, or they share its memory and SMs), silently.
    """
    if device_type != "cuda":
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if visible < 1:
        raise RuntimeError(f"run.device='cuda' but this rank (local rank {local_rank}) sees no CUDA device")
    if visible > 1 and local_rank >= visible:
        raise RuntimeError(
            f"LOCAL_RANK={local_rank} but this process sees only {visible} GPUs "
            f"(LOCAL_WORLD_SIZE={os.environ.get('LOCAL_WORLD_SIZE')!r}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): more ranks on this node "
            "than GPUs; start at most one rank per visible GPU (torchrun --nproc-per-node, srun "
            "--ntasks-per-node), or show each rank one GPU (srun --gpus-per-task=1)")
    device = torch.device("cuda", 0 if visible == 1 else local_rank)
    torch.cuda.set_device(device)
    return device


def init_process_group(device: torch.device, timeout_s: float, **rendezvous) -> str:
    """The default process group for `device` (NCCL bound to the device, or gloo); returns the backend.
    `rendezvous`: store, rank and world_size for a group rebuilt on an existing store (else env://)."""
    backend = backend_for(device.type)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **rendezvous,
                            **({"device_id": device} if backend == "nccl" else {}))
    return backend


def launcher_alive(pid: int | None, device: torch.device) -> bool:
    """Collective. All ranks agree whether the launcher still runs (a killed launcher must not leave a
    sweep going); always True for a plan run by the user's own torchrun/srun (no launcher pid)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
        alive = 1
    except ProcessLookupError:
        alive = 0
    flag = torch.tensor([alive], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
