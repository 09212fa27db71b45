"""What a row prints when what the run measured is a validated protocol (bench/project/protocol.py): a
whole node projected across nodes (`node`), or 1 and 2 GPUs projected within the node (`two-gpus`). Such a
row prints the protocol's band and its median correction instead of the regime's band, and under the
node protocol its compute is calibrated on the measured node as the lab calibrates a published node row.
"""

from __future__ import annotations

import math
from dataclasses import replace

from bench.project import interval, protocol
from bench.project.configuration import Configuration, Setting, per_rank_of
from bench.project.inputs import COMM_DTYPE_WIRE
from bench.project.network import Network, NetworkAt
from bench.project.simulate import Compute
from bench.project.terms import Step


def protocol_of(config: Configuration, anchor: tuple[int, float] | None, net: Network | None, n: int
                ) -> tuple[str, float, protocol.ProtocolBand] | None:
    """(protocol, reach, its band) when what the run measured is one of the validated protocols
    (bench/project/protocol.py): anchored to a whole node and projected across nodes (`node`), or from 1 GPU
    anchored at 2 and projected within the node (`two-gpus`); None otherwise (the regime bands)."""
    if anchor is None or net is None or net.gpus_per_node <= 1:
        return None
    m = anchor[0]
    if m == net.gpus_per_node and net.nodes(n) > 1:
        name = protocol.NODE
    elif m == 2 and int(config.base["world_size"]) == 1 and net.nodes(n) == 1:
        name = protocol.TWO_GPUS
    else:
        return None
    return name, n / m, protocol.read_bands()[name]


def protocol_columns(config: Configuration, measured: tuple[str, float, protocol.ProtocolBand], eff: float,
                     step_ms: float, samples: float, delta: float) -> tuple[float, float, float, dict]:
    """(efficiency, step ms, samples/s, interval columns) a protocol's row prints: the model's efficiency
    moved by the band's median miss at the reach, and the band around the model's, widened by δ (the
    busbw fit's, and T1's for samples/s: interval_of), at most 100 % (protocol.ProtocolBand)."""
    name, reach, band = measured
    printed = band.predicted(eff, reach)
    step_ms, samples = step_ms * eff / printed, samples * printed / eff
    low, high = band.bounds(eff * 100, reach, delta)
    t1_rel = interval.t1_relative_90(config.base.get("step_time_half_width_pct"))
    return printed, step_ms, samples, dict(
        efficiency_pct_low=low, efficiency_pct_high=high,
        predicted_samples_per_s_low=samples * low / (printed * 100) * math.exp(-t1_rel),
        predicted_samples_per_s_high=samples * high / (printed * 100) * math.exp(t1_rel),
        interval_regime=f"{protocol.band_of(name, reach)} (protocol {name})")


CALIBRATION_HALVINGS = 40   # bisection steps: the compute factor to 2^-40 of its bracket


def _scaled(compute: Compute, c: float) -> Compute:
    return replace(compute, forward_ms=compute.forward_ms * c, backward_ms=compute.backward_ms * c,
                   optimizer_ms=compute.optimizer_ms * c, fixed_ms=compute.fixed_ms * c)


def node_calibrated(at: Setting, anchor: tuple[int, float], network_at: NetworkAt) -> tuple[Step, float]:
    """(step at `at`, the ratio still to apply) under the node protocol: the compute scaled by the factor c
    whose simulated step on the measured node equals the measured one (the node's own communication,
    straggler and interference taken out, as the lab calibrates a published node row:
    benchmarks/projection_lab/published.py calibrate), then simulated at n; ratio 1. When even c → 0 is
    slower than the measurement (the model's communication alone exceeds it), the anchor's step ratio, as
    on any other anchored row."""
    m, ratio = anchor
    config = at.config
    net_m, _ = network_at(m, COMM_DTYPE_WIRE[config.base["comm_dtype"]])
    node = replace(at, compute=config.compute.at_batch(per_rank_of(config, m)[0]), net=net_m, n=m)

    def node_step_ms(c: float) -> float:   # the measured node's simulated step with the compute scaled by c
        return replace(node, compute=_scaled(node.compute, c)).step().step_ms

    target = ratio * node.step().step_ms
    if node_step_ms(1e-9) > target:
        return at.step(), ratio
    lo, hi = 0.0, max(1.0, ratio) * 2
    while node_step_ms(hi) < target:
        hi *= 2
    for _ in range(CALIBRATION_HALVINGS):
        mid = (lo + hi) / 2
        if node_step_ms(mid) > target:
            hi = mid
        else:
            lo = mid
    return replace(at, compute=_scaled(at.compute, (lo + hi) / 2)).step(), 1.0
