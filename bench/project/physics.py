"""The effects a step on N ranks has beyond compute and its all-reduces (docs/design.md "Projection"), each a
term that can be switched off. Added to the simulated step in this order:

    interference  = γ · overlapped_comm_ms      NCCL kernels running under backward take SMs and memory
                                                bandwidth from it: the overlapped compute stretches by γ
                                                of the communication it overlaps
    straggler     = σ · compute_ms · E[Z_(N)]   the step ends when the slowest rank's does: each rank's
                                                compute is T·(1 + σ·Z), Z ~ N(0, 1) independent per rank
                                                and step, so the step is T·(1 + σ·max of N draws);
                                                E[Z_(N)] = ∫ z · N·φ(z)·Φ(z)^(N−1) dz (0 at N = 1, 1/√π
                                                at N = 2, grows like √(2 ln N))
    host floor    = max(0, host_ms − step)      a step cannot be shorter than the host's work for it
                                                (launching kernels, DDP's per-parameter hooks, data
                                                loading): what the floor adds

`Physics()` with its defaults is what a spec or the published-table validation uses; each default's source
is at its constant. A run supplies σ from its own step-time spread, host_ms from its timers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

# σ: per-rank step-time spread (standard deviation / median) when a run has not measured its own. Fitted
# ONCE to the whole published corpus (tests/data/published_scaling, benchmarks/validate_projection.py
# --fit), never per row or model; the value and the fit are in docs/design.md "Projection".
DEFAULT_STEP_CV = 0.02
# γ: compute slowdown per ms of all-reduce it overlaps. NCCL's ring kernels occupy one SM per channel and
# stream every byte through the GPU's memory twice (reduce, then copy) while backward runs; Rashidi et
# al., "Enabling Compute-Communication Overlap in Distributed Deep Learning Training Platforms" (ISCA
# 2021), measure overlapped compute slowed by up to ~1.4×. The default is MEASURED, not fitted: bench
# analyze + project/evidence.py on the two public traces with much overlapped communication give γ = 0.155
# (V100, 2 ranks, tests/data/traces/hta/v100-2rank-rank1) and 0.425 (A100, 8 ranks, a100-8rank-rank3); the
# default is their mean. (The third public trace overlaps 2.4 ms in all.) On the published corpus this
# costs the median 2.7 → 3.8 % and takes the rows worse than 25 % from 90 to 78 (`validate_projection.py
# --fit` prints the grid): the corpus's single-node tables alone would pick γ = 0, but every row beyond 25 %
# is predicted too fast, and a measured slowdown is physics where the median's preference is not.
# A run's own traces replace it in run mode (evidence.py).
DEFAULT_INTERFERENCE = 0.29


@dataclass(frozen=True)
class Physics:
    """Which terms apply and their parameters. `host_ms` 0: no floor known."""

    straggler: bool = True
    interference: bool = True
    host_floor: bool = True
    step_cv: float = DEFAULT_STEP_CV
    interference_factor: float = DEFAULT_INTERFERENCE
    host_ms: float = 0.0

    def __post_init__(self):
        for key in ("step_cv", "interference_factor", "host_ms"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{key}={value!r} must be a finite number >= 0")


OFF = Physics(straggler=False, interference=False, host_floor=False)


@cache
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normal draws] (0 for n = 1), by the trapezoid rule on [−10, 10]
    (the integrand is below 1e−20 beyond)."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if n == 1:
        return 0.0
    steps, lo, hi = 8000, -10.0, 10.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        z = lo + i * h
        pdf = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
        weight = 0.5 if i in (0, steps) else 1.0
        total += weight * z * n * pdf * cdf ** (n - 1)
    return total * h


def straggler_ms(compute_ms: float, n: int, physics: Physics) -> float:
    """The slowest of n ranks' compute, beyond the median rank's (module docstring)."""
    if not physics.straggler:
        return 0.0
    return physics.step_cv * compute_ms * expected_max_normal(n)


def interference_ms(overlapped_comm_ms: float, physics: Physics) -> float:
    """Backward stretched by the all-reduces it overlaps (module docstring)."""
    return physics.interference_factor * overlapped_comm_ms if physics.interference else 0.0


def host_floor_ms(step_ms: float, physics: Physics) -> float:
    """What the host floor adds to a step of `step_ms` (module docstring)."""
    return max(0.0, physics.host_ms - step_ms) if physics.host_floor else 0.0
