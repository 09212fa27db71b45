"""Bucket sizes of a configuration rebuilt from its workload, for runs without a bucket timeline.

The model is built on the meta device (shapes only, no memory, nothing initialised for real), and the
engine's rule is applied to its trainable parameters in reverse registration order: one message per
parameter for `naive`; ddp_core's `assign_buckets` at `bucket_cap_mb` for the others (torch DDP's rule,
bench.engines.torch_ddp.assigned_sizes). Parameters are fp32 in every workload (precision is autocast), so a
compressed comm dtype halves the bytes on the wire.
"""

from __future__ import annotations

from bench import engines
from bench.engines.torch_ddp import assigned_sizes
from bench.schema import DEFAULT_BUCKET_MB, WIRE_DTYPES
from bench.workloads import WorkloadOptions, get_workload


def workload_options(workload_table: dict) -> WorkloadOptions:
    """WorkloadOptions from a run's config.toml [workload] table (keys it does not know are ignored)."""
    fields = WorkloadOptions.__dataclass_fields__
    return WorkloadOptions(**{k: v for k, v in workload_table.items() if k in fields})


def parameter_sizes(model: str, model_size: str, options: WorkloadOptions) -> list[int]:
    """Bytes of each trainable parameter in reverse registration order (the order backward fills them)."""
    import torch

    with torch.device("meta"):
        module = get_workload(model, model_size, options).build_model()
    params = [p for p in module.parameters() if p.requires_grad]
    return [p.numel() * p.element_size() for p in reversed(params)]


def engine_bucket_sizes(engine: str, model: str, model_size: str, bucket_cap_mb: float | None,
                        comm_dtype: str, options: WorkloadOptions) -> list[int]:
    """Wire bytes of each all-reduce the engine issues per synced backward, in issue order."""
    import torch

    if engines.get(engine).sharded:  # one reduce-scatter per fully_shard group, as fsdp2 records them
        *blocks, root = block_params(model, model_size, options)
        sizes = [4 * b for b in reversed(blocks)] + [4 * root]   # fp32, backward order, the root last
    elif not engines.get(engine).has_buckets:
        sizes = parameter_sizes(model, model_size, options)
    else:
        with torch.device("meta"):
            module = get_workload(model, model_size, options).build_model()
        cap = DEFAULT_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb
        sizes = assigned_sizes(module, cap)
    return [WIRE_DTYPES[comm_dtype].on_wire(s) for s in sizes]



def bucket_shapes(model: str, model_size: str, bucket_cap_mb: float | None,
                  options: WorkloadOptions) -> list[list[tuple[int, ...]]]:
    """The shapes of the trainable parameters of each torch DDP bucket (reverse registration order, torch's
    rule at `bucket_cap_mb`), for PowerSGD's per-matrix compression (bench/project/powersgd.py)."""
    import torch

    from ddp_core import assign_buckets

    with torch.device("meta"):
        module = get_workload(model, model_size, options).build_model()
    params = list(reversed([p for p in module.parameters() if p.requires_grad]))
    cap = DEFAULT_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb
    sizes = [p.numel() * p.element_size() for p in params]
    groups = assign_buckets(sizes, max(1, int(cap * 2**20)), keys=[(p.dtype, p.device) for p in params])
    return [[tuple(params[i].shape) for i in group] for group in groups]


def block_params(model: str, model_size: str, options: WorkloadOptions) -> list[int]:
    """Trainable parameters of each fully_shard group in forward order: the workload's blocks, then the
    root's own parameters (those no block holds), as bench.engines.fsdp2 wraps them."""
    import torch

    with torch.device("meta"):
        workload = get_workload(model, model_size, options)
        module = workload.build_model()
    seen: set[int] = set()
    out = []
    for block in workload.blocks(module):
        params = [p for p in block.parameters() if p.requires_grad and id(p) not in seen]
        seen |= {id(p) for p in params}
        out.append(sum(p.numel() for p in params))
    out.append(sum(p.numel() for p in module.parameters() if p.requires_grad and id(p) not in seen))
    return [b for b in out if b]
