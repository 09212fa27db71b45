"""The 90 % interval columns of a projected row (efficiency_pct_low/high, predicted_samples_per_s_low/high,
interval_regime): the stored model-error band of its regime and basis (bench/project/interval.py,
model_error.csv) around the model's number, widened by the busbw fit's residual and T1's own interval.
"""

from __future__ import annotations

import math
from dataclasses import replace

from bench.project import interval
from bench.project.configuration import Setting
from bench.project.network import scaled_network
from bench.project.terms import Step


def bands() -> dict:
    """The stored model-error bands (bench/project/interval.py, model_error.csv)."""
    return interval.read_bands()[0]


def interval_of(at: Setting, step: Step, efficiency_pct: float, samples: float, band_table: dict,
                anchored: bool = False) -> dict:
    """The 90 % interval columns of one projected row, `step` the model's at `at` (bench/project/interval.py):
    the band of its regime and basis (`anchored`) at the row's scale (interval.scale_of), widened by the
    busbw fit's residual (measured networks) and, for samples/s, by T1's own interval; never past the
    physical limit (100 % efficiency; N × T1's rate for samples/s)."""
    config, net, n = at.config, at.net, at.n
    t1_rel = interval.t1_relative_90(config.base.get("step_time_half_width_pct"))
    if n == 1:   # nothing projected: the measured compute's interval only
        low, high = math.exp(-t1_rel), math.exp(t1_rel)
        return dict(efficiency_pct_low=efficiency_pct, efficiency_pct_high=efficiency_pct,
                    predicted_samples_per_s_low=samples * low, predicted_samples_per_s_high=samples * high,
                    interval_regime="none (one rank: T1's interval)")
    delta_bw = 0.0
    if net is not None and net.bandwidth_rel_error > 0:
        # the fit's RMS relative residual as a standard deviation; floor 0.05: a busbw never goes to 0
        slow = scaled_network(net, max(0.05, 1 - interval.HALF_90 * net.bandwidth_rel_error))
        delta_bw = math.log(replace(at, net=slow).step().step_ms / step.step_ms)
    basis = interval.ANCHORED if anchored else ""
    regime_name = interval.regime_of_network(config.sharded is not None, net, n)
    name = interval.band_name(regime_name, basis)
    band = band_table[name]
    # the band's unit: the model's own predicted loss at n (1 − efficiency), held at the regime's
    # calibrated edge beyond it (SCALE_CAP); 1 anchored
    scale = interval.scale_of(basis, efficiency_pct / 100, regime_name)
    # the physical limit: 100 % efficiency, and for samples/s the linear bound N × T1's rate (T1 at the
    # fast end of its own interval)
    linear = samples / (efficiency_pct / 100) * math.exp(t1_rel)
    eff = interval.bounds(efficiency_pct, band, delta_bw, interval.LIMIT_PCT, scale)
    rate = interval.bounds(samples, band, delta_bw + t1_rel, linear, scale)
    return dict(efficiency_pct_low=eff[0], efficiency_pct_high=eff[1], predicted_samples_per_s_low=rate[0],
                predicted_samples_per_s_high=rate[1],
                interval_regime=name + (" (pooled band)" if band.pooled else ""), delta=delta_bw)
