"""`bench project`'s model against published single-node multi-GPU training tables.

For each N-GPU row of the corpus, project from its group's 1-GPU row (bench/project/published.py says how)
and print, per row and per model family, the predicted and published scaling efficiency and the |error| of
the predicted N-GPU throughput, then the rows skipped and why; the last line is exactly
`rows N · median |error| X % · worst Y %`.

    PYTHONPATH=. python benchmarks/validate_projection.py --corpus tests/data/published_scaling/train.csv
    ... --no-straggler --no-interference     switch a physics term off (docs/design.md "Projection")
    ... --fit                                 the once-for-the-whole-corpus fit of σ and γ (prints the grid)

Exit 2 on a bad argument or a corpus without its columns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from bench.project.physics import DEFAULT_INTERFERENCE, DEFAULT_STEP_CV, Physics
from bench.project.published import read_corpus, summary_line, validate

FIT_CV = (0.0, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04)
FIT_GAMMA = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4)
WORST_GOAL_PCT = 25.0  # the issue's goal for every row


def _physics(args) -> Physics:
    return Physics(straggler=not args.no_straggler, interference=not args.no_interference,
                   step_cv=args.step_cv, interference_factor=args.interference)


def _fit(corpus) -> None:
    """Median and worst |error| and the rows worse than the issue's 25 % over a grid of (σ, γ), all rows at
    once. Only σ is fitted (the smallest median, ties to the smaller worst) at the measured default γ
    (physics.DEFAULT_INTERFERENCE); the grid shows what other γ would do."""
    print(f"{'step_cv':>8} {'gamma':>6} {'median':>7} {'worst':>7} {'> 25 %':>6}")
    best = None
    for cv in FIT_CV:
        for gamma in FIT_GAMMA:
            preds, _, _ = validate(corpus, Physics(step_cv=cv, interference_factor=gamma))
            errors = [p.error_pct for p in preds]
            med, worst = statistics.median(errors), max(errors)
            over = sum(e > WORST_GOAL_PCT for e in errors)
            print(f"{cv:8.3f} {gamma:6.2f} {med:7.2f} {worst:7.2f} {over:6d}")
    for cv in FIT_CV:
        preds, _, _ = validate(corpus, Physics(step_cv=cv, interference_factor=DEFAULT_INTERFERENCE))
        errors = [p.error_pct for p in preds]
        med, worst = statistics.median(errors), max(errors)
        if best is None or (med, worst) < best[:2]:
            best = (med, worst, cv)
    print(f"fit: step_cv {best[2]} at the measured interference {DEFAULT_INTERFERENCE} "
          f"(median {best[0]:.2f} %, worst {best[1]:.2f} %)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a published_scaling train.csv")
    parser.add_argument("--no-straggler", action="store_true")
    parser.add_argument("--no-interference", action="store_true")
    parser.add_argument("--step-cv", type=float, default=DEFAULT_STEP_CV)
    parser.add_argument("--interference", type=float, default=DEFAULT_INTERFERENCE)
    parser.add_argument("--fit", action="store_true", help="print the (σ, γ) grid instead of the rows")
    args = parser.parse_args(argv)
    try:
        physics = _physics(args)
        corpus = read_corpus(args.corpus)
    except (OSError, ValueError) as exc:
        print(f"validate_projection: --corpus={str(args.corpus)!r}: {exc}", file=sys.stderr)
        return 2
    if args.fit:
        _fit(corpus)
        return 0
    preds, skipped, eligible = validate(corpus, physics)

    print(f"{'source':20} {'model':24} {'hardware':30} {'prec':8} {'bs':>5} {'N':>2} {'network':13} "
          f"{'T1 ms':>8} {'pub eff':>7} {'pred eff':>8} {'|err| %':>7} {'dominant':>12}")
    for p in preds:
        r = p.row
        print(f"{r['source_id'][:20]:20} {r['model'][:24]:24} {r['hardware'][:30]:30} {r['precision']:8} "
              f"{str(r['per_gpu_batch'])[:5]:>5} {int(r['gpus']):2d} {p.network:13} {p.t1_ms:8.1f} "
              f"{100 * p.published_eff:6.1f}% {100 * p.predicted_eff:7.1f}% {p.error_pct:7.1f} "
              f"{p.dominant:>12}")

    print("\nper model family")
    print(f"{'model':40} {'rows':>4} {'pub eff':>8} {'pred eff':>8} {'median |err| %':>14} {'worst %':>8}")
    by_model = defaultdict(list)
    for p in preds:
        by_model[p.row["model"]].append(p)
    for model, ps in sorted(by_model.items()):
        errors = [p.error_pct for p in ps]
        print(f"{model[:40]:40} {len(ps):4d} {100 * statistics.mean(p.published_eff for p in ps):7.1f}% "
              f"{100 * statistics.mean(p.predicted_eff for p in ps):7.1f}% {statistics.median(errors):14.1f} "
              f"{max(errors):8.1f}")

    print(f"\nskipped {len(skipped)} multi-GPU rows")
    reasons = defaultdict(int)
    for r, why in skipped:
        print(f"  {r['source_id'][:20]:20} {r['model'][:24]:24} {r['hardware'][:30]:30} {r['precision']:8} "
              f"{str(r['per_gpu_batch'])[:5]:>5} {int(r['gpus']):2d}  {why}")
        reasons[why.split(" (")[0][:110]] += 1
    print("by reason")
    for why, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {why}")
    coverage = 100 * len(preds) / eligible if eligible else 0.0
    print(f"predicted {len(preds)} of {eligible} multi-GPU rows that have a 1-GPU row ({coverage:.1f} %)")
    print(summary_line(preds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
