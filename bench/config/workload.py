"""The workload section: the model, its data and its batch rules."""

from __future__ import annotations

from dataclasses import dataclass

from bench.config.checks import MAX_BATCH, ConfigError, check_min


@dataclass(frozen=True)
class WorkloadConfig:
    """The model and its batch. Batch rule: strong scaling splits `global_batch` (samples per micro-step,
    summed over ranks) evenly over the ranks; weak scaling gives every rank `per_rank_batch` samples. Memory
    rule: a rank's micro-step above `micro_batch` samples runs as equal smaller forwards, accumulated."""

    model: str = "mlp"
    model_size: str = "tiny"
    task: str = "classification"
    data: str = "synthetic"
    seq_len: int | None = None
    fixed_length: bool = True
    image_size: int | None = None
    global_batch: int = 16
    per_rank_batch: int = 8
    # the memory rule: the most samples a rank runs through one forward; a per-rank micro-step above it is
    # run as equal smaller ones, their gradients accumulated (bench.matrix.micro_splits). None: no limit
    micro_batch: int | None = None
    # a second per-rank batch measured at the smallest world size (every configuration there, weak
    # scaling): two batches give the step's fixed cost, which `bench project` and `bench advise` need when
    # the per-GPU batch changes (bench/project/protocol.py; docs/projection.md "Fixed cost"). None: none
    fixed_cost_batch: int | None = None

    def __post_init__(self):
        check_min("workload.global_batch", [self.global_batch], 1, maximum=MAX_BATCH)
        check_min("workload.per_rank_batch", [self.per_rank_batch], 1, maximum=MAX_BATCH)
        if self.fixed_cost_batch is not None:
            check_min("workload.fixed_cost_batch", [self.fixed_cost_batch], 1, maximum=MAX_BATCH)
        if self.micro_batch is not None:
            check_min("workload.micro_batch", [self.micro_batch], 1, maximum=MAX_BATCH)
        if self.seq_len is not None:
            check_min("workload.seq_len", [self.seq_len], 1, maximum=MAX_BATCH)
        if self.image_size is not None:
            check_min("workload.image_size", [self.image_size], 1, maximum=65536)
        from bench.workloads import resolve_model_spec

        try:  # a user model's relative file path → absolute: every rank, on any node, imports that file
            object.__setattr__(self, "model", resolve_model_spec(self.model))
        except ValueError as e:
            raise ConfigError(f"workload: {e}") from None

    def options(self):
        """The workload registry's `WorkloadOptions` for this section."""
        from bench.workloads import WorkloadOptions

        return WorkloadOptions(seq_len=self.seq_len, fixed_length=self.fixed_length, task=self.task,
                               data=self.data, image_size=self.image_size)
