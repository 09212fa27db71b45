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
        """FSDP2's equivalent of no_sync: no reduce-scatter; gradients accumulate unsharded."""
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    @contextmanager
    def compute_only(self, model):
        """no_sync, with a stand-in sharded gradient on every parameter. Under
        set_requires_gradient_sync(False) FSDP2 keeps the unsharded gradients to itself and gives the
        sharded parameters no `.grad` (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py,
        post_backward returns before its reduce-scatter), so AdamW would skip every parameter and the
        window would leave out the optimizer step a synced step runs (its time would count as exposed
        communication, even at world size 1). Zeros of each shard's shape, set before the step (GradScaler
        unscales before the optimizer runs) and allocated once per model as the reduce-scatter's output
        is, give the optimizer (and fp16's inf check) the same tensors to work on; their values are never
        a result (the window runs after the parity gate)."""
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
