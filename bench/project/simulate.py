"""One optimizer step of a replicated DDP configuration on n ranks: compute as measured, its bucket
all-reduces against the synced backward, as a table of terms (bench/project/terms.py) that step_time times.

With K micro-steps (gradient accumulation), all but the last run under no_sync; only the last backward
(length b = backward/K) produces buckets. Bucket i becomes ready at ready_i · b after that backward starts
and is all-reduced on the communication stream, in issue order; the optimizer waits for every bucket:

    rows      forward · backward under no_sync (K > 1) · synced backward b (hides_comm) ·
              bucket i's all-reduce (after ready_i of b) · optimizer (after every all-reduce)
    start_i = max(ready_i · b, end_{i−1}),   end_i = start_i + cost(bytes_i, n)
    step    = forward + backward · (K−1)/K + max(b, end_last) + optimizer
              + interference + straggler + host floor      (bench/project/physics.py; off by default)

The bottleneck's overlap window is the synced backward: all-reduces that fit in b could all have been
hidden, had their buckets been ready earlier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.project.collectives import allreduce_cost
from bench.project.network import Network
from bench.project.physics import OFF, Physics
from bench.project.protocol import micro_at
from bench.project.terms import Step, Table, Term, step_time


@dataclass(frozen=True)
class Compute:
    """The compute side of one optimizer step on one rank (ms): forward and backward summed over the
    grad_accum micro-steps, the optimizer once. `fixed_ms`: the part of one micro-step's forward and
    backward that does not shrink with the batch (bench/project/protocol.py "fixed cost"; 0 unless two
    per-rank batches were measured)."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    grad_accum: int
    per_rank_batch: int
    fixed_ms: float = 0.0

    def at_batch(self, per_rank_batch: int) -> Compute:
        """Forward and backward at another per-rank batch: their fixed part unchanged, the rest in
        proportion to the batch (protocol.micro_at); the optimizer unchanged (its work is per parameter,
        not per sample)."""
        micro = (self.forward_ms + self.backward_ms) / self.grad_accum
        if micro <= 0:
            return replace(self, per_rank_batch=per_rank_batch)
        f = micro_at(micro, self.per_rank_batch, per_rank_batch, self.fixed_ms) / micro
        return replace(self, forward_ms=self.forward_ms * f, backward_ms=self.backward_ms * f,
                       per_rank_batch=per_rank_batch)

    @property
    def step_ms(self) -> float:
        return self.forward_ms + self.backward_ms + self.optimizer_ms


@dataclass(frozen=True)
class Buckets:
    """All-reduce messages of one synced backward, in issue order: wire bytes and ready time as a fraction
    (0..1) of that backward; `source` says where they came from."""

    sizes: tuple[int, ...]
    ready: tuple[float, ...]
    source: str

    def __post_init__(self):
        if len(self.sizes) != len(self.ready) or not self.sizes:
            raise ValueError(f"buckets need as many ready times as sizes, at least one ({self.source})")
        if any(not 0.0 <= r <= 1.0 for r in self.ready) or any(s <= 0 for s in self.sizes):
            raise ValueError(f"bucket ready fractions must lie in [0, 1] and sizes be > 0 ({self.source})")


def ddp_terms(compute: Compute, buckets: Buckets, network: Network | None, n: int,
              algorithm: str = "auto") -> list[Term]:
    """The table of one DDP step (module docstring); on one rank no all-reduce (nothing to reduce)."""
    k = compute.grad_accum
    table = Table()
    table.compute("forward", compute.forward_ms)
    if k > 1:
        table.compute("backward under no_sync", compute.backward_ms * (k - 1) / k)
    synced = table.compute("synced backward", compute.backward_ms / k, hides_comm=True)
    reduced = []
    if n > 1:
        if network is None:
            raise ValueError(f"world size {n} needs a network")
        for i, (size, ready) in enumerate(zip(buckets.sizes, buckets.ready)):
            reduced.append(table.collective(f"bucket {i} all-reduce",
                                            allreduce_cost(network, size, n, algorithm), ((synced, ready),)))
    table.compute("optimizer", compute.optimizer_ms, Table.ends(reduced))
    return table.terms


def simulate_step(compute: Compute, buckets: Buckets, network: Network | None, n: int,
                  algorithm: str = "auto", physics: Physics = OFF) -> Step:
    """The step of `compute` with `buckets` all-reduced on `n` ranks of `network` (module docstring).
    n = 1 needs no network: nothing is communicated (and no rank waits for another)."""
    return step_time(ddp_terms(compute, buckets, network, n, algorithm), compute.step_ms, n, physics)
