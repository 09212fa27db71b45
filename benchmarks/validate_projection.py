"""`bench project`'s model against published multi-GPU and multi-node training tables.

For each row of the corpus above its group's base (its smallest row: 1 GPU, or one node), project from the
base alone — the issue's question: measured on one node, what will N GPUs do? — or, with --anchored, anchored
to the largest row of the group between the base and it where there is one (what a run that measured those
world sizes has; bench/project/published.py says how), and print, per row, per regime and basis and per
model family and per assumption (what the row's prediction assumed rather than measured: published.assumed),
the predicted and published scaling efficiency, the |error| of the predicted throughput and whether the
published value falls in the 90 % interval (bench/project/interval.py; clamped at 100 % efficiency, a
published value above it is never inside). A row with no smaller row of its own per-GPU batch is predicted
from its table's base of another recipe (published.other_recipe_base); each table's smallest rows are listed
as `not predicted, no base`. The interval of a row whose source is among the training corpora (--training)
is fitted without that source (leave-one-source-out); any other row's on all training rows: every interval
is held-out. Then the rows held out of the headline (FLAGged data, superlinear against their base) with
their own line, the rows skipped and why, the same rows' intervals fitted without their model family
(`held out by model family ...: inside 90 % interval C % · median width K points`), the other way of
predicting on the same rows (`anchored (--anchored): rows N · ...`, or `from the base alone: ...`); the
last line, for the mode asked for (from the base alone by default), is exactly

    rows N · mean |error| X % · median |error| Y % · p90 Z % · worst W % · inside 90 % interval C % ·
    median width K points

    PYTHONPATH=. python benchmarks/validate_projection.py --corpus tests/data/published_multinode/train.csv
    ... --no-straggler --no-interference     switch a physics term off (docs/design.md "Projection")
    ... --fit                                 the once-for-the-whole-corpus fit of σ (prints the grid)
    ... --fit-interval                        refit bench/project/model_error.csv from --training
    ... --anchored                            anchor each row to the largest published row below it

Exit 2 on a bad argument or a corpus without its columns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from bench.project import protocol
from bench.project.interval import POOLED, band_name, basis_of, family_of, read_bands
from bench.project.physics import DEFAULT_INTERFERENCE, DEFAULT_STEP_CV, Physics
from projection_lab import protocols
from projection_lab.fitting import (
    Residual,
    all_names,
    calibrated_levels,
    fit_bands,
    held_out_bands,
    held_out_coverage,
    write_bands,
)
from projection_lab.published import (
    assumed,
    bases_of,
    interval_pct,
    line_of,
    read_corpus,
    score,
    stats_of,
    summary_line,
    unanchored,
    validate,
    without_base,
)

ROOT = Path(__file__).resolve().parent.parent
TRAINING = (ROOT / "tests" / "data" / "published_scaling" / "train.csv",
            ROOT / "tests" / "data" / "published_multinode" / "train.csv")
FIT_CV = (0.0, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04)
FIT_GAMMA = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4)
WORST_GOAL_PCT = 25.0  # issue 24's goal for every row


def _physics(args) -> Physics:
    return Physics(straggler=not args.no_straggler, interference=not args.no_interference,
                   step_cv=args.step_cv, interference_factor=args.interference)


def training_residuals(paths, physics: Physics, done: dict | None = None) -> list[Residual]:
    """(source, band, ln(published/predicted), model family) of every headline row of the training corpora, on
    each basis it has (published.bases_of: from the base alone always, anchored too where it is); `done`:
    anchored predictions already made, by resolved path (the --corpus being one of them)."""
    out = []
    for path in paths:
        known = (done or {}).get(Path(path).resolve())
        preds = known if known is not None else validate(read_corpus(path), physics, anchor=True)[0]
        out += [Residual(str(p.row["source_id"]), band, r, family_of(str(p.row["model"])), cap, unit)
                for p in preds if not p.held_out for band, r, cap, unit in bases_of(p)]
    return out


def _fit(corpus) -> None:
    """Mean, median and worst |error| and the rows worse than 25 % over a grid of (σ, γ), all rows at once
    (headline rows only). σ is fitted once (the smallest median, ties to the smaller worst, at the measured
    γ: physics.DEFAULT_STEP_CV); the grid shows what other σ and γ would do."""
    print(f"{'step_cv':>8} {'gamma':>6} {'mean':>7} {'median':>7} {'worst':>7} {'> 25 %':>6}")
    best = None
    for cv in FIT_CV:
        for gamma in FIT_GAMMA:
            preds, _, _ = validate(corpus, Physics(step_cv=cv, interference_factor=gamma))
            errors = [p.error_pct for p in preds if not p.held_out]
            mean, med, worst = statistics.mean(errors), statistics.median(errors), max(errors)
            over = sum(e > WORST_GOAL_PCT for e in errors)
            print(f"{cv:8.3f} {gamma:6.2f} {mean:7.2f} {med:7.2f} {worst:7.2f} {over:6d}")
    for cv in FIT_CV:
        preds, _, _ = validate(corpus, Physics(step_cv=cv, interference_factor=DEFAULT_INTERFERENCE))
        errors = [p.error_pct for p in preds if not p.held_out]
        med, worst = statistics.median(errors), max(errors)
        if best is None or (med, worst) < best[:2]:
            best = (med, worst, cv)
    print(f"fit: step_cv {best[2]} at the measured interference {DEFAULT_INTERFERENCE} "
          f"(median {best[0]:.2f} %, worst {best[1]:.2f} %)")


def _fit_interval(training, physics: Physics) -> None:
    """Write model_error.csv from the training corpora and print each band, its level and its held-out
    (leave-one-source-out) coverage."""
    residuals = training_residuals(training, physics)
    calibrated = calibrated_levels(residuals)
    levels = {name: level for name, (level, _) in calibrated.items()}
    bands = fit_bands(residuals, levels)
    write_bands(bands, levels)
    print(f"{'band':20} {'rows':>5} {'level':>6} {'low':>8} {'high':>8} {'pooled':>6} "
          f"{'held-out inside %':>18}")
    for name, band in bands.items():
        print(f"{name:20} {band.rows:5d} {levels[name]:6.2f} {band.low:8.4f} {band.high:8.4f} "
              f"{str(band.pooled):>6} {100 * calibrated[name][1]:18.1f}")
    print("(held-out inside: the smaller of leave-one-source-out and leave-one-model-family-out; pooled: on "
          "the rows of the regimes of its basis that take it)")
    print(f"all rows in their bands, held out by source: {100 * held_out_coverage(residuals, levels):.1f} %, "
          f"by model family: {100 * held_out_coverage(residuals, levels, unit='family'):.1f} %")
    print(f"wrote {Path('bench/project/model_error.csv')}")


def _table(title: str, key, scored) -> None:
    print(f"\n{title}")
    print(f"{'':40} {'rows':>4} {'pub eff':>8} {'pred eff':>8} {'mean %':>7} {'median %':>8} {'p90 %':>6} "
          f"{'worst %':>7} {'inside %':>8} {'width':>6}")
    groups = defaultdict(list)
    for s in scored:
        groups[key(s)].append(s)
    for name, ss in sorted(groups.items()):
        st = stats_of(ss)
        pub = 100 * statistics.mean(s.prediction.published_eff for s in ss)
        pred = 100 * statistics.mean(s.prediction.predicted_eff for s in ss)
        print(f"{str(name)[:40]:40} {st['rows']:4d} {pub:7.1f}% {pred:7.1f}% {st['mean']:7.1f} "
              f"{st['median']:8.1f} {st['p90']:6.1f} {st['worst']:7.1f} {st['inside']:8.1f} "
              f"{st['width']:6.1f}")


def _protocol_training(training, name: str, physics: Physics) -> list:
    """The judged rows of every training corpus under a protocol (what protocol_bands.csv is fitted on)."""
    return [j for path in training for j in protocols.PROTOCOLS[name](read_corpus(path), physics)[0]]


def _fit_protocol_bands(training, physics: Physics) -> None:
    """Write bench/project/protocol_bands.csv from the training corpora (a band per protocol) and print each
    with its held-out (leave-one-source-out) coverage and width per reach class."""
    bands = {}
    for name in protocol.PROTOCOLS:
        judged = [j for j in _protocol_training(training, name, physics) if not j.held_out]
        band = bands[name] = protocols.fit_band(judged, name)
        inside, width = protocols.held_out(judged, band.level, band.power)
        print(f"{name}: {band.rows} rows of {band.sources} sources, level {band.level:.2f}, reach power "
              f"{band.power:g}, shift {band.shift:+.4f}, [{band.low:+.4f}, {band.high:+.4f}]·s; held out by "
              f"source: inside {100 * inside:.1f} %, median width {width:.1f} points")
    protocols.write_bands(bands)
    print(f"wrote {protocol.STORED.relative_to(ROOT)}")


def _protocol_main(args, corpus, training, physics: Physics) -> int:
    """--protocol: every askable row of the corpus judged as bench project would print it from the
    protocol's measured rows (benchmarks/projection_lab/protocols.py), the agreed line last."""
    judged, skipped, askable = protocols.PROTOCOLS[args.protocol](corpus, physics)
    scored = protocols.score(judged, protocol.read_bands(), _protocol_training(training, args.protocol,
                                                                                 physics))
    headline = [s for s in scored if not s.judged.held_out]
    print(f"{'source':22} {'model':26} {'hardware':20} {'prec':8} {'bs':>5} {'base':>4} {'N':>4} "
          f"{'band':14} {'pub eff':>7} {'model':>7} {'printed':>7} {'90 % interval':>15} {'|err| %':>7}")
    for s in scored:
        j, r = s.judged, s.judged.prediction.row
        low, high = s.band.bounds(100 * j.model_eff, j.reach)
        mark = "" if s.inside else " *outside*"
        print(f"{str(r['source_id'])[:22]:22} {str(r['model'])[:26]:26} {str(r['hardware'])[:20]:20} "
              f"{str(r['precision'])[:8]:8} {str(r['per_gpu_batch'])[:5]:>5} "
              f"{int(j.prediction.base['gpus']):4d} {int(r['gpus']):4d} {j.band:14} "
              f"{100 * j.published_eff:6.1f}% {100 * j.model_eff:6.1f}% {100 * s.predicted_eff:6.1f}% "
              f"{f'{low:.1f}–{high:.1f} %':>15} {s.error_pct:7.1f}{mark}"
              + (f"  [{j.fixed_cost}]" if j.fixed_cost else "")
              + (f"  [held out: {j.held_out}]" if j.held_out else ""))
    print("\nper reach (headline rows; bands fitted without the row's source where it is a training one)")
    for name in protocol.all_classes():
        mine = [s for s in headline if s.judged.band == name]
        if mine:
            print(f"  {name:16} {line_of(protocols.stats(mine))}")
    apart = [s for s in scored if s.judged.held_out]
    print(f"\nheld out of the headline: {len(apart)} rows (FLAGged data, or superlinear against their base)")
    if apart:
        print(f"  held-out rows: {line_of(protocols.stats(apart))}")
    print(f"skipped {len(skipped)} rows")
    for r, why in skipped:
        print(f"  {str(r['source_id'])[:22]:22} {str(r['model'])[:26]:26} {int(r['gpus']):4d}  {why}")
    with_f, without = protocols.fixed_cost_check(corpus)
    if with_f:
        print(f"fixed cost (strong scaling's term, alone): {len(with_f)} (table, GPUs) pairs, the step at "
              f"the smaller per-GPU batch from the larger's, F from the 1-GPU rows: mean |error| "
              f"{statistics.mean(with_f):.1f} % (F = 0, compute ∝ batch: {statistics.mean(without):.1f} %)")
    counted = askable - len(apart)
    print(f"protocol {args.protocol}: predicted {len(headline)} of {counted} askable rows not held out "
          f"({100 * len(headline) / counted if counted else 0:.1f} %)")
    print(line_of(protocols.stats(headline)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a published_scaling/multinode CSV")
    parser.add_argument("--training", default=",".join(str(p) for p in TRAINING),
                        help="comma-separated corpora the interval's bands are fitted on (default: the "
                             "in-project single-node and multi-node corpora)")
    parser.add_argument("--no-straggler", action="store_true")
    parser.add_argument("--no-interference", action="store_true")
    parser.add_argument("--step-cv", type=float, default=DEFAULT_STEP_CV)
    parser.add_argument("--interference", type=float, default=DEFAULT_INTERFERENCE)
    parser.add_argument("--fit", action="store_true", help="print the (σ, γ) grid instead of the rows")
    parser.add_argument("--fit-interval", action="store_true",
                        help="refit bench/project/model_error.csv from --training and print the bands")
    parser.add_argument("--protocol", choices=protocol.PROTOCOLS,
                        help="judge the corpus on what a user measures: `node` (one node → several), "
                             "`two-gpus` (1 and 2 GPUs → one node); with --fit-interval, refit "
                             "bench/project/protocol_bands.csv")
    parser.add_argument("--anchored", action="store_true",
                        help="anchor each row to the largest published row of its group below it "
                             "(default: from the base alone)")
    args = parser.parse_args(argv)
    training = [Path(p) for p in args.training.split(",") if p.strip()]
    try:
        physics = _physics(args)
        corpus = read_corpus(args.corpus)
        for path in training:
            read_corpus(path)
    except (OSError, ValueError) as exc:
        print(f"validate_projection: --corpus={str(args.corpus)!r} --training={args.training!r}: {exc}",
              file=sys.stderr)
        return 2
    if args.fit:
        _fit(corpus)
        return 0
    if args.fit_interval and args.protocol:
        _fit_protocol_bands(training, physics)
        return 0
    if args.fit_interval:
        _fit_interval(training, physics)
        return 0
    if args.protocol:
        return _protocol_main(args, corpus, training, physics)
    anchored, skipped, eligible = validate(corpus, physics, anchor=True)
    residuals = training_residuals(training, physics, {args.corpus.resolve(): anchored})
    levels = read_bands()[1]   # each regime's level, calibrated on held-out sources (--fit-interval)
    bands, loso = fit_bands(residuals, levels), held_out_bands(residuals, levels)
    from_base = [unanchored(p) for p in anchored]
    preds, other = (anchored, from_base) if args.anchored else (from_base, anchored)
    scored = score(preds, bands, loso)
    headline = [s for s in scored if not s.prediction.held_out]
    apart = [s for s in scored if s.prediction.held_out]

    print(f"{'source':20} {'model':24} {'hardware':24} {'prec':8} {'bs':>5} {'N':>3} {'regime':10} "
          f"{'anchor':>6} {'T ms':>9} {'pub eff':>7} {'base eff':>8} {'pred eff':>8} {'90 % interval':>15} "
          f"{'|err| %':>7} {'dominant':>12}  assumed")
    for s in scored:
        p, r = s.prediction, s.prediction.row
        lo, hi = interval_pct(p, s.band)
        mark = "" if s.inside else " *outside*"
        print(f"{str(r['source_id'])[:20]:20} {str(r['model'])[:24]:24} {str(r['hardware'])[:24]:24} "
              f"{str(r['precision'])[:8]:8} {str(r['per_gpu_batch'])[:5]:>5} {int(r['gpus']):3d} "
              f"{p.regime:10} {p.anchor_gpus or '':>6} "
              f"{p.t1_ms:9.1f} {100 * p.published_eff:6.1f}% "
              f"{100 * (p.from_base_eff or p.predicted_eff):7.1f}% {100 * p.predicted_eff:7.1f}% "
              f"{f'{lo:.1f}–{hi:.1f} %':>15} {p.error_pct:7.1f} {p.dominant:>12}  "
              f"{', '.join(assumed(p)) or '-'}{mark}" + (f"  [held out: {p.held_out}]" if p.held_out else ""))

    _table("per band: regime and basis (headline rows; each band is fitted without the row's source)",
           lambda s: s.prediction.band, headline)
    _table("per model family (headline rows)", lambda s: s.prediction.row["model"], headline)
    _table("per assumption (headline rows; a row counts under each it has, `-` none)",
           lambda s: ", ".join(assumed(s.prediction)) or "-", headline)
    print("\nbands fitted on all training rows (ln published/predicted; bench/project/model_error.csv):")
    for name in all_names():
        b = bands[name]
        pooled = "  (pooled)" if b.pooled else ""
        level = levels[band_name(POOLED, basis_of(name)) if b.pooled else name]
        print(f"  {name:20} rows {b.rows:4d}  level {level:.2f}  [{b.low:+.4f}, {b.high:+.4f}]{pooled}")

    print(f"\nheld out of the headline: {len(apart)} rows predicted but not counted (FLAGged data, or "
          f"superlinear against their base)")
    reasons = defaultdict(int)
    for s in apart:
        reasons[s.prediction.held_out.split(" (")[0][:110]] += 1
    for why, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {why}")
    if apart:
        print(f"  held-out rows: {summary_line(apart)}")

    print(f"\nskipped {len(skipped)} rows")
    reasons = defaultdict(int)
    for r, why in skipped:
        print(f"  {str(r['source_id'])[:20]:20} {str(r['model'])[:24]:24} {str(r['hardware'])[:24]:24} "
              f"{str(r['precision'])[:8]:8} {str(r['per_gpu_batch'])[:5]:>5} {int(r['gpus']):3d}  {why}")
        reasons[why.split(" (")[0][:110]] += 1
    print("by reason")
    for why, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {why}")
    alone = without_base(corpus)
    print(f"\nnot predicted, no base: {len(alone)} rows, each the smallest size of its table (source, model, "
          "framework, hardware, precision): the rows the others are predicted from")
    for r, why in alone:
        print(f"  {str(r['source_id'])[:20]:20} {str(r['model'])[:24]:24} {str(r['hardware'])[:24]:24} "
              f"{str(r['precision'])[:8]:8} {str(r['per_gpu_batch'])[:5]:>5} {int(r['gpus']):3d}  {why}")
    counted = eligible - len(apart)
    coverage = 100 * len(headline) / counted if counted else 0.0
    print(f"predicted {len(headline)} of {counted} rows that have a base and are not held out "
          f"({coverage:.1f} %); {len(apart)} held out; {eligible} rows have a base; "
          f"{sum(s.prediction.anchor_gpus is not None for s in headline)} of them anchored")
    by_family = score([s.prediction for s in headline], bands, held_out_bands(residuals, levels, "family"),
                      "family")
    st = stats_of(by_family)
    print(f"held out by model family (bands fitted without the row's family): inside 90 % interval "
          f"{st['inside']:.1f} % · median width {st['width']:.1f} points")
    others = [s for s in score(other, bands, loso) if not s.prediction.held_out]
    print(f"{'from the base alone' if args.anchored else 'anchored (--anchored)'}: {summary_line(others)}")
    print(summary_line(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
