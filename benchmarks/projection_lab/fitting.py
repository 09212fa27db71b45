"""Fitting the interval's bands (bench/project/interval.py) to the published tables: the calibration lab,
beside the validator (benchmarks/validate_projection.py), not in the package a user imports. The package
keeps the fitted bands as data (bench/project/model_error.csv, protocol_bands.csv) and reads them with
bench/project/interval.py; this module writes them. The method is interval.py's module docstring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from bench.project.interval import (
    BASES,
    COVERAGE,
    HELD_OUT,
    OTHER_RECIPE,
    POOLED,
    REGIMES,
    STORED,
    STORED_COLUMNS,
    Band,
    Levels,
    band_name,
    basis_of,
)

# fewer residuals than this cannot place a 90 % band's ends (k = ⌈0.9·11⌉ = 10 of 10)
MIN_ROWS = 10
# Rows of one source share its harness and cluster: a regime's own band is trusted only when leave-one-
# source-out can check it, i.e. when fitting it without any one source still leaves two (Lambda's PCIe
# rows come from two snapshots of one harness: the pcie regime takes the pooled band).
MIN_SOURCES = 3
# the levels calibrated_levels tries: 0.85 … 0.99
LEVELS = tuple(round(0.85 + 0.01 * i, 2) for i in range(15))
# what a band is held out by when its level is calibrated (Residual's fields)
UNITS = ("source", "family")


class Residual(NamedTuple):
    """One published row's model error: its source, band (band_name), ln(published / predicted), model
    family (family_of; "" when unknown: then no family is held out), cap, ln(1 / predicted efficiency):
    the largest residual an interval clamped at the limit can hold (inf: no clamp), and scale (scale_of:
    the unit r and cap are measured in; 1: unscaled)."""

    source: str
    band: str
    r: float
    family: str = ""
    cap: float = math.inf
    scale: float = 1.0

def _rows(residuals: Iterable[tuple]) -> list[Residual]:
    """Residuals from (source, band, r[, family]) tuples."""
    return [Residual(*row) for row in residuals]

def shortest(values: list[float], coverage: float = COVERAGE,
             caps: list[float] | None = None) -> tuple[float, float]:
    """The shortest [low, high] holding k = ⌈coverage·(n + 1)⌉ of the n values, among those an interval
    clamped at the limit can hold (value ≤ its cap; all of them when caps is None); all of those when
    fewer than k are."""
    if not values:
        raise ValueError("no residuals to fit a band to")
    n = len(values)
    k = min(n, math.ceil(coverage * (n + 1) - 1e-12))
    xs = sorted(v for v, c in zip(values, caps or [math.inf] * n) if v <= c) or sorted(values)
    k = min(k, len(xs))
    i = min(range(len(xs) - k + 1), key=lambda j: xs[j + k - 1] - xs[j])
    return xs[i], xs[i + k - 1]


def _level(levels: Levels | float, name: str) -> float:
    return levels if isinstance(levels, float) else levels.get(name, COVERAGE)


# (residual, cap) pairs in units of their scale by band name (and each basis's pooled name), with each
# band's sources
Grouped = tuple[dict[str, list[tuple[float, float]]], dict[str, set[str]]]


def _group(rows: list[Residual]) -> Grouped:
    by_name: dict[str, list[tuple[float, float]]] = {}
    sources: dict[str, set[str]] = {}
    for row in rows:
        by_name.setdefault(row.band, []).append((row.r / row.scale, row.cap / row.scale))
        sources.setdefault(row.band, set()).add(row.source)
    for basis in BASES:
        mine = [rc for name, rcs in by_name.items() if basis_of(name) == basis for rc in rcs]
        if mine:
            by_name[band_name(POOLED, basis)] = mine
    return by_name, sources


def _window(name: str, pairs: list[tuple[float, float]], levels: Levels | float) -> tuple[float, float]:
    return shortest([r for r, _ in pairs], _level(levels, name), [c for _, c in pairs])


def _hull(name: str, band: Band, window: tuple[float, float] | None, rows: int) -> Band:
    """An other-recipe band: the from-base `band` widened to hold `window` (module docstring)."""
    low, high = (band.low, band.high) if window is None else (min(band.low, window[0]),
                                                              max(band.high, window[1]))
    return Band(name, rows, low, high, pooled=True)


def _bands(grouped: Grouped, levels: Levels | float) -> dict[str, Band]:
    by_name, sources = grouped
    bands: dict[str, Band] = {}
    for basis in BASES:
        pooled_name = band_name(POOLED, basis)
        mine = by_name.get(pooled_name)
        if basis == OTHER_RECIPE:   # the base's bands, each widened to the other-recipe rows' window
            window = _window(pooled_name, mine, levels) if mine else None
            rows = len(mine or ())
            bands[pooled_name] = _hull(pooled_name, bands[POOLED], window, rows)
            for regime_name in REGIMES:
                name = band_name(regime_name, basis)
                bands[name] = _hull(name, bands[regime_name], window, len(by_name.get(name, ())))
            continue
        if mine:
            pooled = Band(pooled_name, len(mine), *_window(pooled_name, mine, levels), pooled=True)
        else:   # no residual of this basis: the base's pooled band (module docstring)
            pooled = replace(bands[POOLED], name=pooled_name, rows=0)
        bands[pooled_name] = pooled
        for regime_name in REGIMES:
            name = band_name(regime_name, basis)
            rs = by_name.get(name, [])
            own = len(rs) >= MIN_ROWS and len(sources.get(name, ())) >= MIN_SOURCES
            bands[name] = (Band(name, len(rs), *_window(name, rs, levels)) if own
                           else Band(name, len(rs), pooled.low, pooled.high, pooled=True))
    return bands


def fit_bands(residuals: Iterable[tuple], levels: Levels | float = COVERAGE) -> dict[str, Band]:
    """A band per regime and basis from Residual rows (or (source, band name, residual) tuples), each at its
    level, and each basis's pooled band (module docstring)."""
    return _bands(_group(_rows(residuals)), levels)


def _held_out_groups(rows: list[Residual], unit: str) -> dict[str, Grouped]:
    """For each source (or family: `unit`), every other one's rows, grouped."""
    values = {getattr(row, unit) for row in rows}
    return {v: _group([row for row in rows if getattr(row, unit) != v]) for v in values}


def held_out_bands(residuals: Iterable[tuple], levels: Levels | float = COVERAGE,
                   unit: str = "source") -> dict[str, dict[str, Band]]:
    """Leave-one-out by `unit` (UNITS): for each source (or family), the bands fitted on every other one's
    rows."""
    return {v: _bands(g, levels) for v, g in _held_out_groups(_rows(residuals), unit).items()}


def all_names() -> tuple[str, ...]:
    """Every regime's band name on every basis (POOLED's excluded)."""
    return tuple(band_name(g, basis) for basis in BASES for g in REGIMES)


def held_out_coverage(residuals: Iterable[tuple], levels: Levels | float, names: Iterable[str] | None = None,
                      unit: str = "source", groups: dict[str, Grouped] | None = None) -> float:
    """The fraction of the rows of the bands `names` (default all) inside their band fitted without their
    own source (or family: `unit`); `groups`: _held_out_groups of these rows by `unit`, when at hand."""
    rows = _rows(residuals)
    groups = _held_out_groups(rows, unit) if groups is None else groups
    names = set(all_names() if names is None else names)
    mine = [row for row in rows if row.band in names]
    held = {v: _bands(groups[v], levels) for v in {getattr(row, unit) for row in mine}}
    return (sum(held[getattr(row, unit)][row.band].contains(row.r, row.cap, row.scale) for row in mine)
            / len(mine)
            if mine else float("nan"))


def _first_that_holds(tried: list[tuple[float, float]]) -> tuple[float, float]:
    """The first (level, coverage) reaching HELD_OUT; when none does, the one that holds most (shortest
    windows need not nest, so coverage need not grow with the level)."""
    return next(((lv, c) for lv, c in tried if c >= HELD_OUT), max(tried, key=lambda t: t[1]))


def _calibrated(rows: list[Residual], groups: dict[str, dict[str, Grouped]], levels: Levels,
                setting: list[str], served: list[str]) -> tuple[float, float]:
    """(level, held-out coverage) for the bands `setting`, judged on the rows of the bands `served`: per
    held-out unit with at least two values (`groups`: unit → _held_out_groups), the smallest LEVELS entry
    whose coverage reaches HELD_OUT (the best one when none does); the largest of those levels, and the
    smallest coverage at it."""
    if not groups:   # one source and one family: nothing to hold out
        return LEVELS[0], float("nan")
    chosen = []
    for unit, held in groups.items():
        tried = [(lv, held_out_coverage(rows, levels | {g: lv for g in setting}, served, unit, held))
                 for lv in LEVELS]
        chosen.append(_first_that_holds(tried)[0])
    level = max(chosen)
    return level, min(held_out_coverage(rows, levels | {g: level for g in setting}, served, unit, held)
                      for unit, held in groups.items())


def calibrated_levels(residuals: Iterable[tuple]) -> dict[str, tuple[float, float]]:
    """Per band and per basis's POOLED: (level, held-out coverage), the smallest LEVELS entry at which
    leave-one-out coverage of the rows the band serves reaches HELD_OUT, by source and by model family
    (the larger of the two levels; the best one when none holds; module docstring), and the smaller of the
    two coverages at it. Sources and families differ more than rows of one do, so a band fitted at 90 % of
    the other units' rows holds fewer than 90 % of a new one's: the level is raised until it holds. A
    basis's pooled band serves its regimes without a band of their own (all of its rows when every regime
    has one); it is set first, the base's before the anchored one's (the anchored falls back to it)."""
    rows = _rows(residuals)
    fitted = fit_bands(rows)
    groups = {unit: _held_out_groups(rows, unit) for unit in UNITS
              if len({getattr(row, unit) for row in rows}) > 1}
    by_source = groups.get("source")
    levels: Levels = {}
    out: dict[str, tuple[float, float]] = {}
    present = {row.band for row in rows}
    for basis in BASES:
        names = [band_name(g, basis) for g in REGIMES]
        pooled_name = band_name(POOLED, basis)
        own = [name for name in names if not fitted[name].pooled and basis != OTHER_RECIPE]
        takers = [name for name in names if name not in own]
        served = takers if present & set(takers) else names
        level, covered = _calibrated(rows, groups, levels, [pooled_name, *takers], served)
        levels |= {pooled_name: level} | {g: level for g in takers}
        out[pooled_name] = (level, covered)
        out |= {g: (level, held_out_coverage(rows, levels, [g], "source", by_source) if by_source
                        else float("nan")) for g in takers}
        for name in own:
            levels[name], covered = _calibrated(rows, groups, levels, [name], [name])
            out[name] = (levels[name], covered)
    return out


def write_bands(bands: dict[str, Band], levels: Levels, path: Path = STORED) -> None:
    rows = [{"band": b.name, "rows": b.rows, "low": round(b.low, 6), "high": round(b.high, 6),
             "pooled": b.pooled,
             "level": levels[band_name(POOLED, basis_of(b.name)) if b.pooled else b.name]}
            for b in bands.values()]
    pd.DataFrame(rows, columns=list(STORED_COLUMNS)).to_csv(path, index=False)

