"""Where the projection's single-node error lives, and how much of it any predictor must keep (issue 44;
docs/projection.md "Issue 44, blocked").

Over the headline rows the validator predicts from the base alone (benchmarks/validate_projection.py,
bench/project/published.py), print:

- the summed |error| per (source, model), largest first, with each one's share of the corpus's;
- the mean |error| were every row above 25 % predicted exactly (what the tail costs the mean);
- the median ln(published / predicted) per source;
- the replicate floor: rows of different sources with the same model, GPU, precision, per-GPU batch and
  GPU count are one question asked twice. A predictor gives both the same answer x, and its least summed
  |error| over such a cluster is min_x Σ |x / e_i − 1| (e_i the published efficiencies; the sum is convex
  and piecewise linear in x, so its minimum is at one of the e_i: replicate_floor). Summed over the
  clusters and divided by all rows, it is the part of the mean no predictor of these inputs can remove;
- per-step time lost to scaling, T1 · (1 / published efficiency − 1) in ms, of NVIDIA DLE's rows at 8 GPUs,
  AMP against FP32/TF32 of the same model and machine (a table's batches of one precision averaged): the
  same gradient bytes cross the same links at both precisions, so communication the model misses would
  lose the same time at both.

    PYTHONPATH=. python benchmarks/projection_tail.py [--corpus tests/data/published_scaling/train.csv]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from bench.project.physics import Physics
from projection_lab.published import read_corpus, validate

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "published_scaling" / "train.csv"
TAIL_PCT = 25.0   # issue 24's worst-row goal: the validator's "long tail"
REPLICATE = ("model", "hardware", "precision", "per_gpu_batch", "gpus")


def replicate_floor(efficiencies: list[float]) -> float:
    """min over x of Σ |x / e_i − 1| (module docstring): the least summed |error| of one answer to all."""
    return min(sum(abs(x / e - 1) for e in efficiencies) for x in efficiencies)


def rows_of(corpus: pd.DataFrame) -> pd.DataFrame:
    preds, _, _ = validate(corpus, Physics())
    out = []
    for p in preds:
        if p.held_out:
            continue
        r = p.row
        out.append({"source": str(r["source_id"]), "model": str(r["model"]), "hardware": str(r["hardware"]),
                    "precision": str(r["precision"]), "per_gpu_batch": str(r["per_gpu_batch"]),
                    "gpus": int(r["gpus"]), "t1_ms": p.t1_ms, "published": p.published_eff,
                    "predicted": p.predicted_eff, "error_pct": p.error_pct})
    df = pd.DataFrame(out)
    df["r"] = [math.log(a / b) for a, b in zip(df["published"], df["predicted"])]
    df["lost_ms"] = df["t1_ms"] * (1 / df["published"] - 1)
    return df


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args(argv)
    try:
        df = rows_of(read_corpus(args.corpus))
    except (OSError, ValueError) as exc:
        print(f"projection_tail: --corpus={str(args.corpus)!r}: {exc}", file=sys.stderr)
        return 2
    total = df["error_pct"].sum()
    pd.set_option("display.width", 160)
    by = df.groupby(["source", "model"])["error_pct"].agg(rows="size", mean="mean", summed="sum")
    by["share %"] = 100 * by["summed"] / total
    print(f"rows {len(df)} · mean |error| {df['error_pct'].mean():.1f} %\n")
    print(by.sort_values("summed", ascending=False).round(1).head(12).to_string())
    tail = df["error_pct"] > TAIL_PCT
    print(f"\n{tail.sum()} rows above {TAIL_PCT:.0f} %; the mean were they exact: "
          f"{df['error_pct'].where(~tail, 0.0).mean():.1f} %")
    print("\nmedian ln(published / predicted) per source:")
    print(df.groupby("source")["r"].agg(rows="size", median="median").round(3).to_string())

    floor, in_clusters, apart = 0.0, 0, []
    for key, cluster in df.groupby(list(REPLICATE)):
        if cluster["source"].nunique() < 2:
            continue
        floor += replicate_floor(list(cluster["published"])) * 100
        in_clusters += len(cluster)
        if cluster["published"].max() - cluster["published"].min() > 0.10:
            apart.append((key, dict(zip(cluster["source"], (100 * cluster["published"]).round(1)))))
    print(f"\nreplicates (same {', '.join(REPLICATE)} from two or more sources): {in_clusters} rows; "
          f"{len(apart)} clusters more than 10 points apart; the least |error| any predictor keeps on them "
          f"is {floor / len(df):.2f} points of the corpus's mean")
    for key, values in apart:
        print(f"  {' · '.join(map(str, key))}: {values}")

    dle = df[df["source"].str.startswith("DLE") & (df["gpus"] == 8)]
    key = ["source", "model", "hardware"]   # a table's batches of one precision: their mean
    amp = dle[dle["precision"] == "amp_fp16"].groupby(key)["lost_ms"].mean()
    full = dle[dle["precision"] != "amp_fp16"].groupby(key)["lost_ms"].mean()
    both = pd.DataFrame({"amp lost ms": amp, "fp32/tf32 lost ms": full}).dropna()
    print(f"\nNVIDIA DLE at 8 GPUs, time lost per step (ms), same model and machine: AMP above FP32/TF32 in "
          f"{(both['amp lost ms'] > both['fp32/tf32 lost ms']).sum()} of {len(both)}")
    print(both.round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
