"""The projection against published multi-GPU and multi-node tables (benchmarks/validate_projection.py;
docs/projection.md).

A corpus row is one published training throughput (columns: CORPUS_COLUMNS, `nodes` optional; the READMEs
of tests/data/published_scaling/ and published_multinode/). A group is (source_id, model, framework,
hardware, precision) and, unless the row is `STRONG SCALING` (global batch fixed, the per-GPU batch and
accumulation change with N), its per-GPU batch. A row's base is its group's row of one whole node when the
row spans several nodes and the table has one, else the group's smallest row (1 GPU, or one node: base_of);
every larger row is predicted from its base — never a row of another source, never a constant chosen
per row or model:

    step_b     = per_gpu_batch_b · k_b · units / (throughput_b / N_b)      the base's published step (ms)
    micro-step m such that simulate(m, N_b) = step_b                        (m = step_b / k_b at N_b = 1:
                                                                             the base's own communication,
                                                                             straggler and interference
                                                                             are taken out of it)
    compute    = k_N micro-steps of m · batch_N / batch_b, backward BACKWARD_SHARE of each, optimizer 0
    engine     DDP: buckets = params · 4 B in torch DDP's layout (spec.ddp_buckets), simulate_step;
               sharded (FSDP, ZeRO: sharding_of the framework and notes): blocks of the model
               (sharded.estimated_blocks), simulate_sharded
    network    = the row's system (bench/project/systems.py: hardware, interconnect, GPUs, nodes)
    predicted  = N · per_gpu_batch_N · k_N · units / step_N
    |error|    = |predicted − published| / published; efficiency = per-GPU throughput over the base's

Another recipe: a row whose table (the group key less the per-GPU batch) has smaller rows, but none of
its own per-GPU batch, is predicted from the table's base of another recipe (other_recipe_base: its one
whole node for a row on several nodes when there is one, else its smallest size; the nearest batch ×
accumulation at that size), with the same formulas: the compute per sample is the base's (m scales with
the batch, the row's own accumulation is used). Its efficiency is against the linear bound of that
compute, the per-GPU rate batch_b / m (its own base ran another recipe, so the base's rate is not the
row's 100 %), and its interval the wider `other recipe` band (bench/project/interval.py).

Anchored (what a run that measured the world sizes between its base and N has, bench/project/project.py
does the same): when the row's group has rows between the base and the row, the largest of them that is
in the headline is its anchor A, and the model predicts the change from A rather than the level:

    predicted_eff = model_eff(N) · published_eff(A) / model_eff(A)       (the same factor on throughput)

— the model's error at A (a harness's data pipeline, clocks, launcher: none of the model's inputs shows
them) carried to N, at most 100 % (the physical limit: an anchor published above the model does not make
N superlinear). `from_base_eff` keeps the model's own prediction; the validator prints both.

k is the row's grad_accum (empty: 1 — the table states no accumulation — except for STRONG SCALING rows,
whose accumulation must be stated). Rows the validation predicts but leaves out of its headline, each
reported with its reason: FLAG rows whose flag is not about a configuration the group key already
separates (CONFIG_FLAG), and rows faster per GPU than their base by more than SUPERLINEAR (data parallelism
cannot do that; the corpora FLAG the same threshold). Skipped with the reason: rows missing a field, a unit
without a conversion, a group without a single smallest row.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from bench.project.interval import (
    ANCHORED,
    LIMIT_PCT,
    OTHER_RECIPE,
    Band,
    band_name,
    bounds,
    cap_of,
    family_of,
    regime,
    scale_of,
)
from bench.project.physics import Physics
from bench.project.protocol import micro_at
from bench.project.sharded import Sharding, estimated_blocks, simulate_sharded, uniform_blocks
from bench.project.simulate import Compute, simulate_step
from bench.project.spec import DEFAULT_BACKWARD_SHARE, ddp_buckets
from projection_lab.systems import gpus_per_node_of, system_of

CORPUS_COLUMNS = ("source_id", "model", "params", "framework", "hardware", "interconnect", "precision",
                  "per_gpu_batch", "grad_accum", "gpus", "throughput", "throughput_unit", "notes")
NODES = "nodes"   # optional column: nodes as printed
GROUP_KEY = ("source_id", "model", "framework", "hardware", "precision")
STRONG = "STRONG SCALING"
# The corpora's own FLAG threshold for superlinear rows (> 1.05·N: tests/data/published_scaling/README.md)
SUPERLINEAR = 1.05
# A FLAG about a configuration that changes inside a table (micro-batch, per-GPU batch, accumulation): the
# group key keeps per-GPU batches apart and the row's own grad_accum is used, so the row is predicted from
# a base of its own configuration and counted.
CONFIG_FLAG = re.compile(r"micro-batch|per-GPU batch|batch size|grad_accum|accumulation", re.I)
DATA_FLAG = re.compile(r"superlinear|efficiency|contradict|typo|dip", re.I)
BISECTIONS = 40   # halvings of the calibration's bracket: m to 2^-40 of the base's step, far below its noise

# Every source trains with fp32 parameters (AMP keeps fp32 weights and autocasts the math), so DDP
# all-reduces fp32 gradients: 4 bytes per parameter (spec.FP32_GRAD_BYTES); backward is
# spec.DEFAULT_BACKWARD_SHARE of a step, the optimizer 0 (a few ms at most, inside the tables' noise).
BACKWARD_SHARE = DEFAULT_BACKWARD_SHARE

# (model pattern, throughput unit) → (units per sample, where the conversion comes from). A unit that is
# the batch's own is 1. Patterns are matched with re.search on the model name.
CONVERSIONS: tuple[tuple[str, str, float, str], ...] = (
    (r"", "images/s", 1.0, "batch in images"),
    (r"", "sequences/s", 1.0, "batch in sequences"),
    (r"^Transformer-big", "tokens/s", 1.0, "batch in tokens (fairseq --max-tokens; source notes)"),
    (r"^Transformer-XL Base", "tokens/s", 192.0,
     "tgt_len 192 tokens per sequence (DeepLearningExamples Transformer-XL/pytorch/wt103_base.yaml)"),
    (r"^Transformer-XL Large", "tokens/s", 384.0,
     "tgt_len 384 tokens per sequence (DeepLearningExamples Transformer-XL/pytorch/wt103_large.yaml)"),
    (r"^GNMT", "tokens/s", 38.8,
     "an estimate: 66,050 tok/s (source + target) × 264.4 min / 6 epochs on 1 V100 = 174.6 M tokens per "
     "epoch (DeepLearningExamples GNMT README, pytorch-19.01 tables; time includes evaluation, so an upper "
     "bound) over WMT16 en-de's 4.5 M training pairs (statmt.org WMT16) = 38.8 tokens per sentence pair"),
    (r"^Tacotron2", "mel-frames/s", 566.2,
     "LJSpeech mean utterance: 23:55:17 over 13,100 clips at 22,050 Hz (LJ-Speech-Dataset README), "
     "hop 256 (DeepLearningExamples Tacotron2 --hop-length) = 566.2 mel frames"),
    (r"^Tacotron2", "items/s (mel frames)", 566.2, "as Tacotron2 mel-frames/s"),
    (r"^WaveGlow", "audio samples/s", 16000.0,
     "--segment-length 16000 audio samples per item (DeepLearningExamples Tacotron2/waveglow/arg_parser.py)"),
    (r"^WaveGlow", "samples/s", 16000.0,
     "Lambda's WaveGlow samples/s are audio samples (≈47k/s at batch 8 on a V100); segment 16000"),
)
# A unit that counts the batch's own samples, for any model (after CONVERSIONS' model-specific rules: a
# WaveGlow "samples/s" is audio samples).
BATCH_UNITS = re.compile(r"^(images?|img|sequences?|seqs?|samples?|sentences?|utterances?|items?)\s*"
                         r"(/\s*s|/\s*sec|per second)$", re.I)
# Units of optimizer steps, where a table prints the step time or the step rate instead of a throughput:
# every GPU runs per_gpu_batch × grad_accum samples per step (per_gpu)
STEP_TIME = re.compile(r"^(ms|s|sec|seconds?|min|minutes?)\s*(?:/|per)\s*(?:step|iter(?:ation)?|it|batch)$",
                       re.I)
STEP_TIME_SECONDS = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "min": 60.0,
                     "minute": 60.0, "minutes": 60.0}
STEP_RATE = re.compile(r"^(?:steps?|iter(?:ation)?s?|it|updates?|ups|batch(?:es)?)"
                       r"\s*(?:/\s*s(?:ec)?|per second)$", re.I)
PER_GPU_UNIT = re.compile(r"\s*(?:/|per )\s*GPU\b", re.I)
# A sequence length the model name or the notes state ("seq2048", "seq len 2048", "sequence length 1024",
# "seq_len=8192"): tokens per sequence for a tokens/s unit.
SEQ_LENGTH = re.compile(r"\bseq(?:uence)?[ _-]?(?:len(?:gth)?)?[ _=:-]*(\d{2,6})\b", re.I)
# Spellings of one unit: (pattern, the CONVERSIONS spelling); "wps" is torchtitan's words (tokens) per second.
UNIT_SPELLINGS = ((r"\s*/\s*sec(?:ond)?\b|\s+per\s+second\b", "/s"), (r"^tok/s$|^wps$|^tps$", "tokens/s"),
                  (r"^img/s$", "images/s"), (r"^seqs?/s$", "sequences/s"))

# Sharded engines in the framework and notes text: (pattern, mode, why). First match wins; FSDP without a
# stated strategy is FULL_SHARD, FSDP's default ShardingStrategy (torch.distributed.fsdp docs).
SHARDING_RULES: tuple[tuple[str, str, str], ...] = (
    (r"NO_SHARD", "", "NO_SHARD: DDP's all-reduce"),
    (r"HYBRID_SHARD", "hybrid", "HYBRID_SHARD"),
    (r"SHARD_GRAD_OP", "grad_op", "SHARD_GRAD_OP"),
    (r"FULL_SHARD|ZeRO[- ]?3|stage[ -]?3", "full", "FULL_SHARD / ZeRO-3"),
    (r"reshard_after_forward\W+(?:False|0)", "grad_op", "FSDP2 reshard_after_forward=False"),
    (r"fully_shard|FSDP2", "full", "FSDP2 fully_shard (reshard_after_forward=True, its default)"),
    (r"ZeRO[- ]?2|stage[ -]?2|distributed optimi[sz]er", "zero2", "ZeRO-2 / distributed optimizer"),
    (r"ZeRO[- ]?1|stage[ -]?1", "zero1", "ZeRO-1"),
    (r"FSDP", "full", "FSDP without a stated strategy: FULL_SHARD, its default"),
)
LOW_PRECISION = re.compile(r"bf16|fp16|half|amp|mixed", re.I)
REDUCE_FP32 = re.compile(r"MP mode DEFAULT|MP mode FULL|reduce[_ ]dtype\W+(?:fp32|float32)", re.I)
PARAMS_FP32 = re.compile(r"MP mode FULL|param[_ ]dtype\W+(?:fp32|float32)", re.I)


class Skip(Exception):
    """A row the validation cannot predict: the message is the reason."""


@dataclass(frozen=True)
class Prediction:
    row: pd.Series
    base: pd.Series
    network: str           # the system, in words
    regime: str            # interval.REGIMES
    units_source: str
    t1_ms: float           # the base's calibrated compute per step, at the row's batch and accumulation
    step_ms: float
    predicted: float
    published_eff: float
    predicted_eff: float
    error_pct: float
    dominant: str
    held_out: str = ""     # why the row is predicted but not in the headline ("" when it is)
    anchor_gpus: int | None = None        # the anchor's GPUs (None: predicted from the base alone)
    from_base_eff: float | None = None    # the model's efficiency from the base alone (None: predicted_eff)
    from_base_error_pct: float | None = None
    other_recipe: bool = False            # the base is of another per-GPU batch or accumulation

    @property
    def basis(self) -> str:
        """The interval's basis (interval.BASES): anchored, from a base of another recipe, or from the base
        alone."""
        return ANCHORED if self.anchor_gpus is not None else OTHER_RECIPE if self.other_recipe else ""

    @property
    def band(self) -> str:
        """The name of the interval band the prediction takes (interval.band_name)."""
        return band_name(self.regime, self.basis)


def read_corpus(path: Path) -> pd.DataFrame:
    """The corpus CSV; ValueError naming the file and the first missing column."""
    df = pd.read_csv(path)
    for col in CORPUS_COLUMNS:
        if col not in df.columns:
            raise ValueError(f"{path}: column {col!r} missing")
    return df


def _text(value) -> str:
    return "" if pd.isna(value) else str(value)


def normalized_unit(unit: str) -> str:
    """The unit without a per-GPU suffix, in CONVERSIONS' spelling (UNIT_SPELLINGS)."""
    unit = PER_GPU_UNIT.sub("", unit).strip()
    for pattern, spelling in UNIT_SPELLINGS:
        unit = re.sub(pattern, spelling, unit, flags=re.I)
    return unit


def units_per_sample(model: str, unit: str, notes: str = "") -> tuple[float, str]:
    """(units of `unit` per sample of the batch, source) for a model's throughput unit (a per-GPU unit
    converts as its aggregate); tokens/s needs a sequence length, from the model name or the notes."""
    unit = normalized_unit(unit)
    for pattern, rule_unit, factor, source in CONVERSIONS:
        if unit == rule_unit and re.search(pattern, model):
            return factor, source
    for where, text in (("model name", model), ("notes", notes)):
        if unit == "tokens/s" and (m := SEQ_LENGTH.search(text)):
            return float(m.group(1)), f"sequence length {m.group(1)} stated in the {where}"
    if BATCH_UNITS.match(unit):
        return 1.0, "batch in its own unit"
    if STEP_TIME.match(unit) or STEP_RATE.match(unit):
        return 1.0, "optimizer steps: per_gpu_batch × grad_accum samples per GPU each"
    raise Skip(f"no conversion of {unit!r} to samples of the batch for {model!r} in the source")


def per_gpu(row: pd.Series, units: float) -> float:
    """Samples per second per GPU: the table's aggregate over its GPUs, unless its unit says per GPU; a
    unit of steps (STEP_TIME, STEP_RATE) is the row's per-GPU batch × accumulation per step."""
    unit = _text(row["throughput_unit"]).strip()
    value = float(row["throughput"])
    if (m := STEP_TIME.match(unit)) or STEP_RATE.match(unit):
        per_step = float(row["per_gpu_batch"]) * accumulation(row)[0]
        if m:
            return per_step / (value * STEP_TIME_SECONDS[m.group(1).lower()])
        return per_step * value
    tput = value / units
    return tput if PER_GPU_UNIT.search(unit) else tput / int(row["gpus"])


def _int(value, key: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Skip(f"{key}={value!r} is not a number") from None
    if pd.isna(number) or number <= 0 or number != int(number):
        raise Skip(f"{key}={value!r} missing or not a positive integer")
    return int(number)


def flags_of(row: pd.Series) -> list[str]:
    """The row's FLAG notes, each one sentence."""
    return ["FLAG: " + part.split(";")[0].strip() for part in _text(row["notes"]).split("FLAG:")[1:]]


def data_flags(row: pd.Series) -> list[str]:
    """FLAGs that say the published number itself looks wrong (not a configuration change the group key
    already separates: CONFIG_FLAG)."""
    return [f for f in flags_of(row) if DATA_FLAG.search(f) or not CONFIG_FLAG.search(f)]


def is_strong(row: pd.Series) -> bool:
    return STRONG in _text(row["notes"])


def table_key(row: pd.Series) -> tuple:
    """GROUP_KEY, and whether the row is strong scaling: the rows a base of another recipe may come from."""
    return tuple(_text(row[c]) for c in GROUP_KEY) + (("strong",) if is_strong(row) else ())


def group_key(row: pd.Series) -> tuple:
    """table_key plus the per-GPU batch unless the row is strong scaling (module docstring)."""
    return table_key(row) + (() if is_strong(row) else (_text(row["per_gpu_batch"]),))


def accumulation(row: pd.Series) -> tuple[int, str]:
    """(micro-steps per all-reduce, how known): the stated grad_accum, else 1 unless strong scaling."""
    if pd.isna(row["grad_accum"]) or _text(row["grad_accum"]) == "":
        if is_strong(row):
            raise Skip("grad_accum missing on a STRONG SCALING row (its accumulation changes with N)")
        return 1, "not stated: 1"
    return _int(row["grad_accum"], "grad_accum"), "stated"


def sharding_of(row: pd.Series) -> tuple[Sharding | None, str]:
    """(how a sharded engine communicates, why) from the framework and notes; None: DDP's all-reduce.
    Parameters are all-gathered in the low precision a bf16/fp16 row computes in (the mixed-precision
    policy's param_dtype) and reduced in it (FSDP's reduce_dtype defaults to param_dtype), unless the text
    states fp32 (Composer's MP mode DEFAULT reduces in fp32, FULL keeps everything fp32)."""
    text = f"{_text(row['framework'])}; {_text(row['notes'])}"
    for pattern, mode, why in SHARDING_RULES:
        if re.search(pattern, text, re.I):
            if not mode:
                return None, why
            low = bool(LOW_PRECISION.search(_text(row["precision"])))
            params = 4 if PARAMS_FP32.search(text) or not low else 2
            grads = 4 if REDUCE_FP32.search(text) or params == 4 else 2
            no_sync = re.search(r"no_sync|requires_gradient_sync", text, re.I)
            return Sharding(mode, params, grads, reduce_every_micro_step=not no_sync), why
    return None, "data parallel (all-reduce)"


def _compute(micro_ms: float, k: int, batch: int) -> Compute:
    return Compute(forward_ms=k * micro_ms * (1 - BACKWARD_SHARE), backward_ms=k * micro_ms * BACKWARD_SHARE,
                   optimizer_ms=0.0, grad_accum=k, per_rank_batch=batch)


def _simulate(compute: Compute, params: int, sharding: Sharding | None, net, n: int, physics: Physics):
    if sharding is None:
        return simulate_step(compute, ddp_buckets(params), net, n, "auto", physics)
    blocks = uniform_blocks(params, estimated_blocks(params))
    return simulate_sharded(compute, blocks, sharding, net, n, physics)


def calibrate(step_ms: float, k: int, batch: int, params: int, sharding, net, n: int,
              physics: Physics) -> float:
    """The micro-step compute m whose simulated step on n ranks is `step_ms` (bisection: the step grows
    with m); Skip when even m → 0 would be slower (the modelled communication alone exceeds the step)."""
    if n == 1:
        return step_ms / k
    lo, hi = 0.0, step_ms / k
    if _simulate(_compute(hi * 1e-9, k, batch), params, sharding, net, n, physics).step_ms > step_ms:
        raise Skip(f"the base's published step ({step_ms:.1f} ms) is shorter than its modelled "
                   f"communication on {n} GPUs")
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if _simulate(_compute(mid, k, batch), params, sharding, net, n, physics).step_ms > step_ms:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def calibrated_micro(base: pd.Series, physics: Physics) -> float:
    """The base row's micro-step compute (ms): its published step with its own modelled communication,
    straggler and interference taken out (calibrate, on the base's own system)."""
    n, batch = _int(base["gpus"], "gpus"), _int(base["per_gpu_batch"], "per_gpu_batch")
    k, _ = accumulation(base)
    units, _ = units_per_sample(_text(base["model"]), _text(base["throughput_unit"]), _text(base["notes"]))
    system = system_of(_text(base["hardware"]), base["interconnect"], n, base.get(NODES), NODES in base.index)
    sharding, _ = sharding_of(base)
    step = batch * k / per_gpu(base, units) * 1e3
    return calibrate(step, k, batch, _int(base["params"], "params"), sharding, system.network(), n, physics)


def predict_row(row: pd.Series, base: pd.Series, physics: Physics, other_recipe: bool = False,
                fixed_ms: float = 0.0) -> Prediction:
    """One row from its group's base (module docstring), or with `other_recipe` from its table's base of
    another batch or accumulation (efficiency then against that base's linear bound); Skip with the
    reason. `fixed_ms`: the micro-step's fixed cost (bench/project/protocol.py), which does not shrink with
    the per-GPU batch."""
    params = _int(row["params"], "params")
    n, nb = _int(row["gpus"], "gpus"), _int(base["gpus"], "gpus")
    batch, batch_b = _int(row["per_gpu_batch"], "per_gpu_batch"), _int(base["per_gpu_batch"], "per_gpu_batch")
    k, _ = accumulation(row)
    kb, _ = accumulation(base)
    if not (float(base["throughput"]) > 0 and float(row["throughput"]) > 0):
        raise Skip("throughput missing")
    if _text(base["throughput_unit"]) != _text(row["throughput_unit"]):
        raise Skip(f"unit {row['throughput_unit']!r} differs from the base's {base['throughput_unit']!r}")
    units, units_source = units_per_sample(_text(row["model"]), _text(row["throughput_unit"]),
                                           _text(row["notes"]))
    system = system_of(_text(row["hardware"]), row["interconnect"], n, row.get(NODES), NODES in row.index)
    net = system.network()
    try:
        net.nodes(nb)
        row_nodes = net.nodes(n)
    except ValueError as exc:
        raise Skip(str(exc)) from None
    sharding, _ = sharding_of(row)
    base_rate, row_rate = per_gpu(base, units), per_gpu(row, units)   # samples/s per GPU
    step_b = batch_b * kb / base_rate * 1e3
    micro_b = calibrate(step_b, kb, batch_b, params, sharding, net, nb, physics)
    compute = _compute(micro_at(micro_b, batch_b, batch, fixed_ms), k, batch)
    step = _simulate(compute, params, sharding, net, n, physics)
    predicted_rate = batch * k / step.step_ms * 1e3
    # 100 %: the base's per-GPU rate; from another recipe, the linear bound of the base's compute
    reference = batch_b / micro_b * 1e3 if other_recipe else base_rate
    held_out = "; ".join(data_flags(row))
    if not held_out and row_rate > SUPERLINEAR * reference:
        what = "the linear bound of its base's compute" if other_recipe else "its base's per-GPU throughput"
        held_out = (f"published {row_rate / reference:.2f}× {what}: superlinear beyond {SUPERLINEAR} "
                    "(contradicts the base)")
    name = regime(sharding is not None, row_nodes, system.intra)
    return Prediction(row, base, system.words, name, units_source, compute.step_ms, step.step_ms,
                      predicted_rate * n * units, row_rate / reference, predicted_rate / reference,
                      100 * abs(predicted_rate - row_rate) / row_rate, step.dominant_term, held_out,
                      other_recipe=other_recipe)


def anchored(p: Prediction, anchor: Prediction) -> Prediction:
    """p predicted as the change from its anchor (module docstring): its efficiency and throughput times
    the anchor's published over predicted efficiency."""
    # at most the physical limit: an anchor published above the model (up to the corpora's 5 % of noise
    # above linear) does not make N faster than linear
    ratio = min(anchor.published_eff / anchor.predicted_eff, 1.0 / p.predicted_eff)
    eff = p.predicted_eff * ratio
    # both efficiencies are per-GPU rates over the base's: their ratio is the throughputs' (in any unit)
    return replace(p, predicted=p.predicted * ratio, predicted_eff=eff,
                   error_pct=100 * abs(eff - p.published_eff) / p.published_eff,
                   anchor_gpus=int(anchor.row["gpus"]), from_base_eff=p.predicted_eff,
                   from_base_error_pct=p.error_pct)


def unanchored(p: Prediction) -> Prediction:
    """p as the model predicts it from its base alone (itself when it has no anchor)."""
    if p.anchor_gpus is None:
        return p
    ratio = p.predicted_eff / p.from_base_eff
    return replace(p, predicted=p.predicted / ratio, predicted_eff=p.from_base_eff,
                   error_pct=p.from_base_error_pct, anchor_gpus=None, from_base_eff=None,
                   from_base_error_pct=None)


def anchor_all(predictions: list[Prediction]) -> list[Prediction]:
    """Every prediction of one table anchored to the largest headline prediction of the same base and the
    same recipe between the base and it, when there is one (module docstring)."""
    out = []
    for p in predictions:
        n = int(p.row["gpus"])
        below = [q for q in predictions if not q.held_out and q.base.name == p.base.name
                 and group_key(q.row) == group_key(p.row) and int(q.row["gpus"]) < n]
        out.append(anchored(p, max(below, key=lambda q: int(q.row["gpus"]))) if below else p)
    return out


def _per_node(row: pd.Series) -> int:
    return gpus_per_node_of(int(row["gpus"]), row.get(NODES), _text(row["hardware"]), NODES in row.index)


def base_of(group: pd.DataFrame, row: pd.Series) -> tuple[pd.Series | None, str]:
    """The row's base in its group: for a row on several nodes, the group's row of one whole node when the
    table has one (what a user measures before asking "what will 64 GPUs do?": everything a node shares,
    its data pipeline among them, is in it); else the group's smallest row. None and why when several rows
    are at that size."""
    size = int(group["gpus"].min())
    g = _per_node(row)
    if int(row["gpus"]) > g and (group["gpus"] == g).any():
        size = g
    at = group[group["gpus"] == size]
    if len(at) != 1:
        return None, f"{len(at)} rows at the base's size ({size} GPUs) in its group"
    return at.iloc[0], ""


def _recipe(row: pd.Series) -> float:
    """ln(per-GPU batch × accumulation): how far two recipes are apart (other_recipe_base)."""
    try:
        return math.log(float(row["per_gpu_batch"]) * accumulation(row)[0])
    except (Skip, TypeError, ValueError):
        return math.inf


def other_recipe_base(table: pd.DataFrame, row: pd.Series) -> pd.Series:
    """The row's base in its table when none of the table's smaller rows has its recipe: as base_of picks
    the size (one whole node for a row on several nodes when the table has one, else the smallest), and
    at that size the row whose per-GPU batch × accumulation is nearest the row's (the first on a tie)."""
    smaller = table[table["gpus"] < int(row["gpus"])]
    size = int(smaller["gpus"].min())
    g = _per_node(row)
    if int(row["gpus"]) > g and (smaller["gpus"] == g).any():
        size = g
    at = smaller[smaller["gpus"] == size]
    want = _recipe(row)
    return min((r for _, r in at.iterrows()), key=lambda r: abs(_recipe(r) - want))


def without_base(corpus: pd.DataFrame) -> list[tuple[pd.Series, str]]:
    """The rows no other row of their table is smaller than (each table's smallest size), with why: what
    every other row is predicted from, themselves predicted from nothing."""
    corpus = corpus.copy()
    corpus["gpus"] = pd.to_numeric(corpus["gpus"], errors="coerce")
    out = []
    for _, table in corpus.groupby(corpus.apply(table_key, axis=1), sort=False):
        at = table[table["gpus"] == table["gpus"].min()]
        why = (f"the smallest size of its table ({int(table['gpus'].min())} GPUs): nothing smaller to "
               "predict it from" + (f", {len(at)} rows there" if len(at) > 1 else ""))
        out += [(row, why) for _, row in at.iterrows()]
    return out


def validate(corpus: pd.DataFrame, physics: Physics, anchor: bool = False
             ) -> tuple[list[Prediction], list[tuple[pd.Series, str]], int]:
    """(predictions, skipped rows with reasons, rows that have a base): every row above its table's smallest
    size, from its base (base_of on its own recipe's rows; other_recipe_base when none of them is smaller)
    — the question a user with one node's measurement asks — and with `anchor`, anchored where the group
    has a row between (anchor_all: what a run that measured those sizes knows). A base that is itself
    data-FLAGged makes its rows held out (predicted, reported apart)."""
    predictions, skipped, eligible = [], [], 0
    corpus = corpus.copy()
    corpus["gpus"] = pd.to_numeric(corpus["gpus"], errors="coerce")
    corpus["_recipe"] = corpus.apply(group_key, axis=1)
    for _, table in corpus.groupby(corpus.apply(table_key, axis=1), sort=False):
        mine = []
        for _, row in table[table["gpus"] > table["gpus"].min()].iterrows():
            group = table[[key == row["_recipe"] for key in table["_recipe"]]]   # tuples, not list-likes
            other = not (group["gpus"] < row["gpus"]).any()
            base, why = (other_recipe_base(table, row), "") if other else base_of(group, row)
            if base is None:
                skipped.append((row, why))
                continue
            eligible += 1
            try:
                p = predict_row(row, base, physics, other_recipe=other)
            except Skip as exc:
                skipped.append((row, str(exc)))
                continue
            base_flags = data_flags(base)
            if base_flags and not p.held_out:
                p = replace(p, held_out=f"base row: {'; '.join(base_flags)}")
            mine.append(p)
        predictions += anchor_all(mine) if anchor else mine
    return predictions, skipped, eligible


@dataclass(frozen=True)
class Scored:
    """A prediction with its 90 % interval (bench/project/interval.py): the band it was given and whether
    the published value fell inside."""

    prediction: Prediction
    band: Band
    inside: bool
    width_points: float


def residual(p: Prediction) -> float:
    """ln(published / predicted): the model error the interval's bands are fitted to."""
    return math.log(p.published_eff / p.predicted_eff)


def bases_of(p: Prediction) -> list[tuple[str, float, float, float]]:
    """(band, residual, cap, scale: interval.Residual) of a prediction on every basis it has: from its base
    alone always (its from-base efficiency when anchored; the other-recipe band when the base is of another
    recipe), and anchored when it is. Every row thus trains the from-base band of its regime, whatever its
    size: a projection from one node to 64 nodes with nothing measured between is judged by the errors of
    every such prediction, not only of the first size above a base."""
    first = p.from_base_eff or p.predicted_eff
    basis = OTHER_RECIPE if p.other_recipe else ""
    out = [(band_name(p.regime, basis), math.log(p.published_eff / first), cap_of(first),
            scale_of(basis, first, p.regime))]
    if p.anchor_gpus is not None:
        out.append((p.band, residual(p), cap_of(p.predicted_eff), scale_of(p.basis, p.predicted_eff,
                                                                            p.regime)))
    return out


def assumed(p: Prediction) -> tuple[str, ...]:
    """What the prediction took as assumed rather than measured, the reasons its interval is as wide as it
    is: `1-GPU base` (nothing the base measured ran more than one GPU: DDP, the launcher, a node's shared
    data pipeline, all-GPU clocks never seen), `fabric assumed` (the table does not state its
    interconnect: a reference configuration's), `accumulation assumed` (none stated: 1), `other recipe`
    (a base of another batch or accumulation)."""
    out = []
    if int(p.base["gpus"]) == 1:
        out.append("1-GPU base")
    if "not stated" in _text(p.row["interconnect"]).lower():
        out.append("fabric assumed")
    if _text(p.row["grad_accum"]) == "":
        out.append("accumulation assumed")
    if p.other_recipe:
        out.append("other recipe")
    return tuple(out)


def scale(p: Prediction) -> float:
    """The unit of the prediction's residual on its basis (interval.scale_of)."""
    return scale_of(p.basis, p.predicted_eff, p.regime)


def interval_pct(p: Prediction, band: Band) -> tuple[float, float]:
    """The prediction's 90 % interval on efficiency (%), clamped at the limit (interval.bounds)."""
    return bounds(100 * p.predicted_eff, band, 0.0, LIMIT_PCT, scale(p))


def score(predictions: list[Prediction], bands: dict, held_out: dict, unit: str = "source") -> list[Scored]:
    """Each prediction with its band: fitted without its own source (`unit` "family": its model family,
    interval.family_of) when that is among the training rows (`held_out`: source or family → bands,
    interval.held_out_bands), else `bands` (the training corpora's)."""
    out = []
    for p in predictions:
        key = _text(p.row["source_id"]) if unit == "source" else family_of(_text(p.row["model"]))
        chosen = held_out.get(key, bands)[p.band]
        out.append(Scored(p, chosen, chosen.contains(residual(p), cap_of(p.predicted_eff), scale(p)),
                          chosen.width_points(100 * p.predicted_eff, scale(p))))
    return out


def _quantile(xs: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def stats_of(scored: list[Scored]) -> dict:
    """rows, mean, median, p90 and worst |error| %, % inside the interval, median width (points)."""
    return stats_from([s.prediction.error_pct for s in scored], [s.inside for s in scored],
                      [s.width_points for s in scored])


def stats_from(errors: list[float], inside: list[bool], widths: list[float]) -> dict:
    """stats_of from the rows' |error| %, inside flags and widths."""
    if not errors:
        return dict(rows=0, mean=float("nan"), median=float("nan"), p90=float("nan"), worst=float("nan"),
                    inside=float("nan"), width=float("nan"))
    return dict(rows=len(errors), mean=sum(errors) / len(errors), median=_quantile(errors, 0.5),
                p90=_quantile(errors, 0.9), worst=max(errors),
                inside=100 * sum(inside) / len(inside), width=_quantile(widths, 0.5))


def summary_line(scored: list[Scored]) -> str:
    """The validator's last line (the issue's format)."""
    return line_of(stats_of(scored))


def line_of(s: dict) -> str:
    """The agreed line from stats_from's dict."""
    return (f"rows {s['rows']} · mean |error| {s['mean']:.1f} % · median |error| {s['median']:.1f} % · "
            f"p90 {s['p90']:.1f} % · worst {s['worst']:.1f} % · inside 90 % interval {s['inside']:.1f} % · "
            f"median width {s['width']:.1f} points")


_NUM = r"([\d.]+|nan)"
LAST_LINE = re.compile(rf"^rows (\d+) · mean \|error\| {_NUM} % · median \|error\| {_NUM} % · p90 {_NUM} % · "
                       rf"worst {_NUM} % · inside 90 % interval {_NUM} % · median width {_NUM} points$")
