"""`torch`: torch.nn.parallel.DistributedDataParallel, compressed communication through its default
fp16/bf16 comm hooks (comm_dtype) or PowerSGD (comm_hook), and its static_graph and
gradient_as_bucket_view knobs. The reference every other engine is compared with."""

from __future__ import annotations

from bench.engines.base import Engine, compile_line, flag
from bench.schema import WIRE_DTYPES, MiB

# PowerSGD compresses from this DDP iteration on: torch's minimum with error feedback and warm start
# (PowerSGDState refuses <= 1: the reducer rebuilds its buckets after iteration 1, and the compressor's
# state is laid out on the rebuilt buckets). Every run has at least 2 warm-up steps (run.warmup_steps),
# so the timed steps are all compressed and the first compressed steps (P, Q allocated) are warm-up.
POWERSGD_START_ITER = 2


class TorchDDP(Engine):
    def script_wrap(self, row):
        wire = WIRE_DTYPES[row["comm_dtype"]]
        views, static = flag(row.get("gradient_as_bucket_view")), flag(row.get("static_graph"))
        imports = ["from torch.nn.parallel import DistributedDataParallel as DDP"]
        body = [*compile_line(row),
                f"model = DDP(model, device_ids=[local_rank], bucket_cap_mb={row['bucket_cap_mb']:g},",
                f"            gradient_as_bucket_view={views}, static_graph={static})"]
        if wire.torch_hook:
            imports.append("from torch.distributed.algorithms.ddp_comm_hooks import default_hooks")
            body.append(f"model.register_comm_hook(state=None, hook=default_hooks.{wire.torch_hook})")
        elif str(row.get("comm_hook")) == "powersgd":
            imports.append("from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook")
            body += [f"state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank="
                     f"{int(row['powersgd_rank'])},",
                     f"                                    start_powerSGD_iter={POWERSGD_START_ITER})",
                     "model.register_comm_hook(state=state, hook=powerSGD_hook.powerSGD_hook)"]
        return imports, body

    def skip_reason(self, comm_dtype: str, device: str) -> str:
        if comm_dtype == "bf16" and device == "cpu":
            return "engine=torch, comm_dtype=bf16: torch's bf16_compress_hook needs CUDA and NCCL"
        return ""

    def wrap(self, module, bucket_cap_mb, comm_dtype, device, comm_hook="none", powersgd_rank=None,
             static_graph=False, gradient_as_bucket_view=False):
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=bucket_cap_mb,
                                        static_graph=bool(static_graph),
                                        gradient_as_bucket_view=bool(gradient_as_bucket_view))
        hook = WIRE_DTYPES[comm_dtype].torch_hook
        if hook:
            model.register_comm_hook(state=None, hook=getattr(default_hooks, hook))
        elif comm_hook == "powersgd":
            # every rank seeds its low-rank factors alike (random_seed), so the replicas stay identical
            state = powerSGD_hook.PowerSGDState(process_group=dist.group.WORLD,
                                                matrix_approximation_rank=powersgd_rank,
                                                start_powerSGD_iter=POWERSGD_START_ITER)
            hook = powerSGD_hook.powerSGD_hook
            if device.type != "cuda":
                hook = in_bucket_order(hook)
            model.register_comm_hook(state=state, hook=hook)
        return model

    def wrap_cell(self, module, cell, workload, device):
        if cell.compile not in (None, "none"):
            # the model compiled, then wrapped: inside DDP's forward dynamo uses DDPOptimizer, which splits
            # the graph at the buckets so their all-reduces still overlap backward. With torch 2.13 on CPU
            # neither torch.compile(DDP(model)) nor model.compile() in place compiled a graph (DDP's
            # forward breaks the graph and calls the module from a frame dynamo skips); this did.
            import torch

            module = torch.compile(module, backend=cell.compile)
        return self.wrap(module, cell.wrap_bucket_mb, cell.comm_dtype, device, comm_hook=cell.comm_hook,
                         powersgd_rank=cell.powersgd_rank, static_graph=cell.static_graph,
                         gradient_as_bucket_view=cell.gradient_as_bucket_view)

    def bucket_sizes_bytes(self, model, bucket_cap_mb):
        """The reducer's rebuilt layout when its logging data has it (`rebuilt_bucket_sizes`, as the parity
        tests read it: bytes, in gradient-ready order; torch records it only at some iterations and
        rebuilds only above world size 1), else torch's assignment rule over the trainable parameters,
        which is the order the rebuild follows for most models."""
        data = model._get_ddp_logging_data() if hasattr(model, "_get_ddp_logging_data") else {}
        text = data.get("rebuilt_bucket_sizes")
        if text:
            return [int(s) for s in str(text).split(",") if s.strip()]
        return assigned_sizes(model, bucket_cap_mb)


def in_bucket_order(hook):
    """`hook`, finished before it returns. PowerSGD issues a bucket's second and third collectives from
    completion callbacks (`Future.then`); gloo runs those on its own threads, so with several buckets the
    ranks can issue them in different orders, and gloo pairs collectives by order (seen on CPU with torch
    2.13: a hang, or "Received data size doesn't match expected size", at bucket_cap_mb 0.05 on the tiny
    MLP; one bucket ran). Waiting here issues every collective from the backward thread in bucket order:
    correct on gloo, at the price of no overlap between the reduction and the rest of backward on CPU."""
    def ordered(state, bucket):
        future = hook(state, bucket)
        future.wait()
        return future
    return ordered


def assigned_sizes(model, bucket_cap_mb: float) -> list[int]:
    """torch's bucket assignment (compute_bucket_assignment_by_size, reverse parameter order, a bucket
    closes once it reaches the cap, one dtype per bucket) by ddp_core's `assign_buckets`. With an explicit
    bucket_cap_mb, as here, torch 2.13 uses that cap for the first bucket too."""
    from ddp_core import assign_buckets

    params = list(reversed([p for p in model.parameters() if p.requires_grad]))
    sizes = [p.numel() * p.element_size() for p in params]
    keys = [(p.dtype, p.device) for p in params]
    groups = assign_buckets(sizes, max(1, int(bucket_cap_mb * MiB)), keys=keys)
    return [sum(sizes[i] for i in group) for group in groups]


ENGINE = TorchDDP("torch", "torch.nn.parallel.DistributedDataParallel", reference=True,
                  options=("comm_hook", "powersgd_rank", "static_graph", "gradient_as_bucket_view",
                           "compile"))
