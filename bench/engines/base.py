"""What every engine tells the rest of the suite, in one small interface (nccl-tests' one file per
collective, here one module per engine). Nothing here imports torch: the matrix, the report and the
projection read an engine's facts without it; only `wrap` and the methods that take a model run in a rank.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    """An engine's facts; its behaviour comes from the subclass (`wrap`, `bucket_sizes_bytes`).

    has_buckets: it groups gradients into buckets of `bucket_cap_mb` (False: the matrix collapses the
    bucket axis for it, its cell id says `bna`, and it joins the group at torch DDP's default bucket).
    overlaps_backward: a bucket's collective starts while backward still runs (the projection starts each
    bucket at its ready time; an engine that does not reduces every bucket after backward).
    collectives: what it issues per synced step (the probe, trace classification and projection read it).
    reference: the engine every other one is compared with side by side (`speed_vs_torch`).
    options: the engine-specific matrix keys that apply to it (bench/schema.py ENGINE_OPTIONS lists them
    all, with their defaults). The matrix sweeps a key only for engines that name it; for the others the
    cell leaves it empty, so their cells and ids are unchanged. A key set while no listed engine takes it
    is a config error.
    in_default_sweep: swept when `matrix.engine` is not given (False: only when named).
    sharded: parameters, gradients and optimizer state are split over the ranks (FSDP): a sharded engine
    overrides full_parameters, load_full_parameters and full_gradients, which the parity gate reads its
    whole weights and synced gradients through (bench/worker/parity.py).
    """

    name: str
    summary: str
    has_buckets: bool = True
    overlaps_backward: bool = True
    collectives: tuple[str, ...] = ("all_reduce",)
    reference: bool = False
    options: tuple[str, ...] = ()
    in_default_sweep: bool = True
    sharded: bool = False

    def skip_reason(self, comm_dtype: str, device: str) -> str:
        """Why this engine cannot run a cell with these settings ("" when it can)."""
        return ""

    def wrap(self, module, bucket_cap_mb: float, comm_dtype: str, device):
        """`module` (already on `device`) wrapped by this engine over the default process group."""
        raise NotImplementedError

    def wrap_cell(self, module, cell, workload, device):
        """`module` wrapped for `cell` (its options included); `workload` says which modules are blocks.
        An engine without options needs only `wrap`."""
        return self.wrap(module, cell.wrap_bucket_mb, cell.comm_dtype, device)

    def full_parameters(self, model) -> list:
        """Collective for a sharded engine. Every parameter, whole, in `model.parameters()` order."""
        return [p.detach() for p in model.parameters()]

    def load_full_parameters(self, model, tensors: list) -> None:
        """Collective for a sharded engine. Set every parameter, in `model.parameters()` order, to the whole
        tensor given for it (the parity gate's same weights for every trainer: bench/worker/parity.py)."""
        import torch

        with torch.no_grad():
            for p, value in zip(model.parameters(), tensors, strict=True):
                p.copy_(value)

    def full_gradients(self, model) -> list:
        """Collective for a sharded engine. Every parameter's gradient as the optimizer would take it after
        the sync, whole, in `model.parameters()` order (zeros where a parameter has none)."""
        import torch

        return [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in model.parameters()]

    def state_bytes_per_rank(self, param_bytes: int, world_size: int, cell) -> dict[str, int]:
        """What a rank should hold, by the engine's layout, for `param_bytes` of fp32 parameters under
        AdamW: parameters, gradients (with a flat bucket copy unless its gradients are views of it) and
        the optimizer's two moments. A replicating engine holds all of it on every rank."""
        views = bool(getattr(cell, "gradient_as_bucket_view", False))
        copies = 1 if views or not self.has_buckets else 2
        return {"param_bytes_per_rank": param_bytes, "grad_bytes_per_rank": copies * param_bytes,
                "optimizer_state_bytes_per_rank": 2 * param_bytes}

    def no_sync(self, model):
        """A context in which backward accumulates gradients locally, communicating nothing (gradient
        accumulation's micro-steps, the compute-only window). torch DDP's and ddp_core's `no_sync()`."""
        return model.no_sync()

    def compute_only(self, model):
        """The compute-only window's context around one whole training step: no gradient communication,
        every other piece of a synced step's work (its optimizer step above all), so that step −
        compute-only is the communication. A replicating engine's gradients stay on its parameters under
        no_sync, so the optimizer steps them as usual: no_sync is all it needs."""
        return self.no_sync(model)

    def bucket_sizes_bytes(self, model, bucket_cap_mb: float) -> list[int]:
        """The bytes (in the gradients' dtype) of each message the wrapped `model` reduces per synced
        backward, in issue order, as the engine itself reports its layout."""
        raise NotImplementedError

    def sync_wait_ms(self, model, device) -> float | None:
        """Host time the last backward spent waiting for its gradients at its end, if the engine says."""
        return None

    # ---- the engine in the user's own training script (`bench advise`'s advice/ddp.md) ------------------

    def script_wrap(self, row) -> tuple[list[str], list[str]]:
        """(imports, lines) that wrap `model` in a user's torchrun script as this engine does for the
        results row `row` (its bucket size, comm_dtype and options); after `model = model.cuda()`. An
        engine that does not say raises NotImplementedError (the advice then points to its module)."""
        raise NotImplementedError(f"engine {self.name!r} gives no script for a user's training loop")

    def script_accumulate(self, k: int, micro_step: list[str]) -> list[str]:
        """A user's loop over k micro-batches (`micro_step`: forward and backward of one) with the gradients
        synchronised on the last only: `no_sync()` on the others, as torch DDP and ddp_core name it."""
        return [f"for i in range({k}):", "    x, y = next(batches)",
                f"    with contextlib.nullcontext() if i == {k - 1} else model.no_sync():",
                *(f"        {line}" for line in micro_step)]


def compile_line(row) -> list[str]:
    """A script's torch.compile of the whole model before it is wrapped, when the row compiled."""
    backend = str(row.get("compile") or "none")
    return [] if backend in ("none", "nan") else [
        f'model = torch.compile(model, backend="{backend}")  # compiled, then wrapped']


def flag(value) -> str:
    """A results row's boolean option as Python source ("True" / "False")."""
    return "True" if str(value).strip().lower() in ("true", "1", "1.0") else "False"
