"""BenchConfig: one run's description and sections, and the checks that need more than one section."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from bench.config.checks import ConfigError, fail
from bench.config.debug import DebugConfig
from bench.config.matrix import MatrixConfig
from bench.config.profile import ProfileConfig
from bench.config.run import RunConfig
from bench.config.workload import WorkloadConfig


@dataclass(frozen=True)
class BenchConfig:
    """One run: a description and its sections."""

    description: str = ""           # what the run is for, in a line (the report and compare show it)
    matrix: MatrixConfig = field(default_factory=MatrixConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    run: RunConfig = field(default_factory=RunConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def __post_init__(self):
        if "strong" in self.matrix.scaling:
            for ws in self.matrix.world_size:
                if self.workload.global_batch % ws:
                    fail("workload.global_batch", self.workload.global_batch,
                         f"strong scaling needs it divisible by every world size; world_size={ws}")
        from bench.workloads import get_workload

        # The registry checks model and size names (no model is built); a user spec is imported and its
        # constructor run, so a missing file, name or a failing constructor stops here.
        try:
            workload = get_workload(self.workload.model, self.workload.model_size, self.workload.options())
        except ValueError as e:
            raise ConfigError(f"workload: {e}") from None
        from bench.workloads.base import options_set

        uses = type(workload).uses_options  # a silently ignored option is a mis-measured run
        ignored = {k: v for k, v in options_set(self.workload.options()).items()
                   if uses is not None and k not in uses}
        if ignored:
            key, value = next(iter(ignored.items()))
            fail(f"workload.{key}", value, f"model {self.workload.model!r} does not use it "
                 f"(it reads {list(uses) or 'no options'}); leave it out")

    def to_dict(self) -> dict:
        """Plain nested dict (lists for tuples), None values included."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


SECTIONS = {"matrix": MatrixConfig, "workload": WorkloadConfig, "run": RunConfig,
            "profile": ProfileConfig, "debug": DebugConfig}
