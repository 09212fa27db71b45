"""The schedule of a sweep, one pure scheduler for `bench run` and `bench slurm`: given the cells (and what
each is estimated to take), the node's GPUs and CPUs, run.launches, run.seed, run.search and run.pack, and
for a SLURM job its nodes and ranks per node, which launches run when and where. No processes, no files: the
local runner (bench/run/sweep.py), the packing (bench/run/packing.py: the slots' GPUs and CPUs), the
estimate (bench/run/estimate.py) and the sbatch script (bench/run/slurm.py) all take it from here, and
tests/test_schedule.py works it by hand.

- **Order of launches** (`launch_order`, `launch_cells`): run.launches per world size, shuffled with the
  run's seed so that a drift of the machine lands on every world size and repeat alike; a racing search
  that carries eliminations over runs the world sizes in order instead. A launch's cells are shuffled too.
- **Launches at once on a node** (`slot_count`, `units`, `spread`, `shares`, `lanes`): a world size below
  the node's GPUs runs in several launches at once, each a share of whole groups (whole recipes in a race),
  split longest first (LPT), the shares rotated over the slots by the repeat.
- **A SLURM job** (`launch_steps`, `job_schedule`, JobSchedule): one step per world size; the one-node ones
  in lanes, one a node, at the same time (the same LPT), the steps over several nodes after them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

from bench.config import ConfigError
from bench.matrix import engine_groups
from bench.race import recipe

# ---- the order of a sweep's launches ----------------------------------------------------------------------


def launch_order(world_sizes: list[int], launches: int, seed: int,
                 in_order: bool = False) -> list[tuple[int, int]]:
    """(world size, repeat) of every launch of a sweep: run.launches per world size, in an order shuffled
    with the run's seed, so that a drift of the machine over the run lands on every world size and repeat
    alike (Google Benchmark's random interleaving of repetitions). One launch each, or `in_order` (a
    `race` search: a world size's eliminations carry over to the larger ones): the world sizes in order,
    each one's launches in a row."""
    schedule = [(ws, j) for ws in world_sizes for j in range(launches)]
    if launches > 1 and not in_order:
        random.Random(seed).shuffle(schedule)
    return schedule


def launch_cells(pending: list, seed: int, ws: int, repeat: int, launches: int) -> list:
    """The order a launch (world size `ws`, repeat `repeat`) runs its pending cells in: theirs, or, with
    run.launches > 1, shuffled with the run's seed, the world size and the repeat, so that no group is
    always first in its launch, right after start-up."""
    cells = list(pending)
    if launches > 1:
        random.Random(f"{seed}-{ws}-{repeat}").shuffle(cells)
    return cells


# ---- launches at once on one node (run.pack) --------------------------------------------------------------


def slot_count(pack: str, device: str, ws: int, gpus: int, cpus: int, threads_per_rank: int) -> int:
    """How many launches of world size `ws` run at once (bench/run/packing.py): on CUDA (`auto` or `on`) the
    node's GPUs ÷ ws; on a CPU (`on` only) its cores ÷ (ws × max(1, run.threads_per_rank)); 1 when off."""
    if pack == "off" or (device == "cpu" and pack == "auto"):
        return 1
    if device == "cuda":
        return max(1, gpus // ws)
    return max(1, cpus // (ws * max(1, threads_per_rank)))


def spread(units: Sequence[Hashable], seconds: Callable[[Hashable], float], n: int) -> list[list[Hashable]]:
    """`units` over n slots, longest first (of equal times the first in `units`), each to the slot with the
    least time so far (of equal times the first slot) (LPT: within 4/3 of the best split's longest slot,
    Graham 1969); a slot's units keep their order in `units`. Slots may be empty when there are fewer units
    than slots."""
    loads, shares = [0.0] * n, [[] for _ in range(n)]
    order = {u: i for i, u in enumerate(units)}
    for unit in sorted(units, key=lambda u: (-seconds(u), order[u])):
        k = min(range(n), key=lambda i: (loads[i], i))
        loads[k] += seconds(unit)
        shares[k].append(unit)
    return [sorted(s, key=order.__getitem__) for s in shares]


def packed_seconds(unit_seconds: Sequence[float], n: int) -> float:
    """The wall time of units spread over n slots at once (`spread`): its longest slot."""
    units = list(range(len(unit_seconds)))
    return max((sum(unit_seconds[u] for u in share) for share in spread(units, unit_seconds.__getitem__, n)),
               default=0.0)


def units(cells: Sequence, races: bool) -> list[list]:
    """What a slot takes whole, in the cells' order: a race's recipes (its candidates race each other
    through the launch: bench/worker/racing.py), else the groups stepped side by side (engine_groups)."""
    if not races:
        return engine_groups(list(cells))
    out: dict[tuple, list] = {}
    for cell in cells:
        out.setdefault(recipe(cell), []).append(cell)
    return list(out.values())


def shares(cells: Sequence, races: bool, seconds: Callable[[object], float], n: int) -> list[list]:
    """`cells` of one world size split over n slots (`spread` of their `units`, a unit's time the sum of its
    cells'), each share in the cells' order; empty shares left out."""
    parts = units(cells, races)
    spread_parts = spread(list(range(len(parts))), lambda i: sum(seconds(c) for c in parts[i]), n)
    order = {id(c): i for i, c in enumerate(cells)}
    return [sorted((c for i in share for c in parts[i]), key=lambda c: order[id(c)])
            for share in spread_parts if share]


def lanes(slots: Sequence, cell_shares: list[list], repeat: int) -> list[tuple]:
    """(slot, its share) for each launch of one world size that runs at once: share i in slot (i + repeat)
    mod the slots, so that with run.launches > 1 each share meets other GPUs; each slot's `of` the launches
    that do run at once (fewer than the slots when there are fewer shares). `slots`: packing.Slot values."""
    return [(replace(slots[(i + repeat) % len(slots)], of=len(cell_shares)), share)
            for i, share in enumerate(cell_shares)]


# ---- a SLURM job: its steps over the job's nodes ----------------------------------------------------------

Step = tuple[int, int, int]  # (world size, nodes, ranks per node): launch_steps


def launch_steps(world_sizes: list[int], nodes: int, per_node: int) -> list[Step]:
    """Per world size W, the step that runs it: (W, nodes, ranks per node) — one node × W ranks when
    W ≤ per_node, else W / per_node nodes × per_node ranks. ConfigError for a W the job cannot form."""
    steps = []
    for ws in sorted(set(world_sizes)):
        if ws <= per_node:
            steps.append((ws, 1, ws))
        elif ws % per_node:
            raise ConfigError(f"matrix.world_size={ws}: not a multiple of {per_node} ranks per node (a "
                              f"launch above one node puts {per_node} ranks on each of its nodes)")
        elif ws // per_node > nodes:
            raise ConfigError(f"matrix.world_size={ws}: above the {nodes * per_node} ranks of "
                              f"--nodes={nodes} × {per_node} per node")
        else:
            steps.append((ws, ws // per_node, per_node))
    return steps  # nodes no step uses: slurm_job.check_nodes


@dataclass(frozen=True)
class JobSchedule:
    """When and where each step of a SLURM job runs. The steps on one node run in `lanes`, lane i on the
    job's node i, the lanes at the same time (eight 1-GPU and 2-GPU world sizes need not wait on one node
    while the others idle); a lane shares nothing with another but the filesystem, each on a node of its
    own. The steps over several nodes (`spanning`) run after every lane has ended, one after another, from
    node 0."""

    lanes: tuple[tuple[Step, ...], ...]
    spanning: tuple[Step, ...]
    # one-node world sizes packed on their node (bench/run/packing.py): (world size, launches at once), each
    # launch its own srun step on its own GPUs and CPUs, all at once (slurm.packed_shares)
    packed: tuple[tuple[int, int], ...] = ()

    def at_once(self, ws: int) -> int:
        """How many launches of world size `ws` run at once on its node (1: not packed)."""
        return dict(self.packed).get(ws, 1)

    def seconds(self, per_step: dict[int, float]) -> float:
        """The job's wall time for each world size's `per_step` seconds: the longest lane, then the rest."""
        lane = max((sum(per_step[ws] for ws, _, _ in steps) for steps in self.lanes), default=0.0)
        return lane + sum(per_step[ws] for ws, _, _ in self.spanning)

    def nodes_used(self) -> int:
        return max([len(self.lanes), *(n for _, n, _ in self.spanning)])

    def words(self) -> str:
        """'world sizes 1, 8 on node 0 | 2, 4 on node 1 (at the same time); then 16 on 2 nodes × 8'."""
        parts = []
        if self.lanes:
            parts.append(" | ".join(f"world size{'s' * (len(steps) > 1)} "
                                    f"{', '.join(self._size(w) for w, _, _ in steps)} on node {i}"
                                    for i, steps in enumerate(self.lanes))
                         + (" (at the same time)" if len(self.lanes) > 1 else ""))
        parts += [f"world size {w} on {n} nodes × {r}" for w, n, r in self.spanning]
        return "; then ".join(parts)

    def _size(self, ws: int) -> str:
        return f"{ws} ({self.at_once(ws)} launches at once)" if self.at_once(ws) > 1 else str(ws)


def job_schedule(steps: list[Step], nodes: int, per_step: dict[int, float],
                 packed: dict[int, int] | None = None) -> JobSchedule:
    """The one-node steps `spread` over min(nodes, their count) lanes by each world size's estimated seconds
    (`per_step`), a lane's steps smallest world size first; the spanning steps after them in order;
    `packed`: the one-node world sizes' launches at once (world size → count, when more than one)."""
    single = sorted(s for s in steps if s[1] == 1)
    lanes = spread(single, lambda s: per_step[s[0]], min(nodes, len(single))) if single else []
    return JobSchedule(lanes=tuple(tuple(lane) for lane in lanes),
                       spanning=tuple(s for s in steps if s[1] > 1),
                       packed=tuple(sorted((packed or {}).items())))
