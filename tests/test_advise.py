"""`bench advise`: the ranking with intervals and ties, memory exclusion, the projection at the target, the
sentence pinned to advice.csv, and the exit-2 cases (nothing written)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from report_fixtures import CPU_ENV, row, write_run

from bench.__main__ import main

BUCKETS = [4 * 2**20, 2**20]  # bytes on the wire per bucket, as a cell records them (bucket_sizes_bytes)


def _cell(engine, ws, step, low, high, mem, **kw):
    r = row(engine, ws, step, peak_mem_mb=mem, compute_only_ms=step * 0.8, **kw)
    r.update(step_time_ms_ci95_low=low, step_time_ms_ci95_high=high)
    if ws == 1:  # the base cell: its phases are the projection's compute side
        r.update(forward_ms_p50=step * 0.3, backward_ms_p50=step * 0.6, optimizer_ms_p50=step * 0.1)
    return r


def _rows():
    # global batch 64 at 2 ranks: samples/s = 64 / step.
    # overlap 48 ms [47.5, 49.2] → 1,333 samples/s [1,300.8, 1,347.4]: the best.
    # torch 50 ms [49, 51] → 1,280 [1,254.9, 1,306.1]: its upper bound reaches overlap's lower → tied.
    # bucketed 60 ms [59, 61] → 1,066.7 [1,049.2, 1,084.7]: below beyond the noise.
    return [
        _cell("torch", 1, 90.0, 89.0, 91.0, 900.0),
        _cell("overlap", 1, 90.0, 89.0, 91.0, 1900.0),
        _cell("bucketed", 1, 90.0, 89.0, 91.0, 900.0),
        _cell("torch", 2, 50.0, 49.0, 51.0, 1000.0),
        _cell("overlap", 2, 48.0, 47.5, 49.2, 2000.0),
        _cell("bucketed", 2, 60.0, 59.0, 61.0, 1000.0),
        row("naive", 2, None, bucket_cap_mb=None, status="failed", error="boom"),
    ]


@pytest.fixture
def run_dir(tmp_path):
    run = write_run(tmp_path / "run", _rows(), env={**CPU_ENV})
    records = [json.loads(line) for line in (run / "cells.jsonl").read_text().splitlines()]
    (run / "cells.jsonl").write_text("".join(json.dumps({**r, "bucket_sizes_bytes": BUCKETS}) + "\n"
                                             for r in records))
    return run


def _advise(run_dir, *extra):
    return main(["advise", str(run_dir), "--target-gpus", "8", "--network", "ib-ndr400", *extra])


def test_ranking_ties_and_sentence_pinned_to_the_files(run_dir, capsys):
    assert _advise(run_dir) == 0
    printed = capsys.readouterr().out
    answer = printed.splitlines()[0]
    advice = pd.read_csv(run_dir / "advice" / "advice.csv")
    assert list(advice["engine"]) == ["overlap", "torch", "bucketed"]
    assert list(advice["rank"]) == [1, 2, 3]
    assert list(advice["tied_with_best"]) == [False, True, False]
    for col in ("rank", "tied_with_best", "engine", "bucket_cap_mb", "precision", "comm_dtype", "grad_accum",
                "world_size", "samples_per_s", "samples_per_s_ci95_low", "samples_per_s_ci95_high",
                "projected_samples_per_s", "projected_efficiency", "dominant_loss", "why"):
        assert col in advice.columns
    best = advice.iloc[0]
    assert best["samples_per_s"] == pytest.approx(64 / 0.048)
    assert best["samples_per_s_ci95_low"] == pytest.approx(64 / 0.0492)
    assert best["samples_per_s_ci95_high"] == pytest.approx(64 / 0.0475)
    assert 0 < best["projected_efficiency"] <= 1
    # the sentence: every figure in it is one of advice.csv's, formatted as written
    low, high = best["samples_per_s_ci95_low"], best["samples_per_s_ci95_high"]
    half = (high - low) / 2 / best["samples_per_s"] * 100
    assert f"{half:.1f}" == "1.7"  # by hand: (1347.37 − 1300.81) / 2 / 1333.33
    expected = (f"Use overlap, 25 MiB buckets, fp32, accumulation 1: {best['samples_per_s']:,.0f} samples/s "
                f"at 2 ranks (±{half:.1f} %), tied with torch; projected "
                f"{best['projected_efficiency'] * 100:.0f} % efficiency "
                f"({best['projected_samples_per_s']:,.0f} samples/s) at 8 GPUs on ib-ndr400")
    assert answer.startswith(expected), answer
    from_files = {"25", "1", "2", "8", "400", f"{best['samples_per_s']:,.0f}", f"{half:.1f}",
                  f"{best['projected_efficiency'] * 100:.0f}", f"{best['projected_samples_per_s']:,.0f}"}
    number = r"\d[\d,.]*\d|\d"
    from_files |= set(re.findall(number, best["precision"]))  # fp32's "32"
    assert set(re.findall(number, answer)) <= from_files, answer
    md = (run_dir / "advice" / "advice.md").read_text()
    assert answer in md and "CPU run" in md


def test_a_best_that_cannot_be_projected_names_the_best_that_can(tmp_path, capsys):
    # strong scaling keeps the global batch (64): it does not divide among 3 ranks, so the three strong
    # configurations cannot be projected; the weak one (per-rank batch 8, 16 / 0.02 = 800 samples/s,
    # rank 4) can
    weak = [_cell("torch", n, step, step - 1, step + 1, 900.0, scaling="weak", per_rank_batch=8)
            for n, step in ((1, 15.0), (2, 20.0))]
    run = write_run(tmp_path / "run", _rows() + weak, env={**CPU_ENV})
    assert main(["advise", str(run), "--target-gpus", "3", "--network", "ib-ndr400"]) == 0
    answer = capsys.readouterr().out.splitlines()[0]
    advice = pd.read_csv(run / "advice" / "advice.csv")
    assert advice["projected_efficiency"].notna().tolist() == [False, False, False, True]
    r = advice.iloc[3]
    assert ("it cannot be projected to 3 GPUs on ib-ndr400 (global batch 64 per micro-step does not divide "
            "among 3 ranks); the best that can, rank 4 (torch, 25 MiB buckets, fp32, uncompressed gradients, "
            "accumulation 1, weak scaling, per-rank batch 8, global batch 16, 800 samples/s), is projected "
            f"{r['projected_efficiency'] * 100:.0f} % efficiency "
            f"({r['projected_samples_per_s']:,.0f} samples/s)") in answer


def test_memory_excludes_with_the_reason(run_dir, capsys):
    assert _advise(run_dir, "--memory-gb", "1.5") == 0
    advice = pd.read_csv(run_dir / "advice" / "advice.csv")
    overlap = advice[advice["engine"] == "overlap"].iloc[0]
    assert pd.isna(overlap["rank"]) and "over --memory-gb 1.5" in overlap["why"]
    assert advice.dropna(subset=["rank"]).iloc[0]["engine"] == "torch"
    assert capsys.readouterr().out.startswith("Use torch,")


@pytest.mark.parametrize("extra, words", [
    (("--memory-gb", "0.5"), "--memory-gb=0.5 is below every configuration"),
    (("--network", "carrier-pigeon"), "--network='carrier-pigeon' is not a preset"),
    (("--target-gpus", "0"), "--target-gpus=0"),
])
def test_bad_input_exits_2_and_writes_nothing(run_dir, capsys, extra, words):
    assert _advise(run_dir, *extra) == 2
    assert words in capsys.readouterr().err
    assert not (run_dir / "advice").exists()


def test_a_run_without_ok_cells_exits_2(tmp_path, capsys):
    run = write_run(tmp_path / "run", [row("torch", 2, None, status="failed", error="boom")], env=CPU_ENV)
    assert main(["advise", str(run)]) == 2
    assert "no cell finished with status ok" in capsys.readouterr().err
    assert not (run / "advice").exists()


def test_the_advice_names_engine_options_and_leaves_defaults_unsaid():
    import pandas as pd

    from bench.advise import answer

    keys = ["engine", "bucket_cap_mb", "precision", "comm_dtype", "grad_accum", "engine_options"]
    compiled = pd.Series({"engine": "torch", "bucket_cap_mb": 25.0, "precision": "fp32", "comm_dtype": "none",
                          "grad_accum": 1, "engine_options": "hpowersgd.r4 inductor"})
    assert answer.choice_words(compiled, keys) == ("torch, 25 MiB buckets, fp32, accumulation 1, "
                                                   "with hpowersgd.r4 inductor")
    plain = compiled.copy()
    plain["engine_options"] = ""
    assert answer.choice_words(plain, keys) == "torch, 25 MiB buckets, fp32, accumulation 1"
    assert answer.differences(plain, compiled, keys) == "engine options at defaults"
