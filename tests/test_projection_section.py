"""The run page's Projection section reads what `bench project` wrote into RUN/projection/."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.report.projection_section import (
    dominant_by_world_size,
    efficiency_by_world_size,
    projection_section,
)


def _projection() -> pd.DataFrame:
    return pd.DataFrame({
        "network": ["measured"] * 3, "cell_id": ["a"] * 3, "world_size": [1, 2, 4],
        "efficiency_pct": [100.0, 80.0, None], "bottleneck": ["compute", "bandwidth", None],
        "predicted_step_ms": [10.0, 6.25, None], "reason": [None, None, "global batch does not divide"],
    })


def test_efficiency_table_keeps_the_last_predicted_bottleneck():
    table = efficiency_by_world_size(_projection())
    assert table.to_dict("records")[0]["eff_pct_ws2"] == 80.0
    assert table["bottleneck"].tolist() == ["bandwidth"] and pd.isna(table["eff_pct_ws4"].iloc[0])


def test_dominant_term_per_world_size():
    p = _projection().assign(dominant_term=["none", "straggler", None], straggler_ms=[0.0, 0.42, None],
                             exposed_comm_ms=[0.0, 0.1, None], interference_ms=0.0, host_floor_ms=0.0)
    table = dominant_by_world_size(p)
    assert table.to_dict("records") == [{"network": "measured", "cell_id": "a", "ws1": "none",
                                         "ws2": "straggler 0.42 ms"}]
    assert dominant_by_world_size(_projection()) is None  # written before the terms existed


def test_section_says_how_to_project_when_nothing_was_projected(tmp_path):
    sec = projection_section(tmp_path / "run", tmp_path / "report")
    assert "python -m bench project" in "".join(sec.md)


def test_section_shows_projection_and_validation(tmp_path):
    run, out = tmp_path / "run", tmp_path / "report"
    (run / "projection").mkdir(parents=True)
    _projection().to_csv(run / "projection" / "projection.csv", index=False)
    pd.DataFrame({"cell_id": ["b"], "world_size": [2], "measured_step_ms": [7.0], "predicted_step_ms": [6.3],
                  "error_pct": [-10.0]}).to_csv(run / "projection" / "validation.csv", index=False)
    md = "".join(projection_section(run, out).md)
    assert "median |error| 10.0 % over 1 cells" in md and "(signed median -10.0 %)" in md
    assert (out / "tables" / "projection_efficiency.csv").is_file()


def test_the_report_draws_the_projection_from_its_data_and_bench_project_writes_data_only(tmp_path):
    # `bench project` writes CSVs and notes; the report is the one place that renders the projection: the
    # figure (curves from projection.csv, measured points from the rows), the fitted network, the caveats
    import shutil

    from bench.__main__ import main as bench_main

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "traces" / "ddpbench-cpu-run", run)
    assert bench_main(["project", str(run), "--network", "h100-nvlink", "--world-sizes", "1,2,8"]) == 0
    assert sorted(p.name for p in (run / "projection").iterdir()) == [
        "network_fit.csv", "notes.txt", "projection.csv", "validation.csv"]
    assert bench_main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "report.md").read_text()
    projection = page[page.index("## Projection"):]
    assert (tmp_path / "report" / "plots" / "projection.png").is_file()
    assert "plots/projection.png" in projection
    assert "network fitted to this run's all-reduce probe" in projection
    assert "What dominates at each world size" in projection
    notes = (run / "projection" / "notes.txt").read_text().splitlines()
    general = [n for n in notes if not n.startswith("physics of ")]
    physics = [n.removeprefix("physics of ").split(": ", 1) for n in notes if n.startswith("physics of ")]
    assert general and all(f"- {n}" in projection for n in general)
    # one line per configuration: a table of configuration → where its terms came from, not bullets
    assert physics and all(f"- physics of {c}" not in projection and c in projection for c, _ in physics)
    assert (tmp_path / "report" / "tables" / "projection_physics.csv").is_file()


def test_a_strong_line_that_ends_where_its_batch_stops_dividing_is_marked():
    from bench.project.configuration import Configuration
    from bench.report.projection_figure import ends_early

    base = pd.Series({"cell_id": "c", "scaling": "strong"})
    config = Configuration(base, pd.DataFrame([base]), None, None)
    why = "global batch 8 per micro-step does not divide among 16 ranks"
    rows = pd.DataFrame({"network": "n", "cell_id": "c", "world_size": [1, 8, 16],
                         "efficiency_pct": [100.0, 40.0, None], "reason": [None, None, why]})
    drawn = rows.dropna(subset=["efficiency_pct"])
    assert ends_early(rows, config, "n", drawn)
    assert not ends_early(rows.iloc[:2], config, "n", drawn)  # nothing beyond: the line just stops there
    assert not ends_early(rows.assign(reason=None), config, "n", drawn)
