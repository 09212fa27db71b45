"""The report of one run: hand-computed scaling numbers, every status shown, every file it links present."""

from __future__ import annotations

import gzip
import math
import struct
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pytest
from report_fixtures import row, scaling_rows, write_run

from bench.__main__ import main as bench_main
from bench.report import build_report, tables
from bench.run_folder import RunError, load_run, normalise

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = write_run(tmp_path_factory.mktemp("results") / "run-h100", scaling_rows())
    for r in scaling_rows():
        if r["trace_dir"]:  # placeholders named like tensorboard_trace_handler's files
            for rank in (0, 1):
                path = d / r["trace_dir"] / f"rank{rank}.1700000000000.pt.trace.json.gz"
                path.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    return d


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory) -> Path:
    return build_report(run_dir, tmp_path_factory.mktemp("reports") / "run-h100")


def _df(rows) -> pd.DataFrame:
    return normalise(pd.DataFrame(rows), "fixture")


def _by(table: pd.DataFrame, **keys) -> pd.Series:
    mask = pd.Series(True, index=table.index)
    for k, v in keys.items():
        mask &= table[k].isna() if v is None else table[k] == v
    assert mask.sum() == 1, (keys, mask.sum())
    return table[mask].iloc[0]


def test_strong_scaling_by_hand():
    t = tables.scaling_table(_df(scaling_rows()), "strong")
    fp32 = t[(t["precision"] == "fp32") & (t["grad_accum"] == 1)]
    torch2 = _by(fp32, engine="torch", world_size=2, bucket_cap_mb=25.0)
    assert torch2["t1_step_time_ms"] == 100.0
    assert torch2["speedup_x"] == pytest.approx(100 / 55)  # 1.818
    assert torch2["efficiency_pct"] == pytest.approx(90.909, abs=1e-3)  # 100 / (2 · 55)
    torch4 = _by(fp32, engine="torch", world_size=4, bucket_cap_mb=25.0)
    assert torch4["speedup_x"] == pytest.approx(2.5)  # 100 / 40
    assert torch4["efficiency_pct"] == pytest.approx(62.5)  # 100 / (4 · 40)
    assert torch4["throughput_samples_per_s"] == pytest.approx(1600.0)  # 64 / 0.040 s
    overlap4 = _by(fp32, engine="overlap", world_size=4, bucket_cap_mb=25.0)
    assert overlap4["efficiency_pct"] == pytest.approx(83.333, abs=1e-3)  # 100 / (4 · 30)
    # naive's empty bucket matches its own empty-bucket world-size-1 cell: 110 / (2 · 80).
    naive2 = _by(fp32, engine="naive", world_size=2, bucket_cap_mb=None)
    assert naive2["efficiency_pct"] == pytest.approx(68.75)
    assert naive2["speedup_x"] == pytest.approx(1.375)


def test_weak_scaling_by_hand():
    t = tables.scaling_table(_df(scaling_rows()), "weak")
    torch2 = _by(t, engine="torch", world_size=2)
    assert torch2["efficiency_pct"] == pytest.approx(83.333, abs=1e-3)  # 50 / 60
    assert torch2["speedup_x"] == pytest.approx(1.6667, abs=1e-4)  # (64 / 0.060) / (32 / 0.050)
    timeout = _by(t, engine="overlap", world_size=2)
    assert timeout["status"] == "timeout" and math.isnan(timeout["efficiency_pct"])
    assert timeout["note"] == "timeout: watchdog: no progress for 300 s"


def test_failed_cells_stay_empty_with_their_reason_and_missing_baselines_are_said():
    t = tables.scaling_table(_df(scaling_rows()), "strong")
    oom = _by(t, engine="naive", world_size=4, precision="fp32")
    assert oom["status"] == "oom" and oom["note"] == "oom: CUDA out of memory (rank 2)"
    assert math.isnan(oom["step_time_ms_p50"]) and math.isnan(oom["efficiency_pct"])
    no_base = _by(t, engine="overlap", world_size=4, bucket_cap_mb=1.0)
    assert no_base["note"] == "no world-size-1 cell of this configuration in the run"
    assert math.isnan(no_base["efficiency_pct"]) and no_base["step_time_ms_p50"] == 36.0


def test_engines_against_torch_by_hand():
    t = tables.engines_vs_torch(_df(scaling_rows()))
    overlap4 = _by(t, engine="overlap", world_size=4, bucket_cap_mb=25.0)
    assert overlap4["delta_p50_pct"] == pytest.approx(-25.0)  # (30 − 40) / 40
    assert overlap4["delta_p90_pct"] == pytest.approx(-25.0)  # p90 = 1.1 · p50 on both sides
    assert overlap4["exposed_comm_ms"] == 5.0 and overlap4["torch_exposed_comm_ms"] == 15.0
    assert overlap4["delta_exposed_comm_ms"] == pytest.approx(-10.0)
    assert overlap4["delta_peak_mem_pct"] == pytest.approx(-10.0)  # (1080 − 1200) / 1200
    naive2 = _by(t, engine="naive", world_size=2, precision="fp32")  # against torch at 25 MB
    assert naive2["torch_bucket_cap_mb"] == 25.0
    assert naive2["delta_p50_pct"] == pytest.approx(45.4545, abs=1e-3)  # (80 − 55) / 55


def test_sweeps_by_hand():
    df = _df(scaling_rows())
    buckets = tables.bucket_sweep(df)
    sweep = buckets[(buckets["engine"] == "overlap") & (buckets["world_size"] == 4)]
    # throughputs 64/0.036, 64/0.030, 64/0.032 → relative to the best (25 MB)
    assert list(sweep["bucket_cap_mb"]) == [1.0, 25.0, 100.0]
    assert list(sweep["throughput_vs_best_pct"].round(2)) == [83.33, 100.0, 93.75]
    prec = tables.precision_table(df)
    torch_prec = prec[prec["engine"] == "torch"]
    assert _by(torch_prec, precision="bf16", comm_dtype="none")["speedup_vs_fp32_x"] == pytest.approx(55 / 30)
    assert _by(torch_prec, precision="bf16", comm_dtype="bf16")["speedup_vs_fp32_x"] == pytest.approx(55 / 28)
    assert _by(prec, engine="naive", precision="fp16")["status"] == "skipped"
    accum = tables.accumulation_table(df)
    ga4 = _by(accum, grad_accum=4)
    assert ga4["global_batch"] == 256
    assert ga4["throughput_vs_accum1_x"] == pytest.approx((256 / 0.2) / (64 / 0.055))  # 1.1
    assert ga4["exposed_comm_share_pct"] == pytest.approx(2.5)  # 5 / 200
    phase = tables.phase_breakdown(df)
    t4 = _by(phase, engine="torch", world_size=4, scaling="strong")
    assert (t4["compute_only_ms_p50"], t4["exposed_comm_ms"]) == (25.0, 15.0)
    assert t4["exposed_comm_share_pct"] == pytest.approx(37.5)


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.refs += [v for k, v in attrs if k in ("href", "src") and v]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    return struct.unpack(">II", data[16:24])


def test_summary_md_is_the_short_answer_and_report_md_the_whole(report):
    summary = (report.parent / "summary.md").read_text()
    whole = (report.parent / "report.md").read_text()
    assert len(summary.splitlines()) < 60
    assert summary.index("## The answer") < summary.index("## Findings")
    # the fixture's cells have no intervals: the verdict, then its lines
    said = "**Keep torch DDP's defaults for now: no clear winner at fp32.**\n\n- recipe: global batch"
    assert said in summary
    assert "speedup over torch DDP's defaults: **1.33× no interval**" in summary
    assert "![speedup over torch DDP's defaults](plots/speedup.png)" in summary
    assert "## All cells and traces" in whole and "## All cells and traces" not in summary


def test_report_writes_every_plot_and_table_and_links_only_what_exists(report):
    out = report.parent
    expected_plots = {
        "strong_scaling",
        "weak_scaling",
        "engines",
        "buckets",
        "precision",
        "accumulation",
        "phases",
        "memory",
        "speedup",
    }
    assert {p.stem for p in (out / "plots").glob("*.png")} == expected_plots
    for png in (out / "plots").glob("*.png"):
        width, height = _png_size(png)
        assert width >= 400 and height >= 200, (png, width, height)
    parser = _Refs()
    page = report.read_text()
    parser.feed(page)
    local = [r for r in parser.refs if not r.startswith(("http:", "https:", "#"))]
    assert all(not r.startswith("/") for r in local), "links must be relative so the page opens from disk"
    for ref in local:
        assert (out / unquote(ref)).exists(), ref
    for png in expected_plots:
        assert f"plots/{png}.png" in local
    for csv in (
        "strong_scaling",
        "weak_scaling",
        "engines_vs_torch",
        "buckets",
        "precision",
        "accumulation",
        "phases",
        "not_measured",
        "results",
    ):
        assert f"tables/{csv}.csv" in local
    assert sum(r.endswith(".pt.trace.json.gz") for r in local) == 4  # 2 traced cells × 2 ranks
    assert "<script" not in page and "cdn" not in page.lower()
    assert (
        "make tensorboard RUN=" in page and "ui.perfetto.dev" in page and "TraceAnalysis(trace_dir=" in page
    )
    md = (out / "report.md").read_text()  # the whole report; summary.md is the short answer
    assert "![strong_scaling](plots/strong_scaling.png)" in md


def test_report_shows_every_status_with_its_reason(report):
    page = report.read_text()
    for status, reason in [
        ("oom", "CUDA out of memory (rank 2)"),
        ("timeout", "watchdog: no progress for 300 s"),
        ("failed", "RuntimeError: NCCL error in all_reduce"),
        ("diverged", "loss is nan at step 7"),
        ("skipped", "fp16 needs a GPU"),
    ]:
        assert f"{status}: {reason}" in page, status
    not_measured = pd.read_csv(report.parent / "tables/not_measured.csv")
    assert sorted(not_measured["status"]) == ["diverged", "failed", "oom", "skipped", "timeout"]
    strong = pd.read_csv(report.parent / "tables/strong_scaling.csv")
    bad = strong[strong["status"] != "ok"]
    assert len(bad) == 4 and bad["step_time_ms_p50"].isna().all() and bad["efficiency_pct"].isna().all()
    assert "5 of 20 cells produced no numbers (1 diverged, 1 failed, 1 oom, 1 skipped, 1 timeout)" in page


def test_findings_are_written_from_the_numbers(report):
    md = (report.parent / "summary.md").read_text()
    # this fixture run has no intervals (an older result file): no "fastest" claim, and it says so
    assert ("At 4 ranks, overlap has the highest median throughput, 2,133 samples/s (p50 step 30.00 ms); "
            "no interval was measured, so this may be noise" in md)
    assert "torch (strong, fp32, 25 MiB buckets) falls to 62.5 % efficiency at 4 ranks" in md
    assert ("of the 15.00 ms lost, exposed communication is 15.00 ms (38 % of the step) and compute that did "
            "not shrink 0.00 ms: exposed communication dominates." in md)


def test_one_world_size_reports_without_efficiency_and_says_why(tmp_path):
    rows = [
        row("torch", 2, 55.0, compute_only_ms=50.0),
        row("overlap", 2, 52.0, compute_only_ms=50.0),
        row("naive", 2, None, bucket_cap_mb=None, status="failed", error="boom"),
    ]
    run = write_run(tmp_path / "results" / "one-ws", rows)
    index = build_report(run, tmp_path / "out")
    strong = pd.read_csv(tmp_path / "out/tables/strong_scaling.csv")
    assert "efficiency_pct" not in strong and "speedup_x" not in strong
    assert len(strong) == 3
    page = index.read_text()
    assert "single world size (2)" in page and "failed: boom" in page
    assert (tmp_path / "out/plots/strong_scaling.png").is_file()


def test_cli_report_and_its_errors(run_dir, tmp_path, capsys):
    assert bench_main(["report", str(run_dir), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r/index.html").is_file() and (tmp_path / "r/summary.md").is_file()
    assert bench_main(["report", str(tmp_path / "missing")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def test_contract_violations_are_loud(tmp_path):
    bad = write_run(tmp_path / "bad", [row("torch", 1, 10.0)])
    (bad / "cells.jsonl").unlink(missing_ok=True)  # results.csv alone: its rows are the ones checked
    df = pd.read_csv(bad / "results.csv")
    df.loc[0, "status"] = "crashed"
    df.to_csv(bad / "results.csv", index=False)
    with pytest.raises(RunError, match="unknown status"):
        load_run(bad)
    df.loc[0, "status"] = "ok"
    df["step_time_ms_p50"] = df["step_time_ms_p50"].astype(object)
    df.loc[0, "step_time_ms_p50"] = "fast"
    df.to_csv(bad / "results.csv", index=False)
    with pytest.raises(RunError, match="step_time_ms_p50"):
        load_run(bad)


def test_runs_without_numbers_still_report(tmp_path):
    """An empty run, an all-failed run and an interrupted run (cells.jsonl only) each report and say so."""
    empty = build_report(write_run(tmp_path / "empty", []), tmp_path / "r-empty")
    assert "The run has no cells yet" in empty.read_text()
    failed = [
        row("torch", 1, None, status="failed", error="x"),
        row("torch", 2, None, status="timeout", error="y"),
    ]
    page = build_report(write_run(tmp_path / "failed", failed), tmp_path / "r-failed").read_text()
    assert "2 of 2 cells produced no numbers (1 failed, 1 timeout)" in page
    assert "failed: x" in page and "timeout: y" in page
    interrupted = write_run(tmp_path / "jsonl", [row("torch", 1, 10.0), row("torch", 2, 6.0)])
    (interrupted / "results.csv").unlink()
    page = build_report(interrupted, tmp_path / "r-jsonl").read_text()
    assert "rows were read from cells.jsonl" in page
    assert "torch (the only engine measured) runs 10,667 samples/s" in page


def test_compressed_comm_takes_t1_from_the_uncompressed_world_size_1_cell():
    """The runner skips comm_dtype=bf16 at world size 1 (nothing is sent); T₁ is then the comm=none cell."""
    rows = [
        row("torch", 1, 100.0),
        row(
            "torch",
            1,
            None,
            comm_dtype="bf16",
            status="skipped",
            error="comm_dtype=bf16 at world_size=1: nothing is communicated (same as comm_dtype=none)",
        ),
        row("torch", 2, 50.0, comm_dtype="bf16"),
    ]
    t = tables.scaling_table(_df(rows), "strong")
    bf16 = _by(t, world_size=2)
    assert bf16["t1_step_time_ms"] == 100.0
    assert bf16["efficiency_pct"] == pytest.approx(100.0)  # 100 / (2 · 50)
    assert bf16["note"].startswith("T₁ from the comm_dtype=none cell")


def test_naive_without_a_25mb_torch_cell_meets_torch_at_its_fastest_bucket():
    rows = [
        row("torch", 2, 60.0, bucket_cap_mb=1.0),
        row("torch", 2, 50.0, bucket_cap_mb=4.0),
        row("naive", 2, 75.0, bucket_cap_mb=None),
    ]
    naive = _by(tables.engines_vs_torch(_df(rows)), engine="naive")
    assert naive["torch_bucket_cap_mb"] == 4.0
    assert naive["delta_p50_pct"] == pytest.approx(50.0)  # (75 − 50) / 50


def test_comm_dtype_alias_is_read_as_none_and_an_empty_one_is_refused():
    """A row spelt with the config alias "fp32" is the comm_dtype=none configuration in every table (its
    world-size-1 cell is T₁ of the "none" cells); an empty comm_dtype is refused by name, not guessed."""
    df = _df([row("torch", 1, 100.0, comm_dtype="fp32"), row("torch", 2, 55.0, comm_dtype="none")])
    assert list(df["comm_dtype"]) == ["none", "none"]
    torch2 = _by(tables.scaling_table(df, "strong"), world_size=2)
    assert torch2["t1_step_time_ms"] == 100.0
    assert torch2["efficiency_pct"] == pytest.approx(90.909, abs=1e-3)  # 100 / (2 · 55)
    with pytest.raises(RunError, match="column 'comm_dtype' is empty in 1 rows"):
        _df([row("torch", 1, 100.0, comm_dtype=""), row("torch", 2, 55.0)])


def test_numbers_the_runner_left_empty_are_derived_with_bench_metrics():
    r = row("torch", 2, 50.0, compute_only_ms=40.0)
    r.update(samples_per_s="", exposed_comm_ms="")
    df = _df([r, row("torch", 2, None, bucket_cap_mb=1.0, status="failed", error="x")])
    assert tables.throughputs(df)[0] == pytest.approx(1280.0)  # 64 samples / 0.050 s
    assert tables.exposed_comms(df)[0] == pytest.approx(10.0)  # 50 − 40 ms
    assert tables.throughputs(df).isna()[1] and tables.exposed_comms(df).isna()[1]


def test_notes_say_which_baseline_cell_has_no_numbers():
    df = _df([
        row("torch", 1, None, status="failed", error=""),
        row("torch", 2, 55.0),
        row("overlap", 1, 100.0),
        row("overlap", 2, 50.0),
    ])
    strong = tables.scaling_table(df, "strong")
    assert _by(strong, engine="torch", world_size=2)["note"] == "world-size-1 cell failed: no reason recorded"
    overlap2 = _by(strong, engine="overlap", world_size=2)
    assert overlap2["efficiency_pct"] == pytest.approx(100.0)  # 100 / (2 · 50)
    vs_torch = tables.engines_vs_torch(df)
    assert _by(vs_torch, world_size=1)["note"] == "torch cell failed: no reason recorded"
    assert _by(vs_torch, world_size=2)["delta_p50_pct"] == pytest.approx(-9.0909, abs=1e-4)  # (50 − 55) / 55


def test_each_concept_has_one_colour_in_every_figure():
    # exposed communication was orange in the phase bars and red in the Why breakdown, where orange also
    # meant hidden communication: both figures now take it from bench/style.py
    from bench import style
    from bench.report import why_section

    parts = {label: color for _, label, color in why_section.PARTS}
    assert parts["exposed communication"] == style.EXPOSED_COMM
    assert parts["hidden communication"] == style.HIDDEN_COMM != style.EXPOSED_COMM
    concepts = (style.COMPUTE, style.EXPOSED_COMM, style.HIDDEN_COMM, style.MEMORY, style.IDLE,
                style.THRESHOLD)
    assert len(set(concepts)) == len(concepts)
    figures = sorted((Path(style.__file__).parent / "report" / "plots").glob("*.py"))
    source = "".join(p.read_text() for p in figures)
    # tab:red only as bar_status's default: the word of a bar without a number
    assert "tab:orange" not in source and source.count("tab:red") == 1
    assert "tab:red" in source.split("def bar_status")[1].split("\n")[0]


def test_engine_options_make_their_own_configuration_against_plain_torch():
    # torch at 2 ranks three ways (plain, PowerSGD, compiled) beside overlap, and plain torch at 1 rank.
    # Without engine_options as a configuration key the three torch cells are one configuration: overlap
    # could be compared with the PowerSGD cell, and PowerSGD's efficiency would not be its own.
    import pandas as pd

    from bench.report import tables
    from bench.run_folder import normalise

    def cell(engine, ws, step, options=""):
        r = row(engine, ws, step, global_batch=64)
        r.update(engine_options=options, cell_id=r["cell_id"] + (f"-{options}" if options else ""))
        return r

    df = normalise(pd.DataFrame([
        cell("torch", 1, 100.0),
        cell("torch", 2, 60.0, "hpowersgd.r4"),   # listed first: a first-match join would take it
        cell("torch", 2, 55.0, "inductor"),
        cell("torch", 2, 50.0),
        cell("overlap", 2, 45.0),
    ]).replace("", None), "fixture")
    table = tables.engines_vs_torch(df)
    # every compared row is measured against plain torch DDP's 50 ms, the hooked and compiled torch too
    assert len(table) == 3 and table["torch_step_time_ms_p50"].tolist() == [50.0, 50.0, 50.0]
    strong = tables.scaling_table(df, "strong")
    ws2 = strong[(strong["world_size"] == 2) & (strong["engine"] == "torch")].set_index("engine_options")
    # plain torch's efficiency from its own 1-rank cell: 100 / (2 × 50) = 100 %; PowerSGD (skipped on one
    # rank, nothing to compress) borrows that cell: 100 / (2 × 60) = 83.3 %; the compiled configuration has
    # no 1-rank cell of its own and none stands in for it (compiling changes the compute)
    assert ws2.loc["", "efficiency_pct"] == pytest.approx(100.0)
    assert ws2.loc["hpowersgd.r4", "efficiency_pct"] == pytest.approx(100 / 1.2)
    assert pd.isna(ws2.loc["inductor", "efficiency_pct"])


def test_a_one_rank_answer_calls_step_minus_compute_only_its_sync_overhead(tmp_path):
    from bench.advise import api as advise
    from bench.report.answer_section import headline_numbers

    rows = [row("torch", 1, 50.0, compute_only_ms=45.0), row("overlap", 1, 48.0, compute_only_ms=45.0)]
    run = write_run(tmp_path / "results" / "one-rank", rows)

    numbers = headline_numbers(load_run(run).results, advise.run(run, target=None, write=False).table)
    last = numbers.iloc[3]
    assert last["name"] == "sync overhead (% of the step)" and "no communication" in last["of"]
    assert "exposed communication" not in " ".join(numbers["name"])
