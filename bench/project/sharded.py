"""One optimizer step of a sharded data-parallel engine (FSDP / FSDP2 / ZeRO) on n ranks: compute as
measured, the per-block all-gathers and reduce-scatters on one communication stream, as a table of terms
(bench/project/terms.py) that step_time times.

The model is cut into blocks (the fully_shard groups), each holding params_i parameters; block i's compute
is its share params_i / Σ params of forward F and backward B (per micro-step: F/K, B/K). NCCL runs the
collectives of one communicator in issue order, so they share one stream; compute runs on another. Per
micro-step, with prefetch one block ahead (FSDP's forward/backward prefetch, FSDP2's default):

    forward   AG_1 issued at the micro-step's start; block i starts at max(compute free, AG_i done) and,
              as it starts, issues AG_{i+1}
    backward  (modes that reshard after forward) AG_L issued when forward ends; block i starts at
              max(compute free, AG_i done) and issues AG_{i−1}; as it ends it issues RS_i (on micro-steps
              that reduce: every one, or only the last under no_sync)
    step      the last micro-step's compute and collectives done, then the optimizer

Modes (`Sharding.mode`), what each block sends (S_i = params_i × bytes):

    full      FULL_SHARD, ZeRO-3, FSDP2 reshard_after_forward=True: AG forward, AG backward, RS
    grad_op   SHARD_GRAD_OP, FSDP2 reshard_after_forward=False: AG forward, RS (parameters kept until
              backward)
    hybrid    HYBRID_SHARD: `full` inside a node (g ranks); each RS is followed by the all-reduce of the
              node's 1/g shard between nodes, over each GPU's share of its node's NICs
    zero2     ZeRO-2 (DeepSpeed, Megatron's distributed optimizer): RS per block in backward, then one
              all-gather of every updated parameter after the optimizer, exposed
    zero1     ZeRO-1: all-reduce per block in backward (as DDP), then the same all-gather after the optimizer

Rows of the table, per micro-step: each block's forward and backward (compute, hides_comm: the sharded
engine's collectives run under both), each all-gather after the point that issues it, each reduction after
its block's backward, HYBRID_SHARD's between-nodes all-reduce after its reduce-scatter; then the optimizer
after every collective, and ZeRO-1/2's all-gather after the optimizer.

Collective costs: collectives.py (all-gather and reduce-scatter are NCCL rings). exposed = step − (F + B
+ O); the physics terms (physics.py) are added by terms.step_time. With one rank nothing is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.project.collectives import NONE, Cost, allgather_cost, allreduce_cost, reduce_scatter_cost
from bench.project.network import Network, flat_fabric
from bench.project.physics import OFF, Physics
from bench.project.simulate import Compute
from bench.project.terms import COMM, Step, Table, Term, step_time

MODES = ("full", "grad_op", "hybrid", "zero2", "zero1")
RESHARD_MODES = ("full", "hybrid")   # a second all-gather before each block's backward
# Kaplan et al. 2020 (§2.1): a transformer of L layers of width d has P ≈ 12·L·d² parameters; GPT-3's
# 6.7B, 13B and 175B models and MPT-7B are all d/L = 128 (Brown et al. 2020, Table 2.1; MosaicML's MPT-7B
# card: 4096/32). Blocks of a model whose layer count is not stated: L = (P / (12·128²))^(1/3).
WIDTH_PER_LAYER = 128


@dataclass(frozen=True)
class Sharding:
    """How a sharded engine communicates (module docstring): `param_bytes` per parameter all-gathered
    (the mixed-precision policy's parameter dtype), `grad_bytes` per parameter reduced (its reduce dtype);
    `reduce_every_micro_step` False when gradients accumulate unsharded until the last micro-step
    (FSDP's no_sync, FSDP2's set_requires_gradient_sync(False))."""

    mode: str
    param_bytes: float
    grad_bytes: float
    reduce_every_micro_step: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"sharding mode {self.mode!r} is not one of {MODES}")
        if not (self.param_bytes > 0 and self.grad_bytes > 0):
            raise ValueError(f"param_bytes={self.param_bytes}, grad_bytes={self.grad_bytes} must be > 0")


def estimated_blocks(params: int) -> int:
    """Layers of a transformer of `params` parameters at d/L = WIDTH_PER_LAYER (module constant), ≥ 1."""
    return max(1, round((params / (12 * WIDTH_PER_LAYER**2)) ** (1 / 3)))


def uniform_blocks(params: int, blocks: int) -> tuple[int, ...]:
    """`params` split into `blocks` equal groups (the last takes the remainder)."""
    if blocks < 1 or params < 1:
        raise ValueError(f"params={params}, blocks={blocks} must be >= 1")
    each = params // blocks
    return (each,) * (blocks - 1) + (params - each * (blocks - 1),)


def _between_nodes(net: Network, size: float) -> Network:
    """The flat network of one GPU per node for HYBRID_SHARD's shard all-reduce: each GPU's share of its
    node's NICs, the inter-node latencies."""
    share = net.node_inter_gbps(size) / net.gpus_per_node
    fabric = flat_fabric("inter-share", share, net.inter.hop_us,
                         f"{net.inter.name}: its node's NICs shared by {net.gpus_per_node} GPUs")
    return Network("inter-share", fabric, fabric, gpus_per_node=1)


def _costs(net: Network, n: int, sharding: Sharding, params: int) -> tuple[Cost, Cost, list[Cost]]:
    """(all-gather, reduction, extra collectives after the reduction) of one block of `params`."""
    gather, reduce = params * sharding.param_bytes, params * sharding.grad_bytes
    if sharding.mode == "hybrid":
        g = min(n, net.gpus_per_node)
        nodes = n // g
        extra = [] if nodes == 1 else [allreduce_cost(_between_nodes(net, reduce / g), reduce / g, nodes)]
        return allgather_cost(net, gather, g), reduce_scatter_cost(net, reduce, g), extra
    if sharding.mode == "zero1":
        return NONE, allreduce_cost(net, reduce, n), []
    return allgather_cost(net, gather, n), reduce_scatter_cost(net, reduce, n), []


def sharded_terms(compute: Compute, blocks: tuple[int, ...], sharding: Sharding, network: Network | None,
                  n: int) -> list[Term]:
    """The table of one sharded step (module docstring) of `blocks` (parameters per fully_shard group,
    forward order); on one rank no collective."""
    if not blocks or any(b < 1 for b in blocks):
        raise ValueError(f"blocks={blocks}: need at least one block of >= 1 parameter")
    if n > 1 and network is None:
        raise ValueError(f"world size {n} needs a network")
    k, total = compute.grad_accum, sum(blocks)
    fwd = [compute.forward_ms / k * b / total for b in blocks]
    bwd = [compute.backward_ms / k * b / total for b in blocks]
    costs = [_costs(network, n, sharding, b) for b in blocks] if n > 1 else None
    in_steps = costs is not None and sharding.mode not in ("zero2", "zero1")
    reshard = costs is not None and sharding.mode in RESHARD_MODES
    table = Table()
    for micro in range(k):
        reduce = costs is not None and (sharding.reduce_every_micro_step or micro == k - 1)
        _forward(table, fwd, [c[0] for c in costs] if in_steps else None)
        _backward(table, bwd, [c[0] for c in costs] if reshard else None, costs if reduce else None,
                  "all-reduce" if sharding.mode == "zero1" else "reduce-scatter")
    collectives = [i for i, term in enumerate(table.terms) if term.stream == COMM]
    optimizer = table.compute("optimizer", compute.optimizer_ms, Table.ends(collectives))
    if sharding.mode in ("zero2", "zero1") and n > 1:  # updated parameter shards gathered after the step
        gather = allgather_cost(network, total * sharding.param_bytes, n)
        table.collective("all-gather of the updated parameters", gather, Table.end(optimizer))
    return table.terms


def _forward(table: Table, fwd: list[float], gathers: list[Cost] | None) -> None:
    """One micro-step's forward: block i after its all-gather (`gathers`, None: parameters already there),
    and as it starts the next block's all-gather issued (prefetch one ahead); the first all-gather issued
    when the compute before it is done."""
    gathered: list[tuple[tuple[int, float], ...]] = [()] * len(fwd)
    if gathers:
        first = table.collective("block 0 all-gather (forward)", gathers[0], table.compute_done())
        gathered[0] = Table.end(first)
    for i, ms in enumerate(fwd):
        row = table.compute(f"block {i} forward", ms, gathered[i], hides_comm=True)
        if gathers and i < len(fwd) - 1:
            issued = table.collective(f"block {i + 1} all-gather (forward)", gathers[i + 1], ((row, 0.0),))
            gathered[i + 1] = Table.end(issued)


def _backward(table: Table, bwd: list[float], gathers: list[Cost] | None,
              reductions: list[tuple[Cost, Cost, list[Cost]]] | None, reduction: str) -> None:
    """One micro-step's backward, last block first: block i after its all-gather again (`gathers`, None:
    kept since forward), issuing the next one's as it starts; as it ends, its reduction (`reductions`, None:
    gradients accumulate) and any collectives after that reduction."""
    last = len(bwd) - 1
    gathered: list[tuple[tuple[int, float], ...]] = [()] * len(bwd)
    if gathers:
        first = table.collective(f"block {last} all-gather (backward)", gathers[last], table.compute_done())
        gathered[last] = Table.end(first)
    for i in range(last, -1, -1):
        row = table.compute(f"block {i} backward", bwd[i], gathered[i], hides_comm=True)
        if gathers and i > 0:
            issued = table.collective(f"block {i - 1} all-gather (backward)", gathers[i - 1], ((row, 0.0),))
            gathered[i - 1] = Table.end(issued)
        if reductions:
            done = table.collective(f"block {i} {reduction}", reductions[i][1], Table.end(row))
            for extra in reductions[i][2]:
                done = table.collective(f"block {i} all-reduce between nodes", extra, Table.end(done))


def simulate_sharded(compute: Compute, blocks: tuple[int, ...], sharding: Sharding, network: Network | None,
                     n: int, physics: Physics = OFF) -> Step:
    """The step of `compute` with `blocks` (parameters per fully_shard group, forward order) sharded on
    `n` ranks of `network` (module docstring)."""
    return step_time(sharded_terms(compute, blocks, sharding, network, n), compute.step_ms, n, physics)


def bytes_of(dtype: str) -> int:
    """Bytes per element of a dtype word (fp32, tf32 → 4; bf16, fp16 → 2)."""
    words = {"fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
    if dtype not in words:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(words)}")
    return words[dtype]

