"""The advice in words: the answer written from advice.csv's rows and nothing else.

Every number in it is a column of advice.csv (tests/test_advise.py reads them back from the file), and every
verdict word is the row's `verdict_vs_baseline` (verdict.py, the one rule), so the answer cannot say what the
table does not. It is a short verdict a user can read aloud, what to do (advice.csv `answer_role`, see
choice.py): "Use …", "Keep torch DDP's defaults …", "Keep … for now: no clear winner …", "No advice against
…"; then short lines, each led by what it is about: the recipe and precision, the baseline, the verdict or
the closest other configuration, the target's expectation, the run's other recipes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from bench import engines, stats
from bench.advise import verdict
from bench.advise.choice import NAMED, could_be_faster, wide
from bench.advise.verdict import speedup_words

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


@dataclass(frozen=True)
class Answer:
    """The answer: `verdict`, one sentence a user can read aloud; `lines`, the rest, each led by what it is
    about ("recipe: …", "baseline: …", "target: …")."""

    verdict: str
    lines: tuple[str, ...] = ()

    def printed(self) -> list[str]:
        """As `bench advise` prints it: the verdict, then each line indented."""
        return [self.verdict, *(f"  {line}" for line in self.lines)]

    def markdown(self) -> str:
        """As advice.md writes it (from_markdown reads it back): the verdict, a blank line, a list."""
        return "\n".join([self.verdict, "", *(f"- {line}" for line in self.lines)])

    def against(self) -> str:
        """What its speedups are against, as its `baseline:` line names it (baseline_name); torch DDP's
        defaults when it has none."""
        line = next((x for x in self.lines if x.startswith("baseline: ") and " = " in x), None)
        return line[len("baseline: "):].split(" = ")[0] if line else baseline_name({})

    @classmethod
    def from_markdown(cls, text: str) -> Answer:
        """The answer of markdown() at the start of `text` (after advice.md's title), up to the first line
        that is neither the verdict nor a list item."""
        body = [line for line in text.splitlines() if line.strip() and not line.startswith("# ")]
        if not body:
            return cls("")
        lines = []
        for line in body[1:]:
            if not line.startswith("- "):
                break
            lines.append(line[2:])
        return cls(body[0], tuple(lines))


def baseline_name(spec: dict) -> str:
    """What the speedups are against, as the answer names it: torch DDP's defaults, or the --baseline."""
    if not spec:
        return "torch DDP's defaults"
    return "the baseline " + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in spec.items())


@dataclass(frozen=True)
class Question:
    """What the answer is asked beside advice.csv's rows: about the run at `run_dir`, at `precision` (one of
    `precisions`, those the recipe was measured at), against the --baseline `spec` (empty: torch DDP's
    defaults), projected to `target`; `keys` tell its configurations apart, `other_recipes` are the run's
    other global batches and `remeasure` the command that would separate configurations too close to call."""

    run_dir: str
    precision: str
    precisions: list[str]
    keys: list[str]
    target: Target
    other_recipes: list[int]
    remeasure: str
    spec: dict = field(default_factory=dict)


def answer(advice: pd.DataFrame, asked: Question) -> Answer:
    """The answer (module docstring) to `asked` from advice.csv's rows: `answer_role` says which rows it
    names."""
    role = advice["answer_role"].fillna("")
    named = advice[role.isin(NAMED)].iloc[0]
    recipe, n = int(named["global_batch"]), int(named["world_size"])
    against = baseline_name(asked.spec)
    at = f"global batch {recipe} at {n} rank{'s' if n > 1 else ''}, {asked.precision}"
    others_at = [p for p in asked.precisions if p != asked.precision]
    recipe_line = f"recipe: {at}" + (
        f" (this run also measured {', '.join(others_at)} here: `--precision "
        f"{others_at[0]}` for {'it' if len(others_at) == 1 else 'another'})" if others_at else "")
    base = advice[advice["baseline"].astype(bool) & (advice["precision"] == asked.precision)]
    base = base.iloc[0] if len(base) else None
    base_line = f"baseline: {against} = {setting_words(base, asked.keys)}" if base is not None else ""
    what = named["answer_role"]
    if what == "use":
        head, lines = _use(advice, named, base, against, asked.keys)
        lines = [recipe_line, base_line, *lines]
    elif what in ("keep", "unclear"):
        head, lines = _keep(advice, named, against, asked)
        lines = [recipe_line, base_line, *lines]
    else:
        head = f"No advice against {against}: it was not measured at {at}."
        interval = ("" if pd.isna(named["samples_per_s_ci95_low"]) else
                    f" [{named['samples_per_s_ci95_low']:,.0f}, {named['samples_per_s_ci95_high']:,.0f}]")
        fastest = (f"fastest measured: {setting_words(named, asked.keys)}, {named['samples_per_s']:,.0f}"
                   f"{interval} samples/s, with nothing beside it to be faster than")
        lines = [recipe_line, fastest,
                 f"to compare: measure {against} at this recipe and precision in the same run"]
    lines.append(f"target: {projection_words(named, asked.target, recipe)}")
    if asked.other_recipes:
        lines.append(f"other recipes: this run also measured global batch "
                     f"{', '.join(map(str, sorted(asked.other_recipes)))} at {n} ranks: "
                     f"`python -m bench advise {asked.run_dir} --global-batch B`")
    return Answer(head, tuple(line for line in lines if line))


def _use(advice: pd.DataFrame, named: pd.Series, base: pd.Series | None, against: str,
         keys: list[str]) -> tuple[str, list[str]]:
    """"Use …": the configuration named faster than the baseline, its verdict and how it was measured, and
    whether others tie with it."""
    head = f"Use {setting_words(named, keys, base)}: {speedup_words(named)} the speed of {against}."
    paired = ("measured side by side with it" if str(named.get("speedup_paired")) in ("True", "1", "1.0")
              else "from the two cells' own intervals (not stepped side by side)")
    lines = [f"verdict: {verdict.words(named, verdict.comparisons(advice))}, {paired}"]
    tied = advice[advice["answer_role"].fillna("") == "tied"]
    if len(tied):
        lines.append(f"tied: {len(tied) + 1} configurations faster than {against} overlap; the simplest "
                     f"is named (advice.csv answer_role)")
    return head, lines


def _keep(advice: pd.DataFrame, named: pd.Series, against: str, asked: Question) -> tuple[str, list[str]]:
    """"Keep …" (nothing measured is faster beyond the noise) or "Keep … for now" (no clear winner: how many
    could still be faster, and what to run to separate them), with the closest other configuration."""
    family = verdict.comparisons(advice)
    contender = advice[advice["answer_role"].fillna("") == "contender"]
    c = contender.iloc[0] if len(contender) else None
    if c is None:
        closest = "closest: nothing else was measured at this recipe and precision"
    elif could_be_faster(c):
        closest = (f"closest: {setting_words(c, asked.keys, named)}, {speedup_words(c)}, "
                   f"{verdict.words(c, family)}")
    else:
        closest = (f"closest: every other configuration's interval lies below 1 (slower); the nearest, "
                   f"{setting_words(c, asked.keys, named)}, is {speedup_words(c)}, "
                   f"{verdict.words(c, family)}")
    if named["answer_role"] == "keep":
        return f"Keep {against}: nothing measured is faster beyond the noise.", [closest]
    others = advice[advice["rank"].notna() & ~advice["baseline"].astype(bool)
                    & (advice["precision"] == asked.precision)]
    unsure = sum(1 for _, r in others.iterrows() if wide(r) and could_be_faster(r))
    return f"Keep {against} for now: no clear winner at {asked.precision}.", [
        f"{closest}; {unsure} of {len(others)} configurations could still be faster: no "
        f"speedup interval, or one wider than ±{stats.UNSTABLE_HALF_WIDTH_PCT:g} %",
        f"to separate them: `{asked.remeasure}`"]
