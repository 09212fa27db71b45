"""What a user measured decides how far the projection may be trusted: the protocol, its reach, and the
band validated on that protocol (docs/projection.md "Protocols"; issue 54).

    node       a run that measured one whole node (its largest world size fills the node) projected to
               several nodes: the model is calibrated to the node's step, so everything the node shares
               (its data pipeline, NVLink, the launcher) is measured, and only what crosses nodes is
               modelled.
    two-gpus   a run that measured 1 and 2 GPUs projected to more GPUs of one node: the model's step at
               N, times what the 2-GPU measurement says the model misses (anchored_eff).

Reach = N / the GPUs of the largest measurement the prediction is calibrated or anchored to. The model's
misses grow with the reach (a harness's per-node overheads compound, the fabric's contention is not in a
busbw probed on fewer nodes), so each protocol's band widens with the reach (ProtocolBand: in units of
log2(reach)^power), fitted on the published tables held out by source (benchmarks/validate_projection.py
--protocol P --fit-interval writes protocol_bands.csv) and read here; REACHES are the classes the
validator reports it by. A projection that matches no protocol (from one GPU alone, or across
nodes from less than a node) takes the regime bands of interval.py.

The fixed cost (strong scaling): a micro-step's compute at per-GPU batch b is F + (T − F)·b / b0, F the
part that does not shrink with the batch (kernel launches, the optimizer's per-parameter work, small
kernels' inefficiency). Two measured batches at one world size give F (fixed_cost_ms); with one batch the
model takes F = 0 (compute proportional to the batch) and says that a second batch is needed when the
per-GPU batch changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

NODE = "node"
TWO_GPUS = "two-gpus"
PROTOCOLS = (NODE, TWO_GPUS)
# reach classes per protocol: (label, the largest reach in it); a reach beyond the last takes the last
REACHES: dict[str, tuple[tuple[str, float], ...]] = {
    NODE: (("×2–4", 4.0), ("×5–16", 16.0), ("×17+", math.inf)),
    TWO_GPUS: (("×2", 2.0), ("×3–4", 4.0), ("×5–8", math.inf)),
}
STORED = Path(__file__).with_name("protocol_bands.csv")
STORED_COLUMNS = ("band", "rows", "sources", "shift", "low", "high", "level", "power")


def reach_class(protocol: str, reach: float) -> str:
    """The reach class label (REACHES) of a reach ≥ 1 under a protocol; ValueError on an unknown one."""
    if protocol not in REACHES:
        raise ValueError(f"protocol={protocol!r} is not one of {PROTOCOLS}")
    return next(label for label, top in REACHES[protocol] if reach <= top + 1e-9)


def band_of(protocol: str, reach: float) -> str:
    """The reach class's name: "node ×5–16" (the band itself is the protocol's: ProtocolBand)."""
    return f"{protocol} {reach_class(protocol, reach)}"


def all_classes() -> tuple[str, ...]:
    """Every protocol's reach classes, as band_of names them (the validator's per-reach lines)."""
    return tuple(f"{p} {label}" for p in PROTOCOLS for label, _ in REACHES[p])


def capped(efficiency: float) -> float:
    """Data parallelism is never faster than linear: an efficiency at most 1."""
    return min(efficiency, 1.0)


def anchored_eff(model_eff_n: float, model_eff_anchor: float, measured_eff_anchor: float) -> float:
    """two-gpus: the model's efficiency at N times the measured over the model's efficiency at the anchor
    (what the model misses there, carried to N whole: docs/projection.md measured a share or a growing
    carry to do worse), at most 1."""
    return capped(model_eff_n * measured_eff_anchor / model_eff_anchor)


def fixed_cost_ms(batch_a: int, micro_a_ms: float, batch_b: int, micro_b_ms: float) -> float:
    """F of two (per-GPU batch, micro-step compute ms) points on the line T(b) = F + s·b, held in [0, the
    smaller point's time): a negative intercept (noise, or a step superlinear in the batch) is no fixed
    cost; one at or above a measured time would make a larger batch free."""
    if batch_a == batch_b:
        raise ValueError(f"two per-GPU batches needed for a fixed cost, got {batch_a} twice")
    slope = (micro_b_ms - micro_a_ms) / (batch_b - batch_a)
    fixed = micro_a_ms - slope * batch_a
    return min(max(fixed, 0.0), 0.999 * min(micro_a_ms, micro_b_ms))


def micro_at(micro_ms: float, batch: int, new_batch: int, fixed_ms: float = 0.0) -> float:
    """The micro-step compute at `new_batch` from one at `batch`: its fixed part F unchanged, the rest in
    proportion to the batch."""
    fixed = min(fixed_ms, micro_ms)
    return fixed + (micro_ms - fixed) * new_batch / batch


def reach_scale(reach: float, power: float) -> float:
    """The unit a band's residuals are measured in at a reach: log2(reach)^power, at least 1 (a ×2 reach,
    or any reach at power 0, is the unit itself)."""
    return max(math.log2(max(reach, 2.0)), 1.0) ** power


@dataclass(frozen=True)
class ProtocolBand:
    """One protocol's band, fitted on published rows held out by source (the lab: benchmarks/
    projection_lab/protocols.py). r = ln(published / the model's efficiency) is measured in units of the
    row's reach_scale, s = log2(reach)^power: in those units the residuals have median `shift` and the
    90 % window [low, high] (the shortest holding ⌈level·(n + 1)⌉ of the n scaled residuals); `level`
    and `power` are calibrated so that bands fitted without a source hold 87 % of its rows at the
    smallest median width. A row at reach R gets [low·s, high·s]: the band widens with the reach."""

    name: str
    rows: int
    sources: int
    shift: float
    low: float
    high: float
    level: float
    power: float = 0.0

    def predicted(self, model_eff: float, reach: float) -> float:
        """The printed efficiency: the model's, moved by what the published rows show it misses at this
        reach (the median residual), at most 1."""
        return capped(model_eff * math.exp(self.shift * reach_scale(reach, self.power)))

    def bounds(self, model_eff_pct: float, reach: float, delta: float = 0.0) -> tuple[float, float]:
        """[m·exp(low·s − δ), m·exp(high·s + δ)] around the model's efficiency m (%), neither end past
        100 %."""
        s = reach_scale(reach, self.power)
        return (min(model_eff_pct * math.exp(self.low * s - delta), 100.0),
                min(model_eff_pct * math.exp(self.high * s + delta), 100.0))

    def contains(self, published_eff: float, model_eff: float, reach: float) -> bool:
        """Whether a published efficiency (fraction) lies in the band around the model's, clamped."""
        low, high = self.bounds(100 * model_eff, reach)
        return low <= 100 * published_eff <= high


def read_bands(path: Path = STORED) -> dict[str, ProtocolBand]:
    """The stored protocol bands (protocol_bands.csv, written by the lab's --fit-interval), by protocol."""
    df = pd.read_csv(path)
    return {r["band"]: ProtocolBand(r["band"], int(r["rows"]), int(r["sources"]), float(r["shift"]),
                                    float(r["low"]), float(r["high"]), float(r["level"]), float(r["power"]))
            for _, r in df.iterrows()}


WORDS = {NODE: "a whole node measured, projected across nodes",
         TWO_GPUS: "1 and 2 GPUs measured, projected within the node"}
NOTE_REACHES = (2, 16)   # the reaches a note quotes a band's low end at


def notes(names, path: Path = STORED) -> list[str]:
    """A line per protocol the projected rows take (projection.csv's `protocol`): its band and how far below
    the model it reaches at NOTE_REACHES."""
    bands = read_bands(path)
    out = []
    for name in dict.fromkeys(str(n) for n in names if str(n) in bands):
        b = bands[name]
        below = ", ".join(f"{100 * (1 - math.exp(b.low * reach_scale(r, b.power))):.0f} % at ×{r}"
                          for r in NOTE_REACHES)
        out.append(f"protocol {name} ({WORDS[name]}): 90 % interval from ln(published / model) in "
                   f"[{b.low:+.3f}·s, {b.high:+.3f}·s], s = log2(reach)^{b.power:g}, the printed efficiency "
                   f"the model's × e^({b.shift:+.4f}·s), fitted on {b.rows} published rows of {b.sources} "
                   f"sources held out by source (level {b.level:.2f}; docs/projection.md \"Protocols\"): "
                   f"down to {below} below the model, at most 100 %")
    return out
