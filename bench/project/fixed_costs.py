"""A configuration's fixed cost: the part of a micro-step's forward and backward that does not shrink with
the per-rank batch (bench/project/protocol.py fixed_cost_ms), fitted when the run measured the same
configuration at two per-rank batches; and the note a projection that changes the batch without it needs.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from bench.project import protocol
from bench.project.columns import CONFIG_COLUMNS, config_key
from bench.project.configuration import Configuration


def _micro_ms(config: Configuration) -> float:
    return (config.compute.forward_ms + config.compute.backward_ms) / config.compute.grad_accum


def with_fixed_costs(configs: list[Configuration]) -> list[Configuration]:
    """Each configuration with its micro-step's fixed cost (protocol.fixed_cost_ms) when the run measured it
    at a second per-rank batch: another configuration that differs only in the batch, with its base at the
    same world size (the farthest batch of those). Only base cells are used, so validation still never
    sees the step times it predicts."""
    def sibling_key(c: Configuration) -> tuple:
        # the configuration less its batch and batch rule (at one world size strong and weak scaling run
        # the same trainers), at its base's world size
        key = config_key(c.base)
        kept = [v for col, v in zip(CONFIG_COLUMNS, key) if col != "scaling"]
        return tuple(kept) + key[len(CONFIG_COLUMNS) + 1:] + (int(c.base["world_size"]),)

    out = []
    for config in configs:
        if config.compute is None or config.sharded is not None:
            out.append(config)
            continue
        b = int(config.base["per_rank_batch"])
        others = [c for c in configs if c.compute is not None and c is not config
                  and sibling_key(c) == sibling_key(config) and int(c.base["per_rank_batch"]) != b]
        if not others:
            out.append(config)
            continue
        other = max(others, key=lambda c: abs(int(c.base["per_rank_batch"]) - b))
        b2 = int(other.base["per_rank_batch"])
        fixed = protocol.fixed_cost_ms(b, _micro_ms(config), b2, _micro_ms(other))
        out.append(replace(config, compute=replace(config.compute, fixed_ms=fixed),
                           fixed_source=f"fixed cost {fixed:.3g} ms per micro-step from per-rank batches {b} "
                                        f"({config.base['cell_id']}) and {b2} ({other.base['cell_id']})"))
    return out


def fixed_cost_needed(config: Configuration, table: pd.DataFrame) -> str:
    """A note when the configuration's projected rows change the per-rank batch and no second batch was
    measured ("" otherwise): the fixed cost is then 0, compute in proportion to the batch."""
    if config.compute is None or config.fixed_source:
        return ""
    mine = table[(table["cell_id"] == config.base["cell_id"]) & table["per_rank_batch"].notna()]
    changed = mine[mine["per_rank_batch"].astype(int) != int(config.base["per_rank_batch"])]
    if changed.empty:
        return ""
    smallest = int(changed["per_rank_batch"].min())
    return (f"{config.base['cell_id']}: the per-rank batch changes from {int(config.base['per_rank_batch'])} "
            f"to {smallest} and no second batch was measured at world size {int(config.base['world_size'])}: "
            "the step's fixed cost is taken as 0 (compute in proportion to the batch), which overstates "
            "strong scaling; measure the same configuration at a second workload.per_rank_batch (e.g. half) "
            "to fit it (docs/projection.md \"Fixed cost\")")
