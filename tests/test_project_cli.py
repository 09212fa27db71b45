"""`python -m bench project` on hand-built run folders: bad input exits 2 before writing anything; a run with
a bucket timeline and a probe sweep is projected and validated to numbers worked out by hand."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pandas as pd
import pytest
from report_fixtures import CPU_ENV, H100_ENV, row, write_run

from bench.__main__ import main
from bench.project import protocol
from bench.project.physics import DEFAULT_INTERFERENCE


def bench_project(*argv) -> int:
    return main(["project", *map(str, argv)])


def run_folder(tmp_path: Path, sweep: bool = True, timeline: bool = True, device: str = "cpu") -> Path:
    """One configuration (bucketed, strong, global batch 8) at world sizes 1 and 2.

    World size 1: forward 2, backward 4, optimizer 2 ms (phase pass), compute-only 8 ms. Trace: two 1 MB
    buckets, ready at 2 and 4 ms of a 4 ms backward (fractions 0.5 and 1). Sweep at 2 ranks: t = 50 µs +
    S / (1 GB/s), so a 1 MB bucket costs 1.05 ms.
    """
    ws1 = row("bucketed", 1, 8.5, global_batch=8, compute_only_ms=8.0, device=device)
    ws2 = row("bucketed", 2, 6.5, global_batch=8, compute_only_ms=4.1, device=device)
    for r in (ws1, ws2):
        r.update(forward_ms_p50=2.0, backward_ms_p50=4.0, optimizer_ms_p50=2.0, threads_per_rank=1,
                 allreduce_bytes=1_000_000, allreduce_algbw_gbps=0.9, n_buckets=2, n_params=500_000)
    env = CPU_ENV | {"cpu_cores": 16} if device == "cpu" else H100_ENV
    run = write_run(tmp_path / "run", [ws1, ws2], env=env)
    if timeline:
        with open(run / "bucket_timeline.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["cell_id", "trace_file", "rank", "step", "engine", "bucket", "bytes", "ready_ms",
                        "comm_start_ms", "comm_end_ms", "backward_ms"])
            for bucket, ready in ((0, 2.0), (1, 4.0)):
                w.writerow([ws1["cell_id"], "rank0.json", 0, 3, "bucketed", bucket, 1_000_000, ready, ready,
                            ready + 0.1, 4.0])
    if sweep:
        with open(run / "allreduce_sweep.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["cell_id", "world_size", "backend", "dtype", "size_bytes", "time_us", "algbw_gbps",
                        "busbw_gbps"])
            for size in (10**5, 10**6, 10**7):
                t = 50 + size / 1e3
                w.writerow([ws2["cell_id"], 2, "gloo", "float32", size, t, size / t / 1e3, size / t / 1e3])
    return run


def test_validation_and_projection_match_the_hand_worked_step(tmp_path, capsys):
    run = run_folder(tmp_path)
    assert bench_project(run, "--network", "measured,h100-nvlink", "--world-sizes", "1,2,4,8,16") == 0
    out = run / "projection"
    # World size 2 (per-rank batch 4): forward 1, backward 2, optimizer 2. Bucket 0 ready at 1 ms, ends
    # 2.05; bucket 1 ready at 2 ms, starts 2.05, ends 3.10: exposed 1.10 → step 1 + 2 + 1.10 + 2 = 6.10 ms.
    # Physics terms: σ = (p90 − p50)/z90/p50 = 0.1/1.2816 = 0.07803 of the base cell; straggler at 2 ranks
    # = σ · compute 5 ms · E[Z_(2)] 1/√π = 0.22011 ms; interference = γ · (2.10 comm − 1.10 exposed).
    step = 6.10 + 0.1 / 1.2816 * 5.0 / math.sqrt(math.pi) + DEFAULT_INTERFERENCE * 1.0
    v = pd.read_csv(out / "validation.csv")
    assert len(v) == 1
    assert v.loc[0, "predicted_step_ms"] == pytest.approx(step)
    assert v.loc[0, "error_pct"] == pytest.approx(100 * (step - 6.5) / 6.5)
    assert v.loc[0, "timeline_source"] == "trace"
    fit = pd.read_csv(out / "network_fit.csv")
    assert fit.loc[0, "alpha_us"] == pytest.approx(50.0) and fit.loc[0, "algbw_gbps"] == pytest.approx(1.0)
    p = pd.read_csv(out / "projection.csv")
    measured = p[p["network"] == "measured"].set_index("world_size")
    assert measured.loc[2, "predicted_step_ms"] == pytest.approx(step)
    assert measured.loc[2, "straggler_ms"] == pytest.approx(0.1 / 1.2816 * 5.0 / math.sqrt(math.pi))
    assert measured.loc[2, "dominant_term"] == "exposed_comm" and measured.loc[1, "straggler_ms"] == 0
    assert measured.loc[1, "efficiency_pct"] == pytest.approx(100.0)
    # Strong scaling at global batch 8: 16 ranks cannot split it.
    assert pd.isna(measured.loc[16, "predicted_step_ms"])
    assert measured.loc[16, "reason"] == "global batch 8 per micro-step does not divide among 16 ranks"
    assert set(p["network"]) == {"measured", "h100-nvlink"}
    # data only: the figure and the section are the report's (test_projection_section.py)
    assert not (out / "projection.png").exists() and not (out / "projection.md").exists()
    assert (out / "notes.txt").is_file()
    assert f"median |error| {abs(100 * (step - 6.5) / 6.5):.1f} %" in capsys.readouterr().out


def test_a_preset_the_run_measured_on_is_anchored_to_its_cells(tmp_path):
    # the run measured 6.5 ms at 2 ranks; on h100-nvlink the model says s2 there. With --measured-on the
    # 4- and 8-rank steps are the model's times 6.5 / s2 (anchored to 2), the 2-rank step is the model's
    run = run_folder(tmp_path, device="cuda")
    sizes = ("--network", "h100-nvlink", "--gpus-per-node", "8", "--world-sizes", "1,2,4,8")
    assert bench_project(run, *sizes, "--out", tmp_path / "plain") == 0
    assert bench_project(run, *sizes, "--measured-on", "h100-nvlink", "--out", tmp_path / "on") == 0
    plain, on = (pd.read_csv(tmp_path / d / "projection.csv").set_index("world_size")
                 for d in ("plain", "on"))
    ratio = 6.5 / plain.loc[2, "predicted_step_ms"]
    assert on.loc[2, "predicted_step_ms"] == plain.loc[2, "predicted_step_ms"] and pd.isna(
        on.loc[2, "anchor_world_size"])
    # 1 and 2 ranks measured, 4 and 8 on the node: the two-gpus protocol (bench/project/protocol.py), whose
    # band moves the anchored efficiency by its median miss at the reach (×2, ×4)
    band = protocol.read_bands()[protocol.TWO_GPUS]
    t1 = plain.loc[1, "predicted_step_ms"]
    for n in (4, 8):
        assert on.loc[n, "anchor_world_size"] == 2 and on.loc[n, "anchor_step_ratio"] == pytest.approx(ratio)
        anchored = plain.loc[n, "predicted_step_ms"] * ratio
        ideal = t1 / n if on.loc[n, "scaling"] == "strong" else t1   # the step at 100 % efficiency
        printed = band.predicted(ideal / anchored, n / 2)
        assert on.loc[n, "predicted_step_ms"] == pytest.approx(ideal / printed)
        assert on.loc[n, "efficiency_pct"] == pytest.approx(100 * printed)
        assert on.loc[n, "protocol"] == protocol.TWO_GPUS
        assert on.loc[n, "interval_regime"].startswith(protocol.band_of(protocol.TWO_GPUS, n / 2))
    assert plain["anchor_world_size"].isna().all()


def test_without_sweep_the_rows_probe_gives_a_line_through_the_origin(tmp_path):
    run = run_folder(tmp_path, sweep=False)
    assert bench_project(run, "--world-sizes", "1,2", "--out", tmp_path / "o") == 0
    fit = pd.read_csv(tmp_path / "o" / "network_fit.csv")
    assert fit.loc[0, "alpha_us"] == 0.0 and fit.loc[0, "algbw_gbps"] == pytest.approx(0.9)
    assert "α = 0" in fit.loc[0, "source"]


def test_without_timeline_the_workload_layout_is_used(tmp_path):
    run = run_folder(tmp_path, timeline=False)
    assert bench_project(run, "--world-sizes", "1,2", "--out", tmp_path / "o") == 0
    p = pd.read_csv(tmp_path / "o" / "projection.csv")
    assert set(p["timeline_source"].dropna()) == {"uniform (workload layout)"}


@pytest.mark.parametrize("argv, words", [
    (["--network", "h200-magic"], "--network='h200-magic' is not a preset"),
    (["--world-sizes", "8,x"], "--world-sizes='8,x'"),
    (["--world-sizes", "8,16,...,1000"], "--world-sizes='8,16,...,1000'"),
    (["--world-sizes", "0,2"], "--world-sizes='0,2'"),
    (["--network", "h100-nvlink", "--world-sizes", "12"], "12 is not a multiple of --gpus-per-node=8"),
    (["--bw-gbps", "10"], "--bw-gbps=10.0 --latency-us=None: give both"),
    (["--bw-gbps", "-1", "--latency-us", "5"], "--bw-gbps=-1.0 must be > 0"),
    (["--network", "h100-nvlink", "--bw-gbps", "1", "--latency-us", "1"], "give one or the other"),
    (["--inter-network", "carrier-pigeon"], "--inter-network='carrier-pigeon'"),
    (["--algorithm", "butterfly"], "--algorithm='butterfly'"),
    (["--gpus-per-node", "0", "--network", "h100-nvlink"], "--gpus-per-node=0"),
    (["--network", "h100-nvlink", "--measured-on", "a100-nvlink"], "--measured-on='a100-nvlink' is not one"),
    (["--network", "h100-nvlink", "--measured-on", "h100-nvlink"], "the run measured on 'cpu'"),
    (["--measured-on", "measured"], "--measured-on='measured' is not one"),
])
def test_bad_arguments_exit_2_naming_key_and_value(tmp_path, capsys, argv, words):
    run = run_folder(tmp_path)
    assert bench_project(run, *argv) == 2
    assert words in capsys.readouterr().err
    assert not (run / "projection").exists()


def test_a_run_without_ok_cells_projects_nothing(tmp_path, capsys):
    run = write_run(tmp_path / "run", [row("torch", 1, None, status="failed", error="boom", device="cpu")],
                    env=CPU_ENV)
    assert bench_project(run) == 0
    assert "(0 configurations, 0 of 0 rows predicted, 0 anchored to a measured world size)" in \
        capsys.readouterr().out


def test_missing_run_exits_2(tmp_path, capsys):
    assert bench_project(tmp_path / "nope") == 2
    assert f"run={str(tmp_path / 'nope')!r}" in capsys.readouterr().err


def test_a_broken_timeline_exits_2_naming_file_and_column(tmp_path, capsys):
    run = run_folder(tmp_path)
    (run / "bucket_timeline.csv").write_text("cell_id,bytes\nx,1\n")
    assert bench_project(run) == 2
    err = capsys.readouterr().err
    assert "bucket_timeline.csv: missing columns" in err and "ready_ms" in err


def test_a_timeline_row_without_bytes_exits_2(tmp_path, capsys):
    run = run_folder(tmp_path)
    text = (run / "bucket_timeline.csv").read_text().replace(",1000000,", ",0,")
    (run / "bucket_timeline.csv").write_text(text)
    assert bench_project(run) == 2
    assert "bucket_timeline.csv: cell bucketed-mlp-tiny-ws1" in capsys.readouterr().err
    assert not (run / "projection").exists()


def test_a_doubling_range_expands():
    from bench.project.cli import parse_world_sizes

    assert parse_world_sizes("8,16,...,128") == [8, 16, 32, 64, 128]
    assert parse_world_sizes("4, 1,2") == [1, 2, 4]


def test_workload_layout_follows_the_engines_rule():
    # naive: one message per parameter, reverse registration order; the others: assign_buckets at the cap.
    from bench.project.layout import engine_bucket_sizes, parameter_sizes, workload_options

    options = workload_options({"model": "resnet", "ignored": 1})
    params = parameter_sizes("resnet", "resnet50", options)
    assert sum(params) == 25_557_032 * 4  # torchvision's ResNet-50 parameter count, fp32
    buckets = engine_bucket_sizes("torch", "resnet", "resnet50", 25.0, "none", options)
    assert sum(buckets) == sum(params) and len(buckets) == 4
    naive = engine_bucket_sizes("naive", "resnet", "resnet50", None, "bf16", options)
    assert naive == [p // 2 for p in params]
