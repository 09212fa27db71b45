"""A measured configuration (every result row that shares the configuration keys, columns.config_key,
except the world size; its base cell is its smallest world size with status ok: docs/design.md
"Projection"), the per-rank batch it runs at on n ranks, and its step there: the engine kind's builder of
terms (simulate.py for DDP's buckets, sharded.py for a sharded engine) timed by terms.step_time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from bench.project.network import Network
from bench.project.physics import Physics
from bench.project.sharded import Sharding, simulate_sharded
from bench.project.simulate import Buckets, Compute, simulate_step
from bench.project.terms import Step


@dataclass(frozen=True)
class Configuration:
    """A measured configuration: its base cell's row, compute side and buckets (or why it has none)."""

    base: pd.Series
    rows: pd.DataFrame              # every ok cell of the configuration, by world size
    compute: Compute | None
    buckets: Buckets | None
    reason: str = ""
    physics: Physics | None = None  # the terms from the run's evidence (with_evidence); None: physics_of's
    physics_source: str = ""
    sharded: tuple[Sharding, tuple[int, ...]] | None = None   # a sharded engine: how, and its blocks
    extra_compute_ms: float = 0.0   # compute a comm hook adds once per synced step (PowerSGD's compression)
    fixed_source: str = ""          # where compute.fixed_ms came from ("" none measured: 0)

    @property
    def micro_batch(self) -> int:
        """Samples per micro-step over all ranks (what strong scaling keeps)."""
        return int(self.base["per_rank_batch"]) * int(self.base["world_size"])


def per_rank_of(config: Configuration, n: int) -> tuple[int, int]:
    """(per-rank batch on n ranks, the batch T1 is taken at): weak scaling keeps the base's per-rank batch,
    strong scaling its global batch per micro-step; ValueError when that does not divide among n."""
    if config.base["scaling"] == "strong":
        if config.micro_batch % n:
            raise ValueError(f"global batch {config.micro_batch} per micro-step does not divide among {n} "
                             "ranks")
        return config.micro_batch // n, config.micro_batch
    per_rank = int(config.base["per_rank_batch"])
    return per_rank, per_rank


def step_of(config: Configuration, compute: Compute, net: Network | None, n: int, algorithm: str,
            physics: Physics) -> Step:
    """The configuration's step on n ranks: sharded (sharded.py) or DDP's buckets (simulate.py), with the
    compute a comm hook adds once per synced step (none at n = 1: DDP runs no hook on one rank here)."""
    if config.sharded is not None:
        return simulate_sharded(compute, config.sharded[1], config.sharded[0], net, n, physics)
    if n > 1 and config.extra_compute_ms:
        compute = replace(compute, optimizer_ms=compute.optimizer_ms + config.extra_compute_ms)
    return simulate_step(compute, config.buckets, net, n, algorithm, physics)


def from_cell(config: Configuration, cell: pd.Series, n: int) -> Configuration:
    """`config` re-based on one of its cells for a projection to n ranks (`bench advise`: the user's recipe
    at the target): strong scaling from the cell's global micro-batch (per_rank_batch × world_size, the
    recipe kept) where that divides among n ranks, else weak scaling from its per-rank batch (the per-GPU
    micro-batch held, the global batch growing with n). The compute side is the configuration's own (it
    scales with the per-rank batch); the rows' cell_id is the cell's, their scaling the rule used."""
    micro, per_rank = int(cell["per_rank_batch"]) * int(cell["world_size"]), int(cell["per_rank_batch"])
    keep = micro % n == 0
    base = config.base.copy()
    base["cell_id"], base["scaling"] = cell["cell_id"], "strong" if keep else "weak"
    base["per_rank_batch"], base["world_size"] = (micro, 1) if keep else (per_rank, 1)
    return replace(config, base=base)


@dataclass(frozen=True)
class Setting:
    """Where a configuration is projected: n ranks of `net` (None at n = 1), with the compute at that world
    size's per-rank batch, the all-reduce algorithm and the physics terms."""

    config: Configuration
    compute: Compute
    net: Network | None
    n: int
    algorithm: str
    physics: Physics

    def step(self) -> Step:
        """The model's step here (step_of)."""
        return step_of(self.config, self.compute, self.net, self.n, self.algorithm, self.physics)
