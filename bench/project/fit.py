"""Fit t(S) = α + S/β to measured all-reduce times, and turn a fit into a `measured` network.

The fit weighs each point by 1/t² (least squares on relative error), so that the small messages, whose time
is mostly α, pin α, and the large ones pin β; plain least squares would let the largest times decide both.
α < 0 (noise at small sizes) is refitted with α = 0; a slope ≤ 0 (time not growing with size) cannot give
a bandwidth and is an error. Sizes that span less than MIN_SPAN cannot separate α from β within a probe's
noise (cpu-smoke's probes at 64 and 70 KB gave a negative slope), so they get the line through the origin
(α = 0), as a single size does. The residual is reported as the RMS and the largest |relative error|.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.project.network import Fabric, Network, flat_fabric

MIN_SPAN = 4.0  # largest / smallest size needed to fit α and β separately (a doubling sweep spans far more)


class FitError(ValueError):
    """Measured times that an alpha-beta line cannot describe."""


@dataclass(frozen=True)
class Fit:
    """α (µs per all-reduce), slope (µs per byte) and the residual of the fit over its points."""

    alpha_us: float
    us_per_byte: float
    n_points: int
    alpha_fitted: bool              # False: α set to 0 (one size, or sizes within MIN_SPAN)
    rms_residual_pct: float | None  # None: one point, nothing to measure a residual against
    max_residual_pct: float | None

    def time_us(self, size_bytes: float) -> float:
        return self.alpha_us + self.us_per_byte * size_bytes

    def algbw_gbps(self) -> float:
        """The asymptotic algorithm bandwidth S/t for S → ∞."""
        return 1.0 / (self.us_per_byte * 1e3)

    def busbw_gbps(self, n: int) -> float:
        """nccl-tests' bus bandwidth of the asymptote: algbw · 2(n−1)/n."""
        return self.algbw_gbps() * 2 * (n - 1) / n


def fit_alpha_beta(sizes: Sequence[float], times_us: Sequence[float]) -> Fit:
    """Least-squares α, β on relative error (module docstring). Sizes within MIN_SPAN of each other (one
    size included): α = 0 and the line through the origin, weighted the same way."""
    if len(sizes) != len(times_us) or not sizes:
        raise FitError(f"need matching, non-empty sizes and times (got {len(sizes)} and {len(times_us)})")
    if any(s <= 0 for s in sizes) or any(not t > 0 for t in times_us):
        raise FitError("sizes and times must be positive")
    u = [1.0 / t for t in times_us]                    # weight of α in (α + b·S)/t − 1
    v = [s / t for s, t in zip(sizes, times_us)]       # weight of b
    suu, suv, svv = sum(x * x for x in u), sum(x * y for x, y in zip(u, v)), sum(y * y for y in v)
    su, sv = sum(u), sum(v)
    det = suu * svv - suv * suv
    spread = max(sizes) >= MIN_SPAN * min(sizes)
    if spread and det > 0:
        alpha = (su * svv - sv * suv) / det
        slope = (suu * sv - suv * su) / det
    else:
        alpha, slope = 0.0, sv / svv
    if alpha < 0:
        alpha, slope = 0.0, sv / svv
    if not slope > 0:
        raise FitError(f"time does not grow with size (slope {slope:.3g} µs/B): no bandwidth to fit")
    fitted = spread and alpha > 0
    if len(sizes) == 1:
        return Fit(alpha, slope, 1, fitted, None, None)
    rel = [(alpha + slope * s - t) / t for s, t in zip(sizes, times_us)]
    rms = math.sqrt(sum(r * r for r in rel) / len(rel)) * 100
    return Fit(alpha, slope, len(sizes), fitted, rms, max(abs(r) for r in rel) * 100)


def measured_fabric(fit: Fit, n: int, source: str) -> Fabric:
    """The fit at world size n as a flat ring fabric that returns α + S·slope exactly at n: per-step latency
    α / 2(n−1) (no separate fixed part: one world size cannot tell them apart) and busbw of the slope."""
    if n < 2:
        raise FitError(f"world size {n}: a probe on one rank measures no communication")
    return flat_fabric("measured", fit.busbw_gbps(n), fit.alpha_us / (2 * (n - 1)), source)


def measured_network(fit: Fit, n: int, source: str) -> Network:
    """A flat, ring-only network from the run's own probe at world size n (see measured_fabric)."""
    fabric = measured_fabric(fit, n, source)
    error = (fit.rms_residual_pct or 0.0) / 100
    return Network("measured", fabric, fabric, gpus_per_node=1, ring_only=True, bandwidth_rel_error=error)
