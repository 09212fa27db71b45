"""The projection's physics: one optimizer step as a table of terms, and the one function that times it.

A term is one thing the step does on one rank: a stretch of compute (forward, a backward, one block's share
of either, the optimizer) or one collective (a bucket's all-reduce, a block's all-gather or reduce-scatter,
the between-nodes hop of a hybrid shard). Each is a row of a table (`Term`): what it costs (`ms`; a
collective also its alpha-beta `cost`), on which stream (compute or comm), and when it may start (`after`:
points of earlier terms, each "row i, fraction f of it done": f = 1 its end, f = 0 its start, a bucket's
ready time in between). A stream runs its terms one at a time in table order (NCCL runs one communicator's
collectives in issue order; a rank computes one kernel stream), so in the step's frame

    start_i = max(stream free, every `after` point)        end_i = start_i + ms_i
    wait_i  = max(0, `after` points − compute free)        (a compute row waiting for collectives)
    critical path = Σ (wait_i + ms_i) over compute rows + the collectives' tail past the last compute row
    exposed       = Σ wait_i + that tail

The frame is the step's own clock, or, when the table's first collective hangs from a compute row (DDP's
buckets: ready times as fractions of the synced backward), that row's start: the compute before it runs
under no collective and simply adds to the path. Timing a bucket timeline from its own backward keeps its
arithmetic to the digit what it was when DDP had its own simulator (the fitted bands, model_error.csv,
are sensitive to the last digit of a prediction at the efficiency limit).

step_time adds the physics terms (bench/project/physics.py; off by default) to the critical path:

    interference  γ × the communication that ran under compute (Σ comm − exposed); none on one rank
    straggler     the slowest of n ranks' compute (forward + backward + optimizer) beyond the median rank's
    host floor    the step cannot be shorter than the host's launch floor

Bottleneck (first rule that holds):
    compute          exposed ≤ 5 % of the step: the step is within 5 % of its no-communication time
    overlap-limited  Σ comm ≤ the compute marked `hides_comm` (what the collectives could have run under):
                     the stream could have hidden every collective, but they became ready too late
    bandwidth        Σ bandwidth terms ≥ Σ latency terms
    latency          otherwise

The builders of an engine kind's table: simulate.py (replicated DDP: bucket all-reduces against the synced
backward) and sharded.py (FSDP / ZeRO: per-block all-gathers and reduce-scatters).

Adding a term to the projection: in the builder of the engine kind it belongs to, add one row where it
happens in the step (`Table.compute` for work on the rank, `Table.collective` for a message on the wire,
with its cost from collectives.py), its `after` naming the rows it waits for (their `Table.ends` for "once
they are done"), and let the rows that wait for it name it in theirs. step_time needs no change: the
critical path, the exposed communication and the bottleneck follow from the table. A term that is not a
stretch of one stream (a slowdown in proportion to something) is a physics term (physics.py), added here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from bench.project.collectives import NONE, Cost
from bench.project.physics import OFF, Physics, host_floor_ms, interference_ms, straggler_ms

COMPUTE, COMM = "compute", "comm"   # the two streams of a rank
BOTTLENECKS = ("compute", "bandwidth", "latency", "overlap-limited")
# what N ranks add to the compute, each a Step field `<term>_ms` (Step.dominant_term names the largest)
LOSS_TERMS = ("exposed_comm", "interference", "straggler", "host_floor")
COMPUTE_BOUND_EXPOSED = 0.05  # exposed communication at most this fraction of the step: compute-bound


class Term(NamedTuple):
    """One row of a step's table (module docstring): `ms` on `stream`, starting once that stream is free
    and every `after` point (row of an earlier term, fraction of it done) is reached. `hides_comm`: compute
    that collectives may run under (the overlap window of the bottleneck rule); `cost`: a collective's
    latency and bandwidth split and the algorithm that gave them. A named tuple, not a frozen dataclass: a
    projection builds a few hundred thousand rows, and a tuple is built several times faster."""

    name: str
    stream: str
    ms: float
    after: tuple[tuple[int, float], ...] = ()
    hides_comm: bool = False
    cost: Cost | None = None


class Table:
    """The rows of one step's table as a builder adds them, in issue order; each add returns the row's
    index, for the `after` of the rows that wait for it."""

    def __init__(self):
        self.terms: list[Term] = []
        self._last_compute: int | None = None

    def compute(self, name: str, ms: float, after: tuple[tuple[int, float], ...] = (),
                hides_comm: bool = False) -> int:
        """A stretch of compute on the rank (after the compute before it)."""
        self.terms.append(Term(name, COMPUTE, ms, after, hides_comm))
        self._last_compute = len(self.terms) - 1
        return self._last_compute

    def collective(self, name: str, cost: Cost, after: tuple[tuple[int, float], ...] = ()) -> int:
        """A collective on the communication stream (after the collective issued before it)."""
        self.terms.append(Term(name, COMM, cost.total_us / 1e3, after, cost=cost))
        return len(self.terms) - 1

    def compute_done(self) -> tuple[tuple[int, float], ...]:
        """The `after` point "the compute issued so far is done" (none before the first compute)."""
        return () if self._last_compute is None else ((self._last_compute, 1.0),)

    @staticmethod
    def end(row: int) -> tuple[tuple[int, float], ...]:
        """The `after` point: `row` done."""
        return ((row, 1.0),)

    @staticmethod
    def ends(rows: Sequence[int]) -> tuple[tuple[int, float], ...]:
        """`after` points: each of `rows` done."""
        return tuple([(row, 1.0) for row in rows])


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
        name, value = max(((t, getattr(self, f"{t}_ms")) for t in LOSS_TERMS), key=lambda kv: kv[1])
        return name if value > 0 else "none"


def _frame_origin(terms: Sequence[Term]) -> int | None:
    """The row the table's first collective hangs from (its first `after` point), None when that collective
    waits on nothing or there is none: the frame the step is timed in (module docstring)."""
    for term in terms:
        if term.stream == COMM:
            return term.after[0][0] if term.after else None
    return None


def critical_path_ms(terms: Sequence[Term]) -> tuple[float, float]:
    """(critical path, exposed communication) of a table (module docstring): the step's clock advances by
    each compute row's wait for the collectives it needs and then by the row itself; the collectives still
    running after the last compute row add their tail."""
    origin = _frame_origin(terms)
    first = 0 if origin is None else origin
    path = 0.0
    for term in terms[:first]:   # compute before the frame: no collective runs under it
        path += term.ms
    start = [0.0] * len(terms)
    end = [0.0] * len(terms)
    compute_free = comm_free = 0.0   # each stream's clock, in the frame
    exposed = 0.0
    for i in range(first, len(terms)):
        term = terms[i]
        if first and any(j < first for j, _ in term.after):
            raise ValueError(f"{term.name} waits on a row before the frame's start ({terms[first].name})")
        ready = max([end[j] if f == 1.0 else start[j] + f * terms[j].ms for j, f in term.after], default=0.0)
        if term.stream == COMPUTE:
            wait = max(0.0, ready - compute_free)
            exposed += wait
            path += wait
            path += term.ms
            start[i] = max(ready, compute_free)
            end[i] = compute_free = start[i] + term.ms
        else:
            start[i] = max(ready, comm_free)
            end[i] = comm_free = start[i] + term.ms
    tail = max(0.0, comm_free - compute_free)
    return path + tail, exposed + tail


def step_time(terms: Sequence[Term], compute_ms: float, n: int, physics: Physics = OFF) -> Step:
    """The step of a table of terms on n ranks: its critical path plus the physics terms, the split of its
    communication and its bottleneck (module docstring). `compute_ms`: the rank's compute as measured
    (forward + backward + optimizer, what the rows of compute add up to), which the straggler scales."""
    compute = [t for t in terms if t.stream == COMPUTE]
    costs = [t.cost for t in terms if t.stream == COMM]
    path, exposed = critical_path_ms(terms)
    latency = bandwidth = 0.0
    used: list[str] = []
    for cost in costs:
        latency += cost.latency_us / 1e3
        bandwidth += cost.bandwidth_us / 1e3
        if cost is not NONE and cost.algorithm not in used:  # NONE: a collective of one rank, nothing sent
            used.append(cost.algorithm)
    comm = latency + bandwidth
    interference = interference_ms(max(0.0, comm - exposed), physics) if n > 1 else 0.0
    straggler = straggler_ms(compute_ms, n, physics)
    step = path + (interference + straggler)
    floor = host_floor_ms(step, physics)
    step += floor
    if exposed <= COMPUTE_BOUND_EXPOSED * step:
        bottleneck = "compute"
    elif comm <= sum(t.ms for t in compute if t.hides_comm):
        bottleneck = "overlap-limited"
    else:
        bottleneck = "bandwidth" if bandwidth >= latency else "latency"
    return Step(step, exposed, comm, latency, bandwidth, bottleneck, tuple(used), interference, straggler,
                floor)
