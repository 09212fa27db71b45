"""The projection against published multi-GPU tables (benchmarks/validate_projection.py; docs/projection.md).

A corpus row is one published training throughput (columns: CORPUS_COLUMNS; tests/data/published_scaling/
README.md). A group is (source_id, model, framework, hardware, precision, per_gpu_batch): its 1-GPU row
gives the compute side, and each of its N-GPU rows is predicted from it alone — never a 1-GPU row of another
source, never a constant chosen per row or per model:

    micro-step  m  = per_gpu_batch · units_per_sample / throughput_1   (the 1-GPU row's grad_accum_1
                     micro-steps each took m: throughput counts all their samples)
    compute        = grad_accum_N micro-steps, backward BACKWARD_SHARE of each, optimizer 0
    buckets        = params · 4 B in torch DDP's layout (first bucket 1 MiB, then 25 MiB, the rest
                     last), gradients arriving uniformly over the last backward
    network        = the preset of the row's hardware and interconnect (NETWORK_RULES)
    step_N         = simulate_step(compute, buckets, network, N, physics)   (bench/project/simulate.py)
    predicted      = N · per_gpu_batch · grad_accum_N · units_per_sample / step_N
    |error|        = |predicted − published| / published

Skipped, each with its reason: rows with `FLAG:` (published data that looks wrong) or `STRONG SCALING` in
their notes or their 1-GPU row's, rows missing a field, and units without a conversion from the source.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.project.network import preset_network
from bench.project.physics import Physics
from bench.project.simulate import Compute, simulate_step
from bench.project.spec import DEFAULT_BACKWARD_SHARE, ddp_buckets

CORPUS_COLUMNS = ("source_id", "model", "params", "framework", "hardware", "interconnect", "precision",
                  "per_gpu_batch", "grad_accum", "gpus", "throughput", "throughput_unit", "notes")
GROUP_KEY = ("source_id", "model", "framework", "hardware", "precision", "per_gpu_batch")

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

# (hardware pattern, interconnect pattern, preset, why): first match wins; patterns re.search, case-blind.
NETWORK_RULES: tuple[tuple[str, str, str, str], ...] = (
    (r"", r"NVLink bridges", "nvlink-bridge", "NVLink-bridged pairs, PCIe gen 3 between pairs (Turing)"),
    (r"DGX-2", r"", "v100-dgx2", "DGX-2: NVSwitch"),
    (r"V100-SXM2", r"", "v100-dgx1", "V100 SXM2 8-GPU board: DGX-1 hybrid cube mesh"),
    (r"B200", r"", "b200-nvlink", "HGX B200: NVLink 5 / NVSwitch"),
    (r"H100-SXM|H200", r"", "h100-nvlink", "HGX H100/H200: NVLink 4 / NVSwitch"),
    (r"A100-SXM", r"", "a100-nvlink", "A100 SXM4: NVLink 3 / NVSwitch"),
    (r"H100-PCIe", r"", "pcie5", "H100 PCIe: PCIe gen 5"),
    (r"V100|RTX 20|Quadro RTX", r"", "pcie3", "Volta/Turing PCIe cards: PCIe gen 3"),
    (r"A100-PCIe|A40|RTX 30|RTX A\d|RTX 40|RTX 6000 Ada", r"", "pcie4",
     "Ampere/Ada PCIe cards: PCIe gen 4"),
)


class Skip(Exception):
    """A row the validation cannot predict: the message is the reason."""


@dataclass(frozen=True)
class Prediction:
    row: pd.Series
    one: pd.Series
    network: str
    units_source: str
    t1_ms: float
    step_ms: float
    predicted: float
    published_eff: float
    predicted_eff: float
    error_pct: float
    dominant: str


def read_corpus(path: Path) -> pd.DataFrame:
    """The corpus CSV; ValueError naming the file and the first missing column."""
    df = pd.read_csv(path)
    for col in CORPUS_COLUMNS:
        if col not in df.columns:
            raise ValueError(f"{path}: column {col!r} missing")
    return df


def units_per_sample(model: str, unit: str) -> tuple[float, str]:
    for pattern, rule_unit, factor, source in CONVERSIONS:
        if unit == rule_unit and re.search(pattern, model):
            return factor, source
    raise Skip(f"no conversion of {unit!r} to samples of the batch for {model!r} in the source")


def network_for(hardware: str, interconnect: str) -> tuple[str, str]:
    for hw, ic, preset, why in NETWORK_RULES:
        if re.search(hw, hardware, re.I) and re.search(ic, str(interconnect), re.I):
            return preset, why
    raise Skip(f"no network preset for hardware {hardware!r} / interconnect {interconnect!r}")


def _int(value, key: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Skip(f"{key}={value!r} is not a number") from None
    if pd.isna(number) or number <= 0 or number != int(number):
        raise Skip(f"{key}={value!r} missing or not a positive integer")
    return int(number)


def _flags(row: pd.Series) -> str | None:
    notes = str(row["notes"]) if not pd.isna(row["notes"]) else ""
    if "FLAG:" in notes:
        return "FLAG: " + notes.split("FLAG:", 1)[1].split(";")[0].strip()
    if "STRONG SCALING" in notes:
        return "STRONG SCALING (global batch fixed; the table's 1-GPU row is another configuration)"
    return None


def predict_row(row: pd.Series, one: pd.Series, physics: Physics) -> Prediction:
    """One N-GPU row from its group's 1-GPU row (module docstring); Skip with the reason."""
    for r, which in ((row, "row"), (one, "1-GPU row")):
        flag = _flags(r)
        if flag:
            raise Skip(flag if which == "row" else f"{which}: {flag}")
    batch = _int(row["per_gpu_batch"], "per_gpu_batch")
    params = _int(row["params"], "params")
    kn = _int(row["grad_accum"], "grad_accum")
    n = _int(row["gpus"], "gpus")
    tput1, tputn = float(one["throughput"]), float(row["throughput"])
    if not (tput1 > 0 and tputn > 0):
        raise Skip("throughput missing")
    if one["throughput_unit"] != row["throughput_unit"]:
        raise Skip(f"unit {row['throughput_unit']!r} differs from the 1-GPU row's {one['throughput_unit']!r}")
    units, units_source = units_per_sample(row["model"], row["throughput_unit"])
    preset, _ = network_for(row["hardware"], row["interconnect"])
    micro_ms = batch * units / tput1 * 1e3  # throughput_1 counts every micro-step's samples
    compute = Compute(forward_ms=kn * micro_ms * (1 - BACKWARD_SHARE),
                      backward_ms=kn * micro_ms * BACKWARD_SHARE,
                      optimizer_ms=0.0, grad_accum=kn, per_rank_batch=batch)
    net = preset_network(preset, gpus_per_node=max(n, 8))
    step = simulate_step(compute, ddp_buckets(params), net, n, "auto", physics)
    predicted = n * batch * kn * units / step.step_ms * 1e3
    return Prediction(row, one, preset, units_source, compute.step_ms, step.step_ms, predicted,
                      tputn / (n * tput1), predicted / (n * tput1),
                      100 * abs(predicted - tputn) / tputn, step.dominant_term)


def validate(corpus: pd.DataFrame, physics: Physics) -> tuple[list[Prediction], list[tuple[pd.Series, str]],
                                                             int]:
    """(predictions, skipped rows with reasons, multi-GPU rows that have a 1-GPU row)."""
    predictions, skipped, eligible = [], [], 0
    key = [c for c in GROUP_KEY]
    for _, group in corpus.groupby(key, sort=False, dropna=False):
        ones = group[group["gpus"] == 1]
        for _, row in group[group["gpus"] > 1].iterrows():
            if len(ones) != 1:
                skipped.append((row, "no 1-GPU row in its group" if ones.empty else
                                f"{len(ones)} 1-GPU rows in its group"))
                continue
            eligible += 1
            try:
                predictions.append(predict_row(row, ones.iloc[0], physics))
            except Skip as exc:
                skipped.append((row, str(exc)))
    return predictions, skipped, eligible


def summary_line(predictions: list[Prediction]) -> str:
    """The validator's last line."""
    errors = [p.error_pct for p in predictions]
    if not errors:
        return "rows 0 · median |error| nan % · worst nan %"
    median, worst = statistics.median(errors), max(errors)
    return f"rows {len(errors)} · median |error| {median:.1f} % · worst {worst:.1f} %"


LAST_LINE = re.compile(r"^rows (\d+) · median \|error\| ([\d.]+|nan) % · worst ([\d.]+|nan) %$")
