"""The sweep: the cross product of the matrix axes → Cells, with identical cells collapsed and impossible
combinations kept as `skipped` cells carrying their reason.

Collapse rules (cells that would measure the same thing get one id):
- `naive` all-reduces one parameter at a time: its bucket size means nothing (bucket_cap_mb empty, "bna").
- comm_dtype "fp32" is no compression: the same as "none".
Skip rules (recorded with status `skipped`, the reason in `error`):
- a compressed comm_dtype at world size 1: nothing is communicated, so it is the comm_dtype=none cell;
- bf16 on a GPU that does not support it;
- engine torch with comm_dtype bf16 on CPU: torch's bf16_compress_hook requires CUDA and NCCL;
- a world size above the GPUs present, when run.skip_world_sizes_above_gpus is set (else a config error).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass

from bench.config import BenchConfig
from bench.schema import COMM_DTYPE_ALIASES
from bench.workloads import model_label


@dataclass(frozen=True)
class Cell:
    """One point of the sweep: everything that distinguishes its measurement."""

    engine: str
    model: str
    model_size: str
    world_size: int
    bucket_cap_mb: float | None    # None: the engine has no buckets (naive)
    precision: str
    comm_dtype: str                # one of bench.schema.COMM_DTYPES
    grad_accum: int
    scaling: str
    per_rank_batch: int            # samples per rank per micro-step
    global_batch: int              # samples per optimizer step: per_rank_batch × world_size × grad_accum
    skip_reason: str = ""

    @property
    def cell_id(self) -> str:
        """Stable, readable, unique, filesystem-safe: overlap-mlp.small-ws2-b25-fp32-cnone-ga1-strong-gb32.

        A user model spec ("/path/to/file.py:Name") appears as `Name-<8 hex of its sha256>` (model_label).
        """
        bucket = "na" if self.bucket_cap_mb is None else f"{self.bucket_cap_mb:g}"
        model = model_label(self.model)
        text = (f"{self.engine}-{model}.{self.model_size}-ws{self.world_size}-b{bucket}-{self.precision}"
                f"-c{self.comm_dtype}-ga{self.grad_accum}-{self.scaling}-gb{self.global_batch}")
        return re.sub(r"[^A-Za-z0-9._-]", "_", text)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"cell_id": self.cell_id}

    @classmethod
    def from_dict(cls, data: dict) -> Cell:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def per_rank_batch(scaling: str, world_size: int, global_batch: int, per_rank: int) -> int:
    """The batch rule: strong splits the global micro-batch over the ranks, weak keeps the per-rank batch."""
    if scaling == "strong":
        if global_batch % world_size:
            raise ValueError(f"global_batch={global_batch} is not divisible by world_size={world_size}")
        return global_batch // world_size
    return per_rank


def expand(config: BenchConfig, bf16_supported: bool = True, gpu_count: int | None = None) -> list[Cell]:
    """Every cell of the matrix in sweep order (world size first: one launch per world size), deduplicated."""
    m, w = config.matrix, config.workload
    cells: dict[str, Cell] = {}
    for ws, engine, bucket, precision, comm, accum, scaling in itertools.product(
        sorted(set(m.world_size)), m.engine, m.bucket_cap_mb, m.precision, m.comm_dtype, m.grad_accum,
        m.scaling,
    ):
        comm = COMM_DTYPE_ALIASES.get(comm, comm)
        bucket = None if engine == "naive" else float(bucket)
        prb = per_rank_batch(scaling, ws, w.global_batch, w.per_rank_batch)
        reason = ""
        if comm != "none" and ws == 1:
            reason = f"comm_dtype={comm} at world_size=1: nothing is communicated (same as comm_dtype=none)"
        elif engine == "torch" and comm == "bf16" and config.run.device == "cpu":
            reason = "engine=torch, comm_dtype=bf16: torch's bf16_compress_hook needs CUDA and NCCL"
        elif precision == "bf16" and config.run.device == "cuda" and not bf16_supported:
            reason = "precision=bf16: this GPU does not support bf16"
        elif config.run.device == "cuda" and gpu_count is not None and ws > gpu_count:
            reason = f"world_size={ws} is above the {gpu_count} GPUs present"
        cell = Cell(engine=engine, model=w.model, model_size=w.model_size, world_size=ws,
                    bucket_cap_mb=bucket, precision=precision, comm_dtype=comm, grad_accum=accum,
                    scaling=scaling, per_rank_batch=prb, global_batch=prb * ws * accum, skip_reason=reason)
        cells.setdefault(cell.cell_id, cell)
    return list(cells.values())


def groups(cells: list[Cell]) -> dict[int, list[Cell]]:
    """Runnable cells by world size: each group is served by one launch."""
    out: dict[int, list[Cell]] = {}
    for cell in cells:
        if not cell.skip_reason:
            out.setdefault(cell.world_size, []).append(cell)
    return out


# Rough speeds for the --dry-run estimate only (not used for any result): sustained training FLOP/s per
# rank. CPU: one core of a laptop-class x86 in fp32; GPU: ~30% of an A100's bf16.
_EST = {"cpu": {"flops": 1e10, "launch_s": 5.0, "cell_s": 0.5},
        "cuda": {"flops": 1e14, "launch_s": 20.0, "cell_s": 3.0}}


def estimate_seconds(config: BenchConfig, cells: list[Cell]) -> float:
    """A rough wall-time estimate of the sweep: launch start-ups + per cell set-up + all its steps."""
    from bench.workloads import get_workload

    est = _EST[config.run.device]
    workload = get_workload(config.workload.model, config.workload.model_size, config.workload.options())
    flops = workload.train_flops_per_sample() or 0.0
    r, p = config.run, config.profile
    steps = r.warmup_steps + r.timed_steps * r.repeats + r.compute_only_steps + r.phase_steps
    runnable = [c for c in cells if not c.skip_reason]
    total = est["launch_s"] * len(groups(runnable))
    for cell in runnable:
        step_s = flops * cell.global_batch / (cell.world_size * est["flops"])
        step_s = max(step_s, 0.005) + (0.01 if cell.world_size > 1 else 0.0)
        total += est["cell_s"] + (steps + (p.steps if p.covers(cell.cell_id) else 0)) * step_s
    return total
