"""A run's configurations projected over world sizes and networks: projection.csv's rows (one per
configuration × network × world size; definitions: docs/design.md "Projection").

Each row is the model's step at n ranks (configuration.py step_of: the engine kind's terms, terms.py), from
the configuration's base cell, its smallest world size with status ok, whose compute side (forward,
backward, optimizer) is the only one used, so validation (validation.py) never sees the step times it
predicts. On the run's own network (`measured`), and on the preset the user says the run measured on
(`bench project --measured-on`), a projection to n is anchored to the largest world size the run measured
between the base and n (anchor_of): the model's step times the measured step over the model's step there,
the model predicting the change from that measurement (docs/design.md "Anchored projections"; checked on
the published tables by the lab, benchmarks/projection_lab/). Another preset describes another machine,
whose error the run did not measure: no anchor there. Each row carries its 90 % interval
(interval_columns.py), or, when what was measured is a validated protocol (a whole node projected across
nodes; 1 and 2 GPUs projected within the node), that protocol's band and median correction
(protocol_columns.py).
"""

from __future__ import annotations

import pandas as pd

from bench import metrics
from bench.project.columns import CONFIG_COLUMNS, PROJECTION_COLUMNS, config_key, typed
from bench.project.configuration import Configuration, Setting, from_cell, per_rank_of, step_of
from bench.project.evidence import physics_of
from bench.project.inputs import COMM_DTYPE_WIRE
from bench.project.interval_columns import bands, interval_of
from bench.project.network import Network, NetworkAt
from bench.project.physics import Physics
from bench.project.protocol import NODE
from bench.project.protocol_columns import node_calibrated, protocol_columns, protocol_of


def _row(config: Configuration, **values) -> dict:
    base = {c: config.base[c] for c in ("cell_id",) + CONFIG_COLUMNS}
    return base | values


def anchor_of(config: Configuration, n: int, network_at: NetworkAt, algorithm: str,
              physics: Physics) -> tuple[int, float] | None:
    """(m, measured step / model step at m): the configuration's largest ok world size m between its base
    and n with a step time, and how far the model's step there is from the measured one (module
    docstring); None when there is none or the model cannot step there."""
    rows = config.rows
    between = rows[(rows["world_size"] > int(config.base["world_size"])) & (rows["world_size"] < n)]
    between = between.dropna(subset=["step_time_ms_p50"]).sort_values("world_size")
    if between.empty:
        return None
    cell = between.iloc[-1]
    m = int(cell["world_size"])
    try:
        net, _ = network_at(m, COMM_DTYPE_WIRE[config.base["comm_dtype"]])
        model = step_of(config, config.compute.at_batch(per_rank_of(config, m)[0]), net, m, algorithm,
                        physics).step_ms
    except (LookupError, ValueError):
        return None
    return m, float(cell["step_time_ms_p50"]) / model


def project(config: Configuration, network_name: str, network_at: NetworkAt, world_sizes: list[int],
            algorithm: str, physics: Physics | None = None, anchored: bool = False) -> list[dict]:
    """projection.csv rows of one configuration on one network; a world size that cannot be predicted is
    a row with empty numbers and its reason. `physics`: the terms (default physics_of(config));
    `anchored`: the network describes the machine the run measured on, so each world size is anchored to
    the largest measured one below it (anchor_of)."""
    physics = physics_of(config) if physics is None and config.compute is not None else physics
    band_table = bands()
    rows = []
    k = int(config.base["grad_accum"])
    for n in world_sizes:
        row = {"network": network_name, "world_size": n}
        if config.compute is None:
            rows.append(_row(config, **row, reason=config.reason))
            continue
        try:
            per_rank, t1_batch = per_rank_of(config, n)
        except ValueError as exc:
            rows.append(_row(config, **row, reason=str(exc)))
            continue
        try:
            net, source = network_at(n, COMM_DTYPE_WIRE[config.base["comm_dtype"]]) if n > 1 else (None, "")
            at = Setting(config, config.compute.at_batch(per_rank), net, n, algorithm, physics)
            step = at.step()
        except (LookupError, ValueError) as exc:
            rows.append(_row(config, **row, per_rank_batch=per_rank, reason=str(exc).strip("'\"")))
            continue
        anchor = anchor_of(config, n, network_at, algorithm, physics) if anchored and n > 1 else None
        measured = protocol_of(config, anchor, net, n)
        ratio = anchor[1] if anchor else 1.0
        if measured is not None and measured[0] == NODE:   # the lab's node protocol, exactly
            step, ratio = node_calibrated(at, anchor, network_at)
        t1 = config.compute.at_batch(t1_batch).step_ms
        # never faster than linear (the physical limit): an anchor measured below the model's step does
        # not carry N past T1 (weak scaling) or T1 / N (strong)
        ideal = t1 / n if config.base["scaling"] == "strong" else t1
        step_ms = max(step.step_ms * ratio, ideal)
        eff = (metrics.strong_scaling_efficiency(t1, step_ms, n) if config.base["scaling"] == "strong"
               else metrics.weak_scaling_efficiency(t1, step_ms))
        global_batch = per_rank * n * k
        samples = metrics.throughput(global_batch, step_ms)
        columns = interval_of(at, step, eff * 100, samples, band_table, anchored=anchor is not None)
        delta = columns.pop("delta", 0.0)
        if measured is not None:   # what the user measured has a validated band: print that one
            eff, step_ms, samples, printed_columns = protocol_columns(config, measured, eff, step_ms, samples,
                                                                      delta)
            columns |= printed_columns
        rows.append(_row(
            config, **row, algorithm="+".join(step.algorithms) or "none",
            nodes=_nodes(net, n), per_rank_batch=per_rank, global_batch=global_batch,
            predicted_step_ms=step_ms, predicted_samples_per_s=samples,
            efficiency_pct=eff * 100, exposed_comm_ms=step.exposed_comm_ms, comm_ms=step.comm_ms,
            comm_latency_ms=step.latency_ms, comm_bandwidth_ms=step.bandwidth_ms, bottleneck=step.bottleneck,
            timeline_source=config.buckets.source, network_source=source, reason="",
            straggler_ms=step.straggler_ms, interference_ms=step.interference_ms,
            host_floor_ms=step.host_floor_ms, dominant_term=step.dominant_term,
            anchor_world_size=anchor[0] if anchor else None, anchor_step_ratio=anchor[1] if anchor else None,
            protocol=measured[0] if measured else "", fixed_ms=at.compute.fixed_ms, **columns))
    return rows


def cells_table(configs: list[Configuration], cells: pd.DataFrame, networks: dict[str, NetworkAt],
                world_sizes: list[int], algorithm: str, anchored: tuple[str, ...] = ()) -> pd.DataFrame:
    """projection.csv's rows for the given cells only, each from its own batch (from_cell) within its
    configuration; a cell of no projected configuration (not ok) is left out. The networks named in
    `anchored` are the run's own (projection_table)."""
    by_key = {config_key(c.base): c for c in configs}
    rows = []
    for _, cell in cells.iterrows():
        config = by_key.get(config_key(cell))
        if config is None:
            continue
        for name, at in networks.items():
            for n in world_sizes:
                rows += project(from_cell(config, cell, n), name, at, [n], algorithm,
                                anchored=name in anchored)
    return typed(pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS)))


def _nodes(net: Network | None, n: int) -> int | None:
    """Nodes n ranks fill; empty for flat networks, whose ranks sit on no stated node layout."""
    if net is None:
        return 1
    return net.nodes(n) if net.gpus_per_node > 1 else None


def projection_table(configs: list[Configuration], networks: dict[str, NetworkAt], world_sizes: list[int],
                     algorithm: str, anchored: tuple[str, ...] = ()) -> pd.DataFrame:
    """projection.csv: every configuration × network × world size; the networks named in `anchored` are
    the run's own (project's `anchored`)."""
    rows = [r for c in configs for name, at in networks.items()
            for r in project(c, name, at, world_sizes, algorithm, anchored=name in anchored)]
    return typed(pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS)))
