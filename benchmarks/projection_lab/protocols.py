"""The projection judged on what a user measures (issue 54): the node they have → the cluster they want,
and a 2-GPU workstation → a whole node. Each published row is predicted exactly as `bench project` would
predict it from a run that measured its group's base rows (bench/project/protocol.py owns the formula,
the reach and the band; this module only reads the corpora into it).

    node       the base is the group's largest one-node row (what a user who measured their node has);
               every row on more than one node is predicted from it. Reach = N / the base's GPUs.
    two-gpus   the base is the group's 1-GPU row and its anchor the 2-GPU row (a workstation with two
               GPUs); every larger row on one node is predicted. Reach = N / 2.

A group is published.group_key (per-GPU batch kept apart unless STRONG SCALING). Strong scaling (the
per-GPU batch changes with N): the group's one-node rows at two per-GPU batches give the step's fixed
cost (protocol.fixed_cost_ms; the base is the node's smallest batch, the nearest to the multi-node rows');
with one batch only, none is assumed and the row says so (`fixed cost assumed 0`). A strong table whose
batch shrinks and that states no accumulation accumulates nothing (shrinking_batch_accumulation). Rows
are predicted by published.predict_row (the physics, calibrated to the base's step); the protocol's anchor
(two-gpus) and the fixed cost are bench.project.protocol's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import pandas as pd

from bench.project import protocol
from bench.project.physics import Physics
from projection_lab.fitting import HELD_OUT, LEVELS, shortest
from projection_lab.published import (
    NODES,
    Prediction,
    Skip,
    _per_node,
    calibrated_micro,
    data_flags,
    group_key,
    is_strong,
    per_gpu,
    predict_row,
    stats_from,
    table_key,
    units_per_sample,
)


@dataclass(frozen=True)
class Judged:
    """One row predicted under a protocol: the physics' prediction from the base (published.Prediction),
    the protocol's efficiency and its band (protocol.band_of)."""

    prediction: Prediction
    protocol: str
    reach: float
    band: str
    model_eff: float          # the protocol's efficiency before its band: the physics from the base
                              # (node), times the anchor's miss (two-gpus)
    published_eff: float
    fixed_cost: str = ""      # how the strong-scaling fixed cost was known ("" weak scaling)

    @property
    def residual(self) -> float:
        return math.log(self.published_eff / protocol.capped(self.model_eff))

    @property
    def held_out(self) -> str:
        return self.prediction.held_out


def _nodes_of(row: pd.Series) -> int:
    return math.ceil(int(row["gpus"]) / _per_node(row))


def _one_node(group: pd.DataFrame) -> pd.DataFrame:
    return group[[_nodes_of(r) == 1 for _, r in group.iterrows()]]


def fixed_cost_of(table: pd.DataFrame, base: pd.Series, physics: Physics) -> tuple[float | None, str]:
    """(fixed ms per micro-step, how known) for a strong-scaling row's base: another one-node row of the
    table with another per-GPU batch (the nearest GPU count to the base's, then the farthest batch) gives a
    second (batch, micro-step) point, each micro-step with its own modelled communication taken out
    (published.calibrated_micro; protocol.fixed_cost_ms); None when every one-node row has the base's
    batch."""
    at = table[table["per_gpu_batch"] != base["per_gpu_batch"]]
    if at.empty:
        return None, "fixed cost assumed 0 (one per-GPU batch measured on one node)"
    order = sorted(at.iterrows(), key=lambda kv: (abs(kv[1]["gpus"] - base["gpus"]),
                                                   -abs(kv[1]["per_gpu_batch"] - base["per_gpu_batch"])))
    other = order[0][1]
    try:
        points = [(int(r["per_gpu_batch"]), calibrated_micro(r, physics)) for r in (base, other)]
    except Skip as exc:
        return None, f"fixed cost assumed 0 ({exc})"
    fixed = protocol.fixed_cost_ms(*points[0], *points[1])
    return fixed, (f"fixed cost {fixed:.1f} ms from batches {points[0][0]} and {points[1][0]} on one node "
                   f"({int(base['gpus'])} and {int(other['gpus'])} GPUs)")


def _judge(p: Prediction, name: str, n_base: int, model_eff: float, fixed: str = "") -> Judged:
    reach = int(p.row["gpus"]) / n_base
    return Judged(p, name, reach, protocol.band_of(name, reach), model_eff, p.published_eff, fixed)


def node(corpus: pd.DataFrame, physics: Physics) -> tuple[list[Judged], list[tuple[pd.Series, str]], int]:
    """(judged rows, skipped rows with why, askable rows) under `node`: every multi-node row of a group
    with a one-node row."""
    judged, skipped, askable = [], [], 0
    corpus = _typed(corpus)
    for _, table in corpus.groupby(corpus.apply(table_key, axis=1), sort=False):
        table = shrinking_batch_accumulation(table)
        for _, group in table.groupby(table.apply(group_key, axis=1), sort=False):
            one = _one_node(group)
            many = group[[_nodes_of(r) > 1 for _, r in group.iterrows()]]
            if one.empty or many.empty:
                continue
            # the largest one-node row; strong scaling (several batches on one node): of those at that
            # size the smallest per-GPU batch, the nearest to the multi-node rows' shrinking ones
            base = one.sort_values(["gpus", "per_gpu_batch"], ascending=[False, True]).iloc[0]
            if (one["gpus"] == base["gpus"]).sum() > 1 and not is_strong(base):
                skipped += [(r, f"{(one['gpus'] == base['gpus']).sum()} one-node rows at the base's size")
                            for _, r in many.iterrows()]
                askable += len(many)
                continue
            fixed, fixed_words = (fixed_cost_of(_one_node(table), base, physics) if is_strong(base)
                                  else (None, ""))
            for _, row in many.iterrows():
                askable += 1
                try:
                    p = predict_row(row, base, physics, fixed_ms=fixed or 0.0)
                except Skip as exc:
                    skipped.append((row, str(exc)))
                    continue
                p = _base_flags(p, base)
                judged.append(_judge(p, protocol.NODE, int(base["gpus"]), p.predicted_eff, fixed_words))
    return judged, skipped, askable


def shrinking_batch_accumulation(table: pd.DataFrame) -> pd.DataFrame:
    """A STRONG SCALING table whose per-GPU batch changes with N and that states no accumulation (MLPerf's
    way: the global batch spread over more GPUs) accumulates nothing: grad_accum 1 where empty. A table
    whose batch stays put must state its accumulation (published.accumulation skips it otherwise)."""
    strong = table.apply(is_strong, axis=1)
    if strong.any() and table.loc[strong, "per_gpu_batch"].nunique() > 1:
        table = table.copy()
        table.loc[strong, "grad_accum"] = table.loc[strong, "grad_accum"].fillna(1)
    return table


def two_gpus(corpus: pd.DataFrame, physics: Physics) -> tuple[list[Judged], list[tuple[pd.Series, str]],
                                                                int]:
    """(judged rows, skipped rows with why, askable rows) under `two-gpus`: every one-node row above 2
    GPUs of a group with a 1-GPU and a 2-GPU row, from the 1-GPU row anchored at the 2-GPU one
    (protocol.anchored_eff)."""
    judged, skipped, askable = [], [], 0
    corpus = _typed(corpus)
    for _, group in corpus.groupby(corpus.apply(group_key, axis=1), sort=False):
        one, two = group[group["gpus"] == 1], group[group["gpus"] == 2]
        targets = group[[int(r["gpus"]) > 2 and _nodes_of(r) == 1 for _, r in group.iterrows()]]
        if one.empty or two.empty or targets.empty:
            continue
        askable += len(targets)
        if len(one) > 1 or len(two) > 1:
            skipped += [(r, "several rows at 1 or 2 GPUs") for _, r in targets.iterrows()]
            continue
        base, anchor_row = one.iloc[0], two.iloc[0]
        try:
            at_two = predict_row(anchor_row, base, physics)
        except Skip as exc:
            skipped += [(r, f"the 2-GPU anchor: {exc}") for _, r in targets.iterrows()]
            continue
        for _, row in targets.iterrows():
            try:
                p = predict_row(row, base, physics)
            except Skip as exc:
                skipped.append((row, str(exc)))
                continue
            p = _base_flags(p, base)
            if not p.held_out and (flags := data_flags(anchor_row)):
                p = replace(p, held_out=f"anchor row: {'; '.join(flags)}")
            eff = protocol.anchored_eff(p.predicted_eff, at_two.predicted_eff, at_two.published_eff)
            judged.append(_judge(p, protocol.TWO_GPUS, 2, eff))
    return judged, skipped, askable


def _base_flags(p: Prediction, base: pd.Series) -> Prediction:
    flags = data_flags(base)
    return replace(p, held_out=f"base row: {'; '.join(flags)}") if flags and not p.held_out else p


def _typed(corpus: pd.DataFrame) -> pd.DataFrame:
    corpus = corpus.copy()
    corpus["gpus"] = pd.to_numeric(corpus["gpus"], errors="coerce")
    corpus["per_gpu_batch"] = pd.to_numeric(corpus["per_gpu_batch"], errors="coerce")
    if NODES in corpus.columns:
        corpus[NODES] = pd.to_numeric(corpus[NODES], errors="coerce")
    return corpus.dropna(subset=["gpus"])


PROTOCOLS = {protocol.NODE: node, protocol.TWO_GPUS: two_gpus}


# ---- bands: one per protocol, in units of the reach, calibrated on sources held out -----------------------

# the reach_scale powers tried: the band as wide at every reach (0), widening as √log2 (0.5) or log2 (1)
POWERS = (0.0, 0.5, 1.0)


def _source(j: Judged) -> str:
    return str(j.prediction.row["source_id"])


def _fit(judged: list[Judged], name: str, level: float, power: float) -> protocol.ProtocolBand:
    us = [j.residual / protocol.reach_scale(j.reach, power) for j in judged]
    low, high = shortest(us, level)
    return protocol.ProtocolBand(name, len(us), len({_source(j) for j in judged}), statistics.median(us), low,
                                 high, level, power)


def held_out(judged: list[Judged], level: float, power: float) -> tuple[float, float]:
    """(share inside, median width in points) of the rows, each in the band fitted at `level` and `power`
    on the other sources' rows."""
    inside, widths = 0, []
    for source in {_source(j) for j in judged}:
        others = [j for j in judged if _source(j) != source]
        if not others:
            continue
        band = _fit(others, "", level, power)
        for j in (j for j in judged if _source(j) == source):
            low, high = band.bounds(100 * j.model_eff, j.reach)
            inside += low <= 100 * j.published_eff <= high
            widths.append(high - low)
    return inside / len(judged), statistics.median(widths) if widths else math.nan


def fit_band(judged: list[Judged], name: str) -> protocol.ProtocolBand:
    """The protocol's band from its headline rows: for each of POWERS the smallest of fitting.LEVELS whose
    held-out (leave-one-source-out) coverage reaches HELD_OUT, and of those the power with the smallest
    held-out median width; when no level reaches it, the best-covering one."""
    rows = [j for j in judged if not j.held_out]
    tried = []
    for power in POWERS:
        for level in LEVELS:
            inside, width = held_out(rows, level, power)
            if inside >= HELD_OUT or level == LEVELS[-1]:
                tried.append((inside < HELD_OUT, width if inside >= HELD_OUT else -inside, level, power))
                break
    _, _, level, power = min(tried)
    return _fit(rows, name, level, power)


def write_bands(bands: dict[str, protocol.ProtocolBand], path=protocol.STORED) -> None:
    rows = [{"band": b.name, "rows": b.rows, "sources": b.sources, "shift": round(b.shift, 6),
             "low": round(b.low, 6), "high": round(b.high, 6), "level": b.level, "power": b.power}
            for b in bands.values()]
    pd.DataFrame(rows, columns=list(protocol.STORED_COLUMNS)).to_csv(path, index=False)


@dataclass(frozen=True)
class ScoredRow:
    """A judged row with the band bench project would print for it: the printed efficiency, whether the
    published one is inside the 90 % interval, and its width in points."""

    judged: Judged
    band: protocol.ProtocolBand
    predicted_eff: float
    inside: bool
    width_points: float

    @property
    def error_pct(self) -> float:
        return 100 * abs(self.predicted_eff - self.judged.published_eff) / self.judged.published_eff


def score(judged: list[Judged], stored: dict[str, protocol.ProtocolBand],
          training: list[Judged]) -> list[ScoredRow]:
    """Each row with its band: fitted without the row's source when that source is among `training` (the
    rows the stored bands were fitted on), else the stored band (exactly what bench project prints)."""
    sources = {str(j.prediction.row["source_id"]) for j in training}
    out = []
    for j in judged:
        band = stored[j.protocol]
        if _source(j) in sources:   # the stored band's level and power, refitted without the row's source
            others = [t for t in training if _source(t) != _source(j) and not t.held_out]
            band = _fit(others, band.name, band.level, band.power)
        low, high = band.bounds(100 * j.model_eff, j.reach)
        out.append(ScoredRow(j, band, band.predicted(j.model_eff, j.reach),
                             band.contains(j.published_eff, j.model_eff, j.reach), high - low))
    return out


def stats(scored: list[ScoredRow]) -> dict:
    return stats_from([s.error_pct for s in scored], [s.inside for s in scored],
                      [s.width_points for s in scored])


def fixed_cost_check(corpus: pd.DataFrame) -> tuple[list[float], list[float]]:
    """(|error| % with the fixed cost, |error| % without) of the step at a table's smaller per-GPU batch
    predicted from its larger one at the same GPU count, the fixed cost fitted from the table's 1-GPU rows
    at those two batches (protocol.fixed_cost_ms): the term checked on its own, where tables print two
    batches."""
    with_f, without = [], []
    corpus = _typed(corpus)
    for _, table in corpus.groupby(corpus.apply(table_key, axis=1), sort=False):
        steps = {}
        for _, r in table.iterrows():
            try:
                units, _ = units_per_sample(str(r["model"]), str(r["throughput_unit"]), str(r["notes"]))
            except Skip:
                continue
            batch = int(r["per_gpu_batch"])
            steps[(int(r["gpus"]), batch)] = batch / per_gpu(r, units) * 1e3
        ones = sorted(b for g, b in steps if g == 1)
        if len(ones) < 2:
            continue
        small, large = ones[0], ones[-1]
        fixed = protocol.fixed_cost_ms(small, steps[1, small], large, steps[1, large])
        for n in sorted({g for g, _ in steps} - {1}):
            if (n, small) in steps and (n, large) in steps:
                truth = steps[n, small]
                for out, f in ((with_f, fixed), (without, 0.0)):
                    out.append(100 * abs(protocol.micro_at(steps[n, large], large, small, f) - truth) / truth)
    return with_f, without
