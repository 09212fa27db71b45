"""`bench project` what-if mode (bench/project/spec.py): a projection from a 1-GPU step time and a model,
no run; the same projection.csv columns as run mode; bad values exit 2 naming the key, nothing written."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.__main__ import main
from bench.project.columns import PROJECTION_COLUMNS
from bench.project.spec import SpecError, project_spec

# 250,000 params · 4 B = 1e6 B: one bucket (under the 1 MiB first bucket), ready at the end of backward.
# PCIe gen 4: 31.5 · 0.8 = 25.2 GB/s; ring on 2 ranks = 8.4 + 2·5.7 = 19.8 µs + 1e6 B / 25.2e3 B/µs =
# 39.683 µs, all exposed: step = 100 + 0.059483 ms.
HAND_STEP_2 = 100.0 + 0.0198 + 1e6 / 25.2e6


def test_project_spec_hand_worked():
    df = project_spec(params=250_000, step_ms=100.0, per_gpu_batch=100, network="pcie4", world_sizes=[1, 2],
                      step_cv=0.0, interference=0.0)
    assert list(df.columns) == list(PROJECTION_COLUMNS)
    by_n = df.set_index("world_size")
    assert by_n.loc[1, "predicted_step_ms"] == pytest.approx(100.0)
    assert by_n.loc[2, "predicted_step_ms"] == pytest.approx(HAND_STEP_2, rel=1e-9)
    assert by_n.loc[2, "efficiency_pct"] == pytest.approx(100 * 100.0 / HAND_STEP_2)
    assert by_n.loc[2, "dominant_term"] == "exposed_comm"
    # σ = 0.02 adds 0.02 · 100 ms · 1/√π = 1.1284 ms at 2 ranks (bench/project/physics.py)
    df = project_spec(params=250_000, step_ms=100.0, per_gpu_batch=100, network="pcie4", world_sizes=[2],
                      step_cv=0.02, interference=0.0)
    assert df.loc[0, "straggler_ms"] == pytest.approx(2.0 / 3.141592653589793 ** 0.5, rel=1e-6)


def test_compressed_gradients_halve_the_bytes():
    full = project_spec(params=250_000, step_ms=100.0, per_gpu_batch=100, network="pcie4", world_sizes=[2],
                        step_cv=0.0)
    half = project_spec(params=250_000, step_ms=100.0, per_gpu_batch=100, network="pcie4", world_sizes=[2],
                        step_cv=0.0, comm_dtype="fp16")
    assert half.loc[0, "comm_bandwidth_ms"] == pytest.approx(full.loc[0, "comm_bandwidth_ms"] / 2)


@pytest.mark.parametrize("keys, words", [
    (dict(step_ms=0), "step_ms=0"),
    (dict(network="nvlink9"), "network='nvlink9'"),
    (dict(precision="fp8"), "precision='fp8'"),
    (dict(world_sizes=[12]), "world_sizes"),
    (dict(colour="red"), "colour='red'"),
    (dict(model="resnet", size="resnet50"), "give exactly one of model"),
])
def test_bad_spec_values_name_the_key(keys, words):
    base = dict(params=1000, step_ms=10.0, per_gpu_batch=8)
    with pytest.raises(SpecError, match=words.replace("[", r"\[").replace("(", r"\(")):
        project_spec(**(base | keys))


def test_cli_spec_file_writes_projection_csv(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text('params = 250000\nstep_ms = 100.0\nper_gpu_batch = 100\nnetwork = "pcie4"\n'
                    'world_sizes = [1, 2]\nstep_cv = 0.0\n')
    assert main(["project", "--spec", str(spec), "--out", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "projection.csv")
    assert list(df.columns) == list(PROJECTION_COLUMNS)
    assert df.set_index("world_size").loc[2, "predicted_step_ms"] == pytest.approx(HAND_STEP_2, rel=1e-9)
    assert (tmp_path / "out" / "notes.txt").is_file()


@pytest.mark.parametrize("argv, words", [
    (["--params", "1000", "--step-ms", "-3", "--per-gpu-batch", "2"], "step_ms=-3.0"),
    (["--params", "1000", "--step-ms", "3", "--per-gpu-batch", "2", "--network", "x"], "network='x'"),
    (["--params", "1000", "--step-ms", "3"], "per_gpu_batch"),
])
def test_cli_bad_values_exit_2_before_writing(tmp_path, capsys, argv, words):
    assert main(["project", *argv, "--out", str(tmp_path / "out")]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_project_spec_is_the_package_api():
    import bench.project

    assert bench.project.project_spec is project_spec


@pytest.mark.parametrize("text, count", [("360M", 360_000_000), ("1.5B", 1_500_000_000), ("1e9", 10**9),
                                         ("250000", 250_000), ("7b", 7 * 10**9), (250_000, 250_000)])
def test_a_parameter_count_as_people_write_it(text, count):
    from bench.project.spec import parse_count

    assert parse_count("params", text) == count


def test_lists_of_settings_compare_in_one_call(tmp_path, capsys):
    argv = ["project", "--params", "250k", "--step-ms", "100", "--per-gpu-batch", "100", "--network", "pcie4",
            "--world-sizes", "2,4", "--bucket-cap-mb", "1,25,100", "--comm-dtype", "none,bf16",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    rows = pd.read_csv(tmp_path / "out" / "projection.csv")
    assert len(rows) == 3 * 2 * 2  # buckets × dtypes × world sizes
    assert list(dict.fromkeys(zip(rows["bucket_cap_mb"], rows["comm_dtype"]))) == [
        (1.0, "none"), (1.0, "bf16"), (25.0, "none"), (25.0, "bf16"), (100.0, "none"), (100.0, "bf16")]
    # each combination is the single what-if of its settings
    one = project_spec(params=250_000, step_ms=100.0, per_gpu_batch=100, network="pcie4", world_sizes=[2, 4],
                       bucket_cap_mb=25.0, comm_dtype="bf16")
    mine = rows[(rows["bucket_cap_mb"] == 25.0) & (rows["comm_dtype"] == "bf16")]
    assert list(mine["predicted_step_ms"]) == pytest.approx(list(one["predicted_step_ms"]))
    assert "6 what-ifs: bucket_cap_mb × comm_dtype" in capsys.readouterr().out
    assert main([*argv[:-2], "--comm-dtype", "none,fp8", "--out", str(tmp_path / "bad")]) == 2
    assert "comm_dtype='fp8'" in capsys.readouterr().err and not (tmp_path / "bad").exists()
