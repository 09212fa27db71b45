"""The `measured` network: α and β fitted per world size (and wire dtype) from the run's own probe.

Source per (world size, dtype), first that exists:
1. allreduce_sweep.csv: the probe's size sweep (median time over the cells that repeat it, per size);
2. the result rows' single-size probe (`allreduce_bytes`, `allreduce_algbw_gbps`) of every ok cell at that
   world size: cells whose largest buckets differ enough give several sizes and a real fit; when they all
   probed one size (or sizes within fit.MIN_SPAN), α cannot be told from β and is set to 0: all of the
   probe's time counts as bandwidth, so messages smaller than the probe come out too cheap, larger too dear.
World size 1 communicates nothing and is never fitted. A world size without a fit of its own uses the fit
at the largest measured world size (ring extrapolation, fit.measured_fabric), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bench.project.fit import MIN_SPAN, Fit, FitError, fit_alpha_beta, measured_network
from bench.project.inputs import COMM_DTYPE_WIRE, SWEEP_FILE
from bench.project.network import Network

PROBE_SOURCE = "result rows' probe"


@dataclass(frozen=True)
class MeasuredFit:
    world_size: int
    dtype: str
    fit: Fit
    source: str


def _probe_points(results: pd.DataFrame) -> pd.DataFrame:
    ok = results[(results["status"] == "ok") & (results["world_size"] > 1)]
    ok = ok.dropna(subset=["allreduce_bytes", "allreduce_algbw_gbps"])
    ok = ok[(ok["allreduce_bytes"] > 0) & (ok["allreduce_algbw_gbps"] > 0)]
    return pd.DataFrame({
        "world_size": ok["world_size"].astype(int),
        "dtype": ok["comm_dtype"].map(COMM_DTYPE_WIRE),
        "size_bytes": ok["allreduce_bytes"],
        "time_us": ok["allreduce_bytes"] / (ok["allreduce_algbw_gbps"] * 1e3),
    })


def measured_fits(results: pd.DataFrame, sweep: pd.DataFrame | None) -> tuple[list[MeasuredFit], list[str]]:
    """Fits per (world size, dtype), and one note per world size that could not be fitted."""
    fits, notes = [], []
    sources = []
    if sweep is not None:
        s = sweep[sweep["world_size"] > 1]
        s = s.groupby(["world_size", "dtype", "size_bytes"], as_index=False)["time_us"].median()
        sources.append((SWEEP_FILE, s))
    sources.append((PROBE_SOURCE, _probe_points(results)))
    done = set()
    for source, points in sources:
        for (ws, dtype), g in points.groupby(["world_size", "dtype"]):
            if (int(ws), dtype) in done:
                continue
            try:
                fit = fit_alpha_beta(list(g["size_bytes"]), list(g["time_us"]))
            except FitError as exc:
                notes.append(f"world size {ws} {dtype} ({source}): {exc}")
                continue
            label = source if fit.alpha_fitted else f"{source}; α = 0 (sizes within {MIN_SPAN:g}× or α < 0)"
            fits.append(MeasuredFit(int(ws), dtype, fit, label))
            done.add((int(ws), dtype))
    return sorted(fits, key=lambda f: (f.world_size, f.dtype)), notes


def fits_table(fits: list[MeasuredFit]) -> pd.DataFrame:
    """network_fit.csv: one row per fit, units in the column names."""
    return pd.DataFrame([{
        "world_size": f.world_size, "dtype": f.dtype, "source": f.source, "n_points": f.fit.n_points,
        "alpha_us": f.fit.alpha_us, "alpha_per_step_us": f.fit.alpha_us / (2 * (f.world_size - 1)),
        "algbw_gbps": f.fit.algbw_gbps(), "busbw_gbps": f.fit.busbw_gbps(f.world_size),
        "rms_residual_pct": f.fit.rms_residual_pct, "max_residual_pct": f.fit.max_residual_pct,
    } for f in fits], columns=["world_size", "dtype", "source", "n_points", "alpha_us", "alpha_per_step_us",
                               "algbw_gbps", "busbw_gbps", "rms_residual_pct", "max_residual_pct"])


class Measured:
    """Chooses the fit for a world size and wire dtype (module docstring)."""

    def __init__(self, fits: list[MeasuredFit]):
        self.fits = fits

    def alpha_known(self, n: int) -> bool:
        """Whether some fit at world size n separated α from β."""
        return any(f.fit.alpha_fitted for f in self.fits if f.world_size == n)

    def network_at(self, n: int, dtype: str, exact: bool = False) -> tuple[Network, str]:
        """(network, source words) for n ranks sending `dtype`; LookupError says why there is none.
        `exact`: only a fit at n itself will do (validation)."""
        for want in (dtype, "fp32"):
            same = [f for f in self.fits if f.dtype == want]
            chosen = [f for f in same if f.world_size == n]
            if not chosen and same and not exact:
                chosen = [max(same, key=lambda f: f.world_size)]
            if chosen:
                f = chosen[0]
                words = f"measured at {f.world_size} ranks, {f.dtype} ({f.source})"
                if f.world_size != n:
                    words += f"; ring-extrapolated to {n}"
                if f.dtype != dtype:
                    words += f"; no {dtype} probe"
                return measured_network(f.fit, f.world_size, words), words
        sizes = sorted({f.world_size for f in self.fits})
        raise LookupError(f"no measured all-reduce at world size {n} (measured: {sizes or 'none'})"
                          if exact or not sizes else f"no measured all-reduce for {dtype}")

