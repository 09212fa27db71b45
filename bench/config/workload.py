"""The workload section: the model, its data and its batch rules."""

from __future__ import annotations

from dataclasses import dataclass

from bench.config.checks import MAX_BATCH, ConfigError, check_min


@dataclass(frozen=True)
class WorkloadConfig:
    """The model and its batch. Batch rule: strong scaling splits `global_batch` (samples per micro-step,
    summed over ranks) evenly over the ranks; weak scaling gives every rank `per_rank_batch` samples. Memory
    rule: a rank's micro-step above `micro_batch` samples runs as equal smaller forwards, accumulated."""

    # a family of bench/workloads/registry.py (mlp | transformer | resnet), "hf:<local path>" (a Hugging
    # Face checkpoint) or a user spec "path/to/file.py:Name" | "package.module:Name" (bench/workloads/user.py)
    model: str = "mlp"
    model_size: str = "tiny"        # the model's size within its family (e.g. "tiny", "360m")
    task: str = "classification"    # sequence models: "classification" (MRPC pairs) | "lm" (causal LM)
    data: str = "synthetic"         # "synthetic", or a local GLUE MRPC file (train.tsv, msr_paraphrase_*.txt)
    seq_len: int | None = None      # sequence models: fixed length, or the maximum when lengths vary
    fixed_length: bool = True       # sequence models: false draws MRPC-like lengths, padded per batch
    image_size: int | None = None   # image models: square input side in pixels
    global_batch: int = 16          # strong scaling: samples per micro-step summed over the ranks
    per_rank_batch: int = 8         # weak scaling: samples per micro-step on every rank
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
