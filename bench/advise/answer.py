"""The advice in words: the answer written from advice.csv's rows and nothing else.

Every number in it is a column of advice.csv (tests/test_advise.py reads them back from the file), so the
answer cannot say what the table does not. Its first words are what to do (advice.csv `answer_role`, see
choice.py): "Use …", "Keep torch DDP's defaults …", "No clear winner at this precision …"; then how much
faster than torch DDP's defaults, with the 95 % interval, at the recipe; then what to expect at the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bench import engines, stats
from bench.advise.choice import NAMED, wide

# the projection's dominant loss (advise.api.dominant_loss: projection.csv's `dominant_term`, else its
# `bottleneck`) → what the step loses at the target, after "the loss is"
LOSS_WORDS = {
    "compute": "compute that does not shrink with the per-GPU batch (communication stays hidden)",
    "overlap-limited": "the exposed all-reduce of the last buckets (they become ready too late to hide)",
    "bandwidth": "exposed all-reduce time (bandwidth-bound)",
    "latency": "exposed all-reduce latency (many small all-reduces)",
    "straggler": "waiting for the slowest rank (per-rank step-time spread grows with the rank count)",
    "interference": "communication slowing the compute it overlaps",
    "host_floor": "the host (the step cannot be shorter than its host time)",
}
CPU_CAVEAT = (
    "This is a CPU run (gloo): it ranks the engines' own overhead on this machine and checks that every "
    "setting runs, but CPU step times say nothing about GPU speed (bf16 is emulated, communication is host "
    "memory), and a projection from it to a GPU cluster is an exercise of the model, not a prediction.")


@dataclass(frozen=True)
class Target:
    """Where the advice is projected: `gpus` ranks on `network` (an NVLink preset: nodes of `gpus_per_node`
    with `inter_network` between them); gpus None: not projected, `why_not` says why."""

    gpus: int | None = None
    network: str | None = None
    gpus_per_node: int = 8
    inter_network: str = "ib-ndr400"
    why_not: str = ""

    def words(self, nodes=None) -> str:
        """'64 GPUs on h100-nvlink (8 nodes of 8, ib-ndr400 between)' / '64 GPUs on ib-ndr400'."""
        text = f"{self.gpus} GPUs on {self.network}"
        if nodes is not None and not pd.isna(nodes) and int(nodes) > 1:
            text += f" ({int(nodes)} nodes of {self.gpus_per_node}, {self.inter_network} between)"
        return text


def engine_words(engine: str) -> str:
    return "torch DDP" if engine == engines.reference().name else str(engine)


def setting_words(row: pd.Series, keys: list[str], base: pd.Series | None = None) -> str:
    """The row's settings in words: its engine, then each of `keys` that differs from `base` — '0.05 MiB
    buckets', 'bf16 gradients', 'accumulation 2 (per-GPU batch 2)'; without a base every setting but an
    uncompressed wire and no engine option."""
    if base is None:
        differs = [k for k in keys if not (k == "comm_dtype" and row[k] == "none")]
    else:
        differs = [k for k in keys if not _equal(row[k], base[k])]
    parts = [engine_words(row["engine"])]
    for key in differs:
        value = row[key]
        if key == "bucket_cap_mb":
            parts.append("no buckets" if pd.isna(value) else f"{value:g} MiB buckets")
        elif key == "engine":
            continue  # said first
        elif key == "precision":
            parts.append(str(value))
        elif key == "comm_dtype":
            parts.append("uncompressed gradients" if value == "none" else f"{value} gradients")
        elif key in ("grad_accum", "per_rank_batch"):  # the accumulation split, said once
            split = (f"per-GPU batch {int(row['per_rank_batch'])}" if int(row["grad_accum"]) == 1 else
                     f"accumulation {int(row['grad_accum'])} (per-GPU batch {int(row['per_rank_batch'])})")
            parts += [split] if split not in parts else []
        elif key == "engine_options":
            parts += [f"with {value}"] if isinstance(value, str) and value else []
        elif not pd.isna(value):
            name = key.replace("_", " ")
            parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    return ", ".join(parts)


def _equal(a, b) -> bool:
    if pd.isna(a) or pd.isna(b):
        return bool(pd.isna(a) and pd.isna(b))
    return str(a) == str(b)


def speedup_words(row: pd.Series) -> str:
    """'1.18× [1.12, 1.24]' (the interval's bounds as written in advice.csv, to 2 decimals)."""
    s = f"{row['speedup_vs_baseline']:.2f}×"
    if pd.notna(row["speedup_vs_baseline_ci95_low"]) and pd.notna(row["speedup_vs_baseline_ci95_high"]):
        s += f" [{row['speedup_vs_baseline_ci95_low']:.2f}, {row['speedup_vs_baseline_ci95_high']:.2f}]"
    return s


def projection_words(row: pd.Series, target: Target, recipe: int) -> str:
    """What to expect at the target for `row`: efficiency with its interval when projection.csv has one,
    throughput, the batch there (the recipe kept, or the per-GPU micro-batch held and the global batch it
    makes), and the loss."""
    if target.gpus is None:
        return f"not projected ({target.why_not})" if target.why_not else "not projected"
    if pd.isna(row["projected_efficiency"]):
        return f"it cannot be projected to {target.words()} ({row['projection_note'] or 'no projection'})"
    eff = f"{row['projected_efficiency'] * 100:.0f} %"
    if pd.notna(row.get("projected_efficiency_low")) and pd.notna(row.get("projected_efficiency_high")):
        eff += f" [{row['projected_efficiency_low'] * 100:.0f}, {row['projected_efficiency_high'] * 100:.0f}]"
    per_gpu, there = int(row["projected_per_rank_batch"]), int(row["projected_global_batch"])
    if there == recipe:
        batch = f"per-GPU batch {per_gpu}, the recipe kept"
    else:
        micro = recipe // int(row["grad_accum"])
        batch = (f"per-GPU micro-batch {per_gpu} held: global batch {there} there, as {micro} samples per "
                 f"micro-step do not divide among {target.gpus} ranks")
        keeps = recipe / (per_gpu * target.gpus)
        if keeps == int(keeps) and keeps >= 1:
            batch += f"; accumulation {int(keeps)} would keep global batch {recipe}"
    loss = LOSS_WORDS.get(row["dominant_loss"], row["dominant_loss"])
    return (f"at {target.words(row.get('projected_nodes'))} expect {eff} efficiency "
            f"({row['projected_samples_per_s']:,.0f} samples/s; {batch}); the loss is {loss}")


def answer(advice: pd.DataFrame, keys: list[str], target: Target, other_recipes: list[int],
           run_dir: str, remeasure: str) -> str:
    """The answer (module docstring) from advice.csv's rows: `answer_role` says which rows it names."""
    role = advice["answer_role"].fillna("")
    named = advice[role.isin(NAMED)].iloc[0]
    recipe, n = int(named["global_batch"]), int(named["world_size"])
    at = f"at global batch {recipe} ({n} rank{'s' if n > 1 else ''}, {named['precision']})"
    base = advice[advice["baseline"].astype(bool) & (advice["precision"] == named["precision"])]
    base = base.iloc[0] if len(base) else None
    contender = advice[role == "contender"]
    what = named["answer_role"]
    if what == "use":
        s = (f"Use {setting_words(named, keys, base)}: {speedup_words(named)} torch DDP's defaults {at}; "
             f"{projection_words(named, target, recipe)}.")
        tied = advice[role == "tied"]
        if len(tied):
            s += (f" The simplest of {len(tied) + 1} tied configurations faster than the defaults "
                  f"(advice.csv answer_role).")
    elif what == "keep":
        s = (f"Keep torch DDP's defaults ({setting_words(named, keys)}): nothing measured {at} is faster "
             f"beyond the noise")
        if len(contender):
            c = contender.iloc[0]
            s += f" (the best other, {setting_words(c, keys, named)}, is {speedup_words(c)})"
        s += f"; {projection_words(named, target, recipe)}."
    elif what == "unclear":
        others = advice[advice["rank"].notna() & ~advice["baseline"].astype(bool)
                        & (advice["precision"] == named["precision"])]
        unclear = sum(1 for _, r in others.iterrows() if wide(r))
        s = "No clear winner at this precision: "
        if len(contender):
            c = contender.iloc[0]
            s += (f"{at} the best, {setting_words(c, keys, named)}, is {speedup_words(c)} torch DDP's "
                  f"defaults, and {unclear} of {len(others)} configurations have no speedup interval or one "
                  f"wider than ±{stats.UNSTABLE_HALF_WIDTH_PCT:g} %")
        s += (f"; keep torch DDP's defaults ({setting_words(named, keys)}) until a re-measurement separates "
              f"them: `{remeasure}`; {projection_words(named, target, recipe)}.")
    else:
        interval = ("" if pd.isna(named["samples_per_s_ci95_low"]) else
                    f" [{named['samples_per_s_ci95_low']:,.0f}, {named['samples_per_s_ci95_high']:,.0f}]")
        s = (f"Use {setting_words(named, keys)}: {named['samples_per_s']:,.0f}{interval} samples/s {at}, no "
             f"torch DDP baseline measured there to compare with; {projection_words(named, target, recipe)}.")
    if other_recipes:
        s += (f" This run also measured global batch {', '.join(map(str, sorted(other_recipes)))} at {n} "
              f"ranks: `python -m bench advise {run_dir} --global-batch B`.")
    return s

