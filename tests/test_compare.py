"""`bench compare`: H100 vs A100 fixture runs that differ in hardware, software and partly in cells."""

from __future__ import annotations

import math
import struct

import pandas as pd
import pytest
from report_fixtures import A100_ENV, CPU_ENV, row, scaling_rows, write_run

from bench.__main__ import main as bench_main
from bench.report import comparability, compare
from bench.run_folder import load_run

SLOWER = 1.5  # the A100 fixture's step times are the H100's × 1.5: ratio 1/1.5, delta −33.3 %


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    h100 = write_run(root / "h100", scaling_rows())
    a100_rows = []
    for r in scaling_rows():
        if r["engine"] == "overlap" and r["bucket_cap_mb"] == 1.0:
            continue  # measured on the H100 only
        if r["status"] == "ok":
            r.update(
                step_time_ms_p50=r["step_time_ms_p50"] * SLOWER, samples_per_s=r["samples_per_s"] / SLOWER
            )
        a100_rows.append(r)
    a100_rows.append(row("torch", 8, 30.0))  # measured on the A100 only
    a100 = write_run(root / "a100", a100_rows, A100_ENV)
    cpu = write_run(root / "cpu", scaling_rows("cpu"), CPU_ENV)
    return h100, a100, cpu


def test_join_ratio_delta_and_efficiency_by_hand(runs):
    joined = compare.join_cells([load_run(runs[0]), load_run(runs[1])])
    torch4 = joined[(joined["engine"] == "torch") & (joined["world_size"] == 4)].iloc[0]
    assert torch4["throughput_a_samples_per_s"] == pytest.approx(1600.0)  # 64 / 0.040
    assert torch4["throughput_b_samples_per_s"] == pytest.approx(1066.667, abs=1e-3)  # 64 / 0.060
    assert torch4["throughput_ratio_b_over_a_x"] == pytest.approx(1 / SLOWER)
    assert torch4["throughput_delta_pct"] == pytest.approx(-33.333, abs=1e-3)
    assert torch4["efficiency_a_pct"] == pytest.approx(62.5)  # 100 / (4 · 40) on H100
    assert torch4["efficiency_b_pct"] == pytest.approx(62.5)  # 150 / (4 · 60) on A100
    oom = joined[(joined["engine"] == "naive") & (joined["world_size"] == 4)].iloc[0]
    assert pd.isna(oom["throughput_ratio_b_over_a_x"]) and "oom: CUDA out of memory" in oom["note"]
    only = compare.one_side_only(joined)
    assert sorted(only["presence"]) == ["only a100", "only h100"]
    assert set(only["world_size"]) == {4, 8}


def test_environment_differences_and_software_warning(runs):
    diff = comparability.env_differences([load_run(runs[0]), load_run(runs[1])]).set_index("field")
    assert diff.loc["GPU", "h100"] == "4 × NVIDIA H100 80GB HBM3"
    assert diff.loc["GPU", "a100"] == "4 × NVIDIA A100-SXM4-80GB"
    assert diff.loc["GPU", "differs"] and diff.loc["topology", "differs"] and not diff.loc["torch", "differs"]
    warning = comparability.software_warning(diff.reset_index())
    assert "cuda 12.8 vs 12.4" in warning and "nccl 2.27.3 vs 2.21.5" in warning and "torch" not in warning


def test_compare_cli_writes_page_tables_and_same_axes_plots(runs, tmp_path):
    out = tmp_path / "cmp"
    assert bench_main(["compare", str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "Software versions differ" in page and "NVIDIA A100-SXM4-80GB" in page
    assert "median throughput ratio 0.67×" in page and "measured in h100 only" in page
    for name in ("cells", "environment_diff", "one_side_only"):
        assert f'href="tables/{name}.csv"' in page and (out / f"tables/{name}.csv").is_file()
    png = out / "plots/strong_side_by_side.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] >= 800
    assert 'src="plots/strong_side_by_side.png"' in page


def test_cpu_against_gpu_is_refused_with_exit_2_unless_allowed(runs, tmp_path, capsys):
    h100, _, cpu = runs
    assert bench_main(["compare", str(h100), str(cpu), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "refusing to compare runs on different devices (h100 is cuda, cpu is cpu)" in err
    assert "--allow-mixed-devices" in err and not (tmp_path / "x").exists()
    assert (
        bench_main(["compare", str(h100), str(cpu), "--out", str(tmp_path / "y"), "--allow-mixed-devices"])
        == 0
    )
    assert "compared on request" in (tmp_path / "y/index.html").read_text()


def test_compare_needs_two_runs(runs, capsys):
    assert bench_main(["compare", str(runs[0])]) == 2
    assert "at least two" in capsys.readouterr().err


def test_runs_with_nothing_in_common_exit_2_saying_how_they_differ(runs, tmp_path, capsys):
    other = []
    for r in scaling_rows():
        r.update(model_size="small", cell_id=r["cell_id"].replace("tiny", "small"))
        other.append(r)
    small = write_run(tmp_path / "small", other)
    assert bench_main(["compare", str(runs[0]), str(small), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "h100 and small have no configuration in common" in err and "nothing can be compared" in err
    assert "model: mlp/tiny vs mlp/small" in err and "engines:" not in err  # only what differs is named
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("b_step, b_low, b_high, words", [
    # compare.ratio_interval: log half-widths in quadrature. ratio 100/102 = 0.980; down √(ln(100/95)² +
    # ln(107/102)²) = 0.0702, up √(ln(105/100)² + ln(102/97)²) = 0.0701: (0.914, 1.052), half-width 7.0 %
    (102.0, 97.0, 107.0, "a 2 % difference inside the noise: the run-to-run noise floor here is ±7 %"),
    # ratio 100/150 = 0.667; down 0.0530, up 0.0506: (0.632, 0.701), half-width 5.2 %
    (150.0, 148.0, 152.0, "at the median b is 33 % slower, beyond the noise: the run-to-run noise floor "
                          "here is ±5 %"),
])
def test_compare_states_the_noise_floor_and_words_differences_inside_it_as_noise(
        tmp_path, b_step, b_low, b_high, words):
    def run(name, step, low, high):
        r = row("torch", 2, step)
        r.update(step_time_ms_ci95_low=low, step_time_ms_ci95_high=high)
        return write_run(tmp_path / name, [r])

    a, b = run("a", 100.0, 95.0, 105.0), run("b", b_step, b_low, b_high)
    joined = compare.join_cells([load_run(a), load_run(b)])
    floor = compare.noise_floor_pct(joined)["b"]
    down = math.hypot(math.log(100 / 95), math.log(b_high / b_step))
    up = math.hypot(math.log(105 / 100), math.log(b_step / b_low))
    assert floor == pytest.approx((math.exp(up) - math.exp(-down)) / 2 * 100)
    assert bench_main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    assert words in (tmp_path / "cmp" / "summary.md").read_text()
