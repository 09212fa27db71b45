"""Findings respect the intervals: a winner is named only when the intervals separate it (issue: a report
must never present noise as a difference). Hand-built rows, expected sentences worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.report import findings


def rows(speed: dict[str, tuple[float, float, float]], steps: dict[str, tuple[float, float, float]]):
    """One world size (2), one setting; per engine its (p50, ci low, ci high) step time and, for non-torch
    engines, (speed_vs_torch, low, high)."""
    out = []
    for engine, (p50, low, high) in steps.items():
        ratio = speed.get(engine, (None, None, None))
        out.append({
            "cell_id": f"{engine}-x", "status": "ok", "error": "", "engine": engine, "model": "mlp",
            "model_size": "tiny", "world_size": 2, "bucket_cap_mb": None if engine == "naive" else 25.0,
            "precision": "fp32", "comm_dtype": "none", "grad_accum": 1, "scaling": "strong",
            "per_rank_batch": 8, "global_batch": 16, "step_time_ms_p50": p50, "step_time_ms_ci95_low": low,
            "step_time_ms_ci95_high": high, "samples_per_s": 16 / p50 * 1e3, "speed_vs_torch": ratio[0],
            "speed_vs_torch_ci95_low": ratio[1], "speed_vs_torch_ci95_high": ratio[2],
        })
    return pd.DataFrame(out)


def test_overlapping_intervals_name_no_winner_and_say_within_noise():
    df = rows({"overlap": (1.02, 0.97, 1.06)}, {"torch": (10.0, 9.5, 10.6), "overlap": (9.8, 9.3, 10.4)})
    (sentence,) = findings.engines_per_world_size(df)
    assert "no engine is fastest beyond the noise" in sentence
    assert "overlap within noise (±6.0 %)" in sentence and "faster" not in sentence


def test_a_separated_engine_is_named_with_its_interval():
    # ratio 1.25 (CI 1.20–1.31): faster by 25.0 % (95 % CI 20.0–31.0 %); its step interval 7.8–8.2 ms lies
    # below torch's 9.8–10.3 ms
    df = rows({"overlap": (1.25, 1.20, 1.31)}, {"torch": (10.0, 9.8, 10.3), "overlap": (8.0, 7.8, 8.2)})
    (sentence,) = findings.engines_per_world_size(df)
    assert sentence.startswith("At 2 ranks, overlap is fastest (2,000 samples/s")
    assert "overlap faster by 25.0 % (95 % CI 20.0–31.0 %)" in sentence


def test_slower_says_by_how_much_with_the_interval():
    df = rows({"naive": (0.8, 0.75, 0.9)}, {"torch": (10.0, 9.8, 10.3), "naive": (12.5, 12.0, 13.0)})
    (sentence,) = findings.engines_per_world_size(df)
    assert "naive slower by 20.0 % (95 % CI 10.0–25.0 %)" in sentence


def test_unstable_cells_are_listed():
    df = rows({}, {"torch": (10.0, 8.0, 12.5)})  # half-width 2.25 ms = 22.5 % of the median
    (sentence,) = findings.unstable_cells(df)
    assert sentence.startswith("1 of 1 cells are unstable") and "torch-x" in sentence


def _merged(a: tuple[float, float, float], b: tuple[float, float, float], status_b: str = "ok"):
    return pd.DataFrame({"status_a": ["ok"], "status_b": [status_b],
                         "step_time_ms_p50_a": [a[0]], "step_time_ms_ci95_low_a": [a[1]],
                         "step_time_ms_ci95_high_a": [a[2]], "step_time_ms_p50_b": [b[0]],
                         "step_time_ms_ci95_low_b": [b[1]], "step_time_ms_ci95_high_b": [b[2]]})


def test_compare_ratio_interval_from_both_sides():
    import math

    from bench import stats
    from bench.report.compare import ratio_interval

    # a: 10 ms (9–11), b: 8 ms (7.5–8.5) → r = a/b = 1.25; on the log scale down = √(ln(10/9)² + ln(8.5/8)²)
    # = √(0.10536² + 0.06062²) = 0.12155, up = √(ln(11/10)² + ln(8/7.5)²) = √(0.09531² + 0.06454²) = 0.11511
    low, high = ratio_interval(_merged((10.0, 9.0, 11.0), (8.0, 7.5, 8.5)))
    assert low[0] == pytest.approx(1.25 * math.exp(-0.12155), rel=1e-4)
    assert high[0] == pytest.approx(1.25 * math.exp(0.11511), rel=1e-4)
    assert stats.verdict(low[0], high[0]) == "faster"
    low, high = ratio_interval(_merged((10.0, 9.0, 11.0), (8.0, 7.5, 8.5), status_b="failed"))
    assert pd.isna(low[0]) and pd.isna(high[0])  # a side that is not ok has no interval


def test_compare_cells_measured_to_different_precisions():
    from bench import stats
    from bench.report.compare import ratio_interval

    # a precise cell (±0.5 %) against a noisy one (±8 %): the interval is the noisy side's, barely wider
    # (√(0.5² + 8²) ≈ 8.02 % on the log scale), not the sum of both (8.5 %)
    low, high = ratio_interval(_merged((10.0, 9.95, 10.05), (10.0, 9.2, 10.8)))
    assert high[0] == pytest.approx(math.exp(math.hypot(math.log(10.05 / 10), math.log(10 / 9.2))))
    assert stats.verdict(low[0], high[0]) == "within noise"
    # two cells each measured to ±3 %, 5.3 % apart: down = √(ln(10/9.7)² + ln(9.785/9.5)²) = 0.04245, so
    # low = 1.05263 · e^−0.04245 = 1.0089 > 1: resolved; the extremes a_low / b_high = 9.7 / 9.785 = 0.991
    # (the bound this replaced) would have said within noise
    low, high = ratio_interval(_merged((10.0, 9.7, 10.3), (9.5, 9.215, 9.785)))
    assert low[0] == pytest.approx(1.0089, abs=1e-4) and stats.verdict(low[0], high[0]) == "faster"
    # the same 5 % between a ±2 % cell and a ±6 % one is not resolved: the noisier side decides
    low, high = ratio_interval(_merged((10.0, 9.8, 10.2), (9.5, 8.93, 10.07)))
    assert stats.verdict(low[0], high[0]) == "within noise"


def test_fp16_cells_that_skipped_timed_steps_are_flagged():
    import pandas as pd

    df = pd.DataFrame([
        {"cell_id": "torch-a-fp16", "status": "ok", "skipped_timed_steps": 2.0},
        {"cell_id": "torch-b-fp16", "status": "ok", "skipped_timed_steps": 0.0},
        {"cell_id": "torch-c-bf16", "status": "ok", "skipped_timed_steps": None},
    ])
    (sentence,) = findings.skipped_optimizer_steps(df)
    assert sentence.startswith("1 fp16 cell skipped optimizer steps inside the timed window")
    assert "torch-a-fp16 (2)" in sentence and "torch-b" not in sentence
    assert findings.skipped_optimizer_steps(df.assign(skipped_timed_steps=0.0)) == []


def test_findings_agree_with_the_verdicts_and_the_breakdown_they_follow():
    # Known verdicts at 2 ranks: bucketed and overlap faster than torch (whole interval above 1), naive
    # within noise; the step-time intervals all overlap, so no engine is "fastest" either.
    df = rows({"bucketed": (1.03, 1.01, 1.05), "overlap": (1.05, 1.01, 1.09), "naive": (1.0, 0.95, 1.05)},
              {"torch": (10.0, 9.0, 11.0), "bucketed": (9.7, 8.8, 10.6), "overlap": (9.5, 8.7, 10.5),
               "naive": (10.0, 9.1, 10.9)})
    (sentence,) = findings.engines_per_world_size(df)
    assert sentence.startswith("At 2 ranks, bucketed and overlap are faster than torch DDP beyond the noise, "
                               "yet no engine is fastest")
    assert "bucketed faster by 3.0 %" in sentence and "overlap faster by 5.0 %" in sentence
    assert "naive within noise" in sentence and "no engine is fastest beyond the noise" not in sentence


def test_every_efficiency_drop_splits_its_loss_by_the_same_column():
    # strong scaling, global batch 16. torch: 100 → 80 ms at 2 ranks, ideal 50, 30 ms lost, 20 of them
    # exposed communication. overlap: 100 → 70 ms, 20 ms lost, 8 exposed: compute dominates its loss.
    from report_fixtures import row

    from bench.report import tables
    from bench.run_folder import normalise

    df = normalise(pd.DataFrame([
        row("torch", 1, 100.0, compute_only_ms=100.0, global_batch=16),
        row("torch", 2, 80.0, compute_only_ms=60.0, global_batch=16),
        row("overlap", 1, 100.0, compute_only_ms=100.0, global_batch=16),
        row("overlap", 2, 70.0, compute_only_ms=62.0, global_batch=16),
    ]).replace("", None), "fixture")
    sentences = findings.efficiency_drops(df, {"strong": tables.scaling_table(df, "strong")})
    torch = next(s for s in sentences if s.startswith("torch"))
    overlap = next(s for s in sentences if s.startswith("overlap"))
    assert ("of the 30.00 ms lost, exposed communication is 20.00 ms (25 % of the step) and compute that did "
            "not shrink 10.00 ms: exposed communication dominates.") in torch
    assert ("of the 20.00 ms lost, exposed communication is 8.00 ms (11 % of the step) and compute that did "
            "not shrink 12.00 ms: compute that did not shrink dominates.") in overlap


def family(n: int, faster_p: list[float]):
    """n engine cells against torch at one world size, each with speed_vs_torch's interval and sign-test
    p-value: the first len(faster_p) are "faster" uncorrected (interval 1.02–1.08) with those p-values, the
    rest within noise (0.98–1.03, p = 0.6)."""
    df = pd.concat([rows({"overlap": (1.05, 1.02, 1.08)}, {"overlap": (9.5, 9.3, 9.7)})] * n,
                   ignore_index=True)
    df["cell_id"] = [f"overlap-{i}" for i in range(n)]
    within = df.index >= len(faster_p)
    df.loc[within, ["speed_vs_torch", "speed_vs_torch_ci95_low", "speed_vs_torch_ci95_high"]] = (
        1.0, 0.98, 1.03)
    df["speed_vs_torch_p"] = [*faster_p, *[0.6] * (n - len(faster_p))]
    return df


def test_holm_turns_verdicts_that_chance_explains_into_within_noise():
    # 80 comparisons: Holm's first threshold is 0.05 / 80 = 0.000625. p = 1e-6 passes it, then the next
    # (0.01) fails 0.05 / 79 = 0.00063 and everything after it stays: 1 of the 3 faster verdicts survives.
    df = family(80, [1e-6, 0.01, 0.02])
    from bench.report import tables

    verdicts = tables.family_verdicts(df)
    assert list(verdicts[:4]) == ["faster", "within noise", "within noise", "within noise"]
    (sentence,) = findings.family_of_verdicts(df)
    assert "compares 80 cells with torch DDP" in sentence and "about 4.0 faster/slower verdicts" in sentence
    assert "keeps 1 of the 3 uncorrected verdicts" in sentence
    words = findings.against_torch_words(df.assign(_verdict=verdicts).iloc[1])
    assert words == ("within noise once corrected for the run's comparisons (uncorrected 95 % CI +2.0 to "
                     "+8.0 %)")
    assert findings.against_torch_words(df.assign(_verdict=verdicts).iloc[0]).startswith("faster by 5.0 %")


def test_a_single_comparison_is_its_own_family():
    df = family(1, [0.01])  # Holm with m = 1 is the test itself: 0.01 ≤ 0.05
    from bench.report import tables

    assert list(tables.family_verdicts(df)) == ["faster"]
    assert "keeps 1 of the 1 uncorrected" in findings.family_of_verdicts(df)[0]


def test_results_without_p_values_keep_their_verdicts_and_say_so():
    df = family(3, [0.01]).drop(columns="speed_vs_torch_p")
    from bench.report import tables

    assert list(tables.family_verdicts(df)) == ["faster", "within noise", "within noise"]
    assert "uncorrected (these results have no p-values" in findings.family_of_verdicts(df)[0]



def test_the_corrected_verdict_leads_the_sentence():
    # bucketed and naive are faster before the correction (intervals above 1), but their sign-test p-values
    # (0.04, 0.03) do not survive Holm over 3 comparisons (0.03 > 0.05/3): the sentence must not open with
    # "faster" and then call them within noise
    df = rows({"bucketed": (1.03, 1.01, 1.05), "naive": (1.04, 1.01, 1.07), "overlap": (1.0, 0.97, 1.03)},
              {"torch": (10.0, 9.0, 11.0), "bucketed": (9.7, 8.8, 10.6), "naive": (9.6, 8.7, 10.5),
               "overlap": (10.0, 9.1, 10.9)})
    df["speed_vs_torch_p"] = [None, 0.04, 0.03, 0.9]
    (sentence,) = findings.engines_per_world_size(df)
    assert sentence.startswith("At 2 ranks, no engine is faster than torch DDP once corrected for the run's "
                               "comparisons (bucketed and naive are before the correction)"), sentence
    assert "bucketed within noise once corrected" in sentence
