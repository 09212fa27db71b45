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
    """

    name: str
    summary: str
    has_buckets: bool = True
    overlaps_backward: bool = True
    collectives: tuple[str, ...] = ("all_reduce",)
    reference: bool = False

    def skip_reason(self, comm_dtype: str, device: str) -> str:
        """Why this engine cannot run a cell with these settings ("" when it can)."""
        return ""

    def wrap(self, module, bucket_cap_mb: float, comm_dtype: str, device):
        """`module` (already on `device`) wrapped by this engine over the default process group."""
        raise NotImplementedError

    def no_sync(self, model):
        """A context in which backward accumulates gradients locally, communicating nothing (gradient
        accumulation's micro-steps, the compute-only window). torch DDP's and ddp_core's `no_sync()`."""
        return model.no_sync()

    def bucket_sizes_bytes(self, model, bucket_cap_mb: float) -> list[int]:
        """The bytes (in the gradients' dtype) of each message the wrapped `model` reduces per synced
        backward, in issue order, as the engine itself reports its layout."""
        raise NotImplementedError

    def sync_wait_ms(self, model, device) -> float | None:
        """Host time the last backward spent waiting for its gradients at its end, if the engine says."""
        return None
