"""The advice in words: one sentence written from advice.csv's rows and nothing else.

Every number in the sentence is a column of advice.csv (tests/test_advise.py reads them back from the file),
so the sentence cannot say what the table does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# advise.cli.dominant_loss (projection.csv's `dominant_term`, else its `bottleneck`) → the loss, in words
LOSS_WORDS = {
    "compute": ("compute-bound: communication stays hidden, and what efficiency is lost goes to compute that "
                "does not shrink with the per-rank batch"),
    "overlap-limited": "exposed communication is the loss (buckets become ready too late to hide it)",
    "bandwidth": "exposed communication is the loss (bandwidth-bound)",
    "latency": "exposed communication is the loss (latency-bound: many small all-reduces)",
    "straggler": "the slowest rank is the loss (per-rank step-time spread grows with the rank count)",
    "interference": "communication slowing the compute it overlaps is the loss",
    "host_floor": "the host is the loss (the step cannot be shorter than its host time)",
}
CPU_CAVEAT = (
    "This is a CPU run (gloo): it ranks the engines' own overhead on this machine and checks that every "
    "setting runs, but CPU step times say nothing about GPU speed (bf16 is emulated, communication is host "
    "memory), and a projection from it to a GPU cluster is an exercise of the model, not a prediction."
)


@dataclass(frozen=True)
class Target:
    """Where the top configurations were projected: `gpus` ranks on `network` (None: not projected)."""

    gpus: int | None = None
    network: str | None = None
    why_not: str = ""


def setting_words(row: pd.Series, keys: list[str]) -> str:
    """'overlap, 25 MiB buckets, bf16, accumulation 2' for `keys` (+ any other key as 'key value')."""
    parts = []
    for key in keys:
        value = row[key]
        if key == "engine":
            parts.append(str(value))
        elif key == "bucket_cap_mb":
            parts.append("no buckets" if pd.isna(value) else f"{value:g} MiB buckets")
        elif key == "precision":
            parts.append(str(value))
        elif key == "comm_dtype":
            parts.append("uncompressed gradients" if value == "none" else f"{value} gradients")
        elif key == "grad_accum":
            parts.append(f"accumulation {int(value)}")
        elif key == "scaling":
            parts.append(f"{value} scaling")
        elif key == "engine_options":  # the cell id's words for options away from their defaults
            if isinstance(value, str) and value:  # at their defaults the options go unsaid
                parts.append(f"with {value}")
        elif not pd.isna(value):
            name = key.replace("_", " ").replace("per rank", "per-rank")
            parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    return ", ".join(parts)


def choice_words(row: pd.Series, keys: list[str]) -> str:
    """The recommendation: setting_words, less an uncompressed comm dtype (the default goes unsaid)."""
    return setting_words(row, [k for k in keys if not (k == "comm_dtype" and row[k] == "none")])


def differences(row: pd.Series, best: pd.Series, keys: list[str]) -> str:
    """How `row` differs from `best`, in the words of setting_words."""
    differing = [k for k in keys if str(row[k]) != str(best[k])]
    words = setting_words(row, differing)
    if not words and "engine_options" in differing:
        return "engine options at defaults"
    return words or "an identical configuration"


def half_width_pct(row: pd.Series) -> float:
    """Half the 95 % interval of samples/s, in % of the median."""
    return (row["samples_per_s_ci95_high"] - row["samples_per_s_ci95_low"]) / 2 / row["samples_per_s"] * 100


def sentence(advice: pd.DataFrame, keys: list[str], target: Target) -> str:
    """The short answer: the best configuration, its throughput and interval, its ties, its projection."""
    ranked = advice[advice["rank"].notna()].sort_values("rank")
    best = ranked.iloc[0]
    n = int(best["world_size"])
    interval = ("" if pd.isna(best["samples_per_s_ci95_low"])
                else f" (±{half_width_pct(best):.1f} %)")
    s = (f"Use {choice_words(best, keys)}: {best['samples_per_s']:,.0f} samples/s at {n} "
         f"rank{'s' if n > 1 else ''}{interval}")
    tied = ranked[ranked["tied_with_best"].astype(bool)]
    if len(tied) == 0:
        s += ", ahead of every other configuration beyond the noise"
    elif len(tied) <= 2:
        s += ", tied with " + " and ".join(differences(r, best, keys) for _, r in tied.iterrows())
    else:
        s += f", tied with {len(tied)} other configurations (advice.csv, tied_with_best)"
    if target.gpus is None:
        return s + f"; not projected ({target.why_not})." if target.why_not else s + "."
    at = f"{target.gpus} GPUs on {target.network}"
    if pd.notna(best["projected_efficiency"]):
        return s + f"; projected {_projected(best)} at {at} — {_loss(best)}."
    s += f"; it cannot be projected to {at} ({best['projection_note']})"
    projected = ranked[ranked["projected_efficiency"].notna()]
    if not len(projected):
        return s + "."
    r = projected.iloc[0]  # the best-ranked configuration that can be
    return (s + f"; the best that can, rank {int(r['rank'])} ({setting_words(r, keys)}, "
            f"{r['samples_per_s']:,.0f} samples/s), is projected {_projected(r)} — {_loss(r)}.")


def _projected(row: pd.Series) -> str:
    return (f"{row['projected_efficiency'] * 100:.0f} % efficiency ({row['projected_samples_per_s']:,.0f} "
            f"samples/s)")


def _loss(row: pd.Series) -> str:
    return LOSS_WORDS.get(row["dominant_loss"], row["dominant_loss"])
