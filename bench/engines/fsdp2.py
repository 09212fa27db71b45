"""`fsdp2`: torch.distributed.fsdp.fully_shard (FSDP2) on every block of the workload and on the root,
over a 1-D device mesh of the world. Parameters, gradients and AdamW's state are sharded (dim 0, one
shard per rank); each block's parameters are all-gathered before its forward (and, with
reshard_after_forward, again before its backward) and its gradients reduce-scattered after its backward.

reshard_after_forward true frees a block's gathered parameters after its forward (ZeRO-3-like: least
memory, a second all-gather in backward); false keeps them until backward (ZeRO-2-like). precision bf16 /
fp16 is FSDP2's MixedPrecisionPolicy (parameters gathered and computed in that dtype; the trainer's
autocast stays on top, as for every engine) with gradients reduced in comm_dtype's dtype (fp32 for
comm_dtype none).
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from typing import ClassVar

from bench.engines.base import Engine, flag
from bench.schema import WIRE_DTYPES

LOW_PRECISION = {"bf16": "bfloat16", "fp16": "float16"}  # precisions whose parameters FSDP2 casts


class FSDP2(Engine):
    # per wrapped model, its compute-only stand-in gradients (compute_only): dropped with the model
    _stand_ins: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()

    def wrap_cell(self, module, cell, workload, device):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        param = LOW_PRECISION.get(cell.precision)
        wire = WIRE_DTYPES[cell.comm_dtype].torch_dtype
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, param) if param else None,
                                      reduce_dtype=getattr(torch, wire or "float32"))
        for block in workload.blocks(module):
            if cell.compile not in (None, "none"):  # per block, before sharding (as torchtitan does)
                block = replace_module(module, block, torch.compile(block, backend=cell.compile))
            fully_shard(block, mesh=mesh, reshard_after_forward=cell.reshard_after_forward, mp_policy=policy)
        # the root's own parameters (embeddings, head) form the last group; its gathered parameters stay
        # until backward either way (torch sets the root's reshard_after_forward to False when it is None)
        return fully_shard(module, mesh=mesh, reshard_after_forward=cell.reshard_after_forward,
                           mp_policy=policy)

    @contextmanager
    def no_sync(self, model):
        """FSDP2's equivalent of no_sync: no reduce-scatter; gradients accumulate unsharded. On leaving, every
        module's gradient sync is what it was on entering (torch DDP's `no_sync()` restores its flag too): a
        micro-step's no_sync inside the compute-only window or inside another no_sync must not switch sync
        back on for the step's last micro-step."""
        before = [(m, gradient_sync(m)) for m in fsdp_modules(model)]
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            for module, synced in before:
                module.set_requires_gradient_sync(synced, recurse=False)

    @contextmanager
    def compute_only(self, model):
        """The step with every collective replaced by a local copy (LocalAllGather, LocalReduceScatter through
        FSDP2's set_custom_all_gather / set_custom_reduce_scatter): all of FSDP2's own work runs as in a
        synced step — the copy-in and copy-out of its flat buffers, the casts to and from reduce_dtype, the
        division, the sharded gradients the optimizer steps — and nothing crosses a link. Two things follow
        that no_sync could not give: at one rank, where the collectives are local copies anyway, the window
        is the step (step − compute-only ≈ 0 at every precision; under no_sync FSDP2 skips its whole reduce
        path, host time included, and accumulates unsharded gradients instead: +15 ms and −2 ms on an H200,
        docs/gpu-node.md); and at any world size no rank waits for another inside the window (an all-gather
        makes every rank wait for the slowest), so each rank's time is its own work: the rank skew's evidence.
        The gathered parameters are this rank's shard repeated and the gradients this rank's own, finite
        and of the right size; their values are never a result (the window runs after the parity gate).

        A torch without the custom-collective API (before 2.9) gets the older window: no_sync with a
        stand-in zero gradient on every sharded parameter, so that AdamW still steps them (module docstring
        of this method's history: docs/design.md "fsdp2's compute-only window")."""
        modules = fsdp_modules(model)
        if not all(hasattr(m, "set_custom_all_gather") for m in modules):
            with self._no_sync_with_stand_ins(model):
                yield
            return
        saved = [(m, comms(m)) for m in modules]
        for module in modules:
            module.set_custom_all_gather(LocalAllGather())
            module.set_custom_reduce_scatter(LocalReduceScatter())
        try:
            yield
        finally:
            for module, (gather, scatter) in saved:
                module.set_custom_all_gather(gather)
                module.set_custom_reduce_scatter(scatter)

    @contextmanager
    def _no_sync_with_stand_ins(self, model):
        """The window on a torch without custom collectives: no_sync, with a stand-in sharded gradient on
        every parameter. Under set_requires_gradient_sync(False) FSDP2 keeps the unsharded gradients to
        itself and gives the sharded parameters no `.grad`, so AdamW would skip every parameter; zeros of
        each shard's shape, allocated once per model, give the optimizer the same tensors to work on."""
        import torch

        stand_ins = self._stand_ins.get(model)
        if stand_ins is None:
            stand_ins = self._stand_ins[model] = [
                (p, torch.zeros_like(p)) for p in model.parameters() if p.requires_grad]
        for p, zeros in stand_ins:
            if p.grad is None:
                p.grad = zeros
        with self.no_sync(model):
            yield

    def full_parameters(self, model):
        """Collective: each sharded parameter all-gathered (DTensor.full_tensor)."""
        return [p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach()
                for p in model.parameters()]

    def load_full_parameters(self, model, tensors):
        """Each rank's shard of the whole tensors, cut locally (distribute_tensor with src_data_rank None:
        every rank holds the same whole tensor, so nothing is sent) and copied into its sharded parameter."""
        import torch
        from torch.distributed.tensor import distribute_tensor

        with torch.no_grad():
            for p, value in zip(model.parameters(), tensors, strict=True):
                if not hasattr(p, "to_local"):
                    p.copy_(value)
                    continue
                shard = distribute_tensor(value.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None)
                p.to_local().copy_(shard.to_local())

    def full_gradients(self, model):
        """Collective: each sharded gradient all-gathered (what the reduce-scatter left on every rank, whole);
        zeros for a parameter without one (FSDP2 under no gradient sync gives the shards none)."""
        import torch

        out = []
        for p in model.parameters():
            if p.grad is None:
                out.append(torch.zeros(p.shape, dtype=p.dtype, device=p.device))  # the whole shape
            else:
                grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                out.append(grad.detach())
        return out

    def bucket_sizes_bytes(self, model, bucket_cap_mb):
        """One reduce-scatter per fully_shard group per synced backward, in backward order (the blocks in
        reverse, the root last): the bytes of the group's whole (unsharded) gradients."""
        from torch.distributed.fsdp import FSDPModule

        groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
        owned: list[int] = []
        seen: set[int] = set()
        for group in reversed(groups):  # innermost first, so the root keeps only what no block holds
            params = [p for p in group.parameters() if p.requires_grad and id(p) not in seen]
            seen |= {id(p) for p in params}
            owned.append(sum(p.numel() * p.element_size() for p in params))
        return [b for b in owned if b]

    def script_wrap(self, row):
        """fully_shard per block, then the root, over a 1-D mesh, with the row's MixedPrecisionPolicy;
        compiled per block before sharding (as wrap_cell does)."""
        wire = WIRE_DTYPES[row["comm_dtype"]]
        param = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(row["precision"], "None")
        reduce = f"torch.{wire.torch_dtype}" if wire.torch_dtype else "torch.float32"
        reshard = flag(row.get("reshard_after_forward"))
        backend = str(row.get("compile") or "none")
        body = ['mesh = init_device_mesh("cuda", (dist.get_world_size(),))',
                f"policy = MixedPrecisionPolicy(param_dtype={param}, reduce_dtype={reduce})",
                "for block in model.layers:  # each transformer block first, then the root"]
        if backend not in ("none", "nan"):
            body.append(f'    block.compile(backend="{backend}")  # per block, before sharding')
        body += [f"    fully_shard(block, mesh=mesh, reshard_after_forward={reshard}, mp_policy=policy)",
                 f"fully_shard(model, mesh=mesh, reshard_after_forward={reshard}, mp_policy=policy)"]
        return ["from torch.distributed.device_mesh import init_device_mesh",
                "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard"], body

    def script_accumulate(self, k, micro_step):
        """FSDP2 has no no_sync(): set_requires_gradient_sync(False) skips the reduce-scatter."""
        return [f"for i in range({k}):", "    x, y = next(batches)",
                f"    model.set_requires_gradient_sync(i == {k - 1})",
                *(f"    {line}" for line in micro_step)]

    def state_bytes_per_rank(self, param_bytes, world_size, cell):
        """Everything sharded: each rank holds 1/world_size of the parameters, gradients and AdamW's two
        moments (dim 0 padded to a multiple of the world size: rounded up here). Not counted: a block's
        gathered parameters and gradients while it runs (with reshard_after_forward false, every block's
        gathered parameters from its forward to its backward)."""
        shard = math.ceil(param_bytes / world_size)
        return {"param_bytes_per_rank": shard, "grad_bytes_per_rank": shard,
                "optimizer_state_bytes_per_rank": 2 * shard}


def fsdp_modules(model) -> list:
    """The model's fully_shard modules (its blocks and the root)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _param_groups(module) -> list:
    """The FSDPParamGroups of one fully_shard module (torch 2.13 keeps a list, earlier releases one or
    None): private state, read only to save and restore what this engine switches."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return list(groups)


def gradient_sync(module) -> bool:
    """Whether the module's own parameters reduce their gradients at the next backward (what
    set_requires_gradient_sync(…, recurse=False) set; True for a module without parameters)."""
    return all(g.reduce_grads for g in _param_groups(module))


def comms(module) -> tuple:
    """The module's all-gather and reduce-scatter implementations now (FSDP2's defaults unless replaced)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    groups = _param_groups(module)
    if not groups:
        return DefaultAllGather(), DefaultReduceScatter()
    return groups[0]._all_gather_comm, groups[0]._reduce_scatter_comm


class LocalAllGather:
    """FSDP2's all-gather as a local copy (the compute-only window): this rank's shard is already in its
    slot of the output (FSDP2's copy-in put it there); the other slots get copies of it, in two kernels
    whatever the world size, so the output holds finite parameters of the right size and nothing is sent."""

    def allocate(self, size, *, dtype, device):
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        rank, ws = group.rank(), group.size()
        slots = output_tensor.view(ws, -1)
        if rank > 0:
            slots[:rank].copy_(input_tensor.expand(rank, -1))
        if rank < ws - 1:
            slots[rank + 1:].copy_(input_tensor.expand(ws - rank - 1, -1))
        return None  # done on the current stream: nothing to wait for


class LocalReduceScatter:
    """FSDP2's reduce-scatter as a local copy (the compute-only window): this rank's chunk of its own
    unsharded gradients, unreduced, into the output (one kernel; FSDP2 skips the call at world size 1)."""

    def allocate(self, size, *, dtype, device):
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op=None, async_op=False):
        output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])
        return None


def replace_module(root, old, new):
    """Put `new` where `old` sits in `root` (its parent's attribute of the same name); returns `new`."""
    for name, module in root.named_modules():
        if module is old:
            parent_name, _, attr = name.rpartition(".")
            setattr(root.get_submodule(parent_name), attr, new)
            return new
    raise ValueError("a workload block is not a submodule of its model")


ENGINE = FSDP2("fsdp2", "torch.distributed.fsdp.fully_shard (FSDP2) per block and on the root",
               has_buckets=False, collectives=("all_gather", "reduce_scatter"),
               options=("reshard_after_forward", "compile"), in_default_sweep=False, sharded=True)
