"""One optimizer step of a DDP configuration on n ranks: compute as measured, communication simulated.

With K micro-steps (gradient accumulation), all but the last run under no_sync; only the last backward
(length b = backward/K) produces buckets. Bucket i becomes ready at ready_i · b after that backward starts
and is all-reduced on one communication stream, in issue order:

    start_i = max(ready_i · b, end_{i−1}),   end_i = start_i + cost(bytes_i, n)
    tail    = max(b, end_last)               exposed = tail − b
    step    = forward + backward · (K−1)/K + tail + optimizer
              + interference + straggler + host floor      (bench/project/physics.py; off by default)

interference takes the all-reduce time that ran under backward (Σ cost − exposed), straggler the compute
(forward + backward + optimizer), host floor the step so far.

Bottleneck (first rule that holds):
    compute          exposed ≤ 5 % of the step: the step is within 5 % of its no-communication time
    overlap-limited  Σ cost ≤ b: the stream could have hidden every all-reduce behind backward, but buckets
                     became ready too late (the last one at the end of backward) for it to do so
    bandwidth        Σ bandwidth terms ≥ Σ latency terms
    latency          otherwise
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.project.collectives import allreduce_cost
from bench.project.network import Network
from bench.project.physics import OFF, Physics, host_floor_ms, interference_ms, straggler_ms
from bench.project.protocol import micro_at

BOTTLENECKS = ("compute", "bandwidth", "latency", "overlap-limited")
# what N ranks add to the compute, each a Step field `<term>_ms` (Step.dominant_term names the largest)
TERMS = ("exposed_comm", "interference", "straggler", "host_floor")
COMPUTE_BOUND_EXPOSED = 0.05  # exposed communication at most this fraction of the step: compute-bound


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


@dataclass(frozen=True)
class Step:
    """A simulated step (ms) and how its communication splits."""

    step_ms: float
    exposed_comm_ms: float
    comm_ms: float
    latency_ms: float
    bandwidth_ms: float
    bottleneck: str
    algorithms: tuple[str, ...]
    interference_ms: float = 0.0
    straggler_ms: float = 0.0
    host_floor_ms: float = 0.0

    @property
    def dominant_term(self) -> str:
        """The largest of what N ranks add to the compute: exposed communication or a physics term."""
        name, value = max(((t, getattr(self, f"{t}_ms")) for t in TERMS), key=lambda kv: kv[1])
        return name if value > 0 else "none"


def simulate_step(compute: Compute, buckets: Buckets, network: Network | None, n: int,
                  algorithm: str = "auto", physics: Physics = OFF) -> Step:
    """The step of `compute` with `buckets` all-reduced on `n` ranks of `network` (module docstring).
    n = 1 needs no network: nothing is communicated (and no rank waits for another)."""
    k = compute.grad_accum
    last_backward = compute.backward_ms / k
    comm_end = latency = bandwidth = 0.0
    used: list[str] = []
    if n > 1:
        if network is None:
            raise ValueError(f"world size {n} needs a network")
        for size, ready in zip(buckets.sizes, buckets.ready):
            cost = allreduce_cost(network, size, n, algorithm)
            comm_end = max(ready * last_backward, comm_end) + cost.total_us / 1e3
            latency += cost.latency_us / 1e3
            bandwidth += cost.bandwidth_us / 1e3
            if cost.algorithm not in used:
                used.append(cost.algorithm)
    exposed = max(0.0, comm_end - last_backward)
    earlier_backward = compute.backward_ms * (k - 1) / k  # the micro-steps under no_sync
    step = compute.forward_ms + earlier_backward + last_backward + exposed + compute.optimizer_ms
    comm = latency + bandwidth
    interference = interference_ms(max(0.0, comm - exposed), physics) if n > 1 else 0.0
    straggler = straggler_ms(compute.step_ms, n, physics)
    step += interference + straggler
    floor = host_floor_ms(step, physics)
    step += floor
    if exposed <= COMPUTE_BOUND_EXPOSED * step:
        bottleneck = "compute"
    elif comm <= last_backward:
        bottleneck = "overlap-limited"
    else:
        bottleneck = "bandwidth" if bandwidth >= latency else "latency"
    return Step(step, exposed, comm, latency, bandwidth, bottleneck, tuple(used), interference, straggler,
                floor)
