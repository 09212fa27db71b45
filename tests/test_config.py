"""bench.config and the CLI's validation: bad input → exit 2, a message naming key and value, no folder."""

from __future__ import annotations

import re
import tomllib

import pytest

from bench.__main__ import main as bench_main
from bench.config import (
    PG_TIMEOUT_SHARE,
    BenchConfig,
    ConfigError,
    config_from_dict,
    load_config,
    to_toml,
    usable_cpus,
)
from bench.matrix import expand
from bench.run.checks import check_device


def run_cli(*argv: str) -> int:
    return bench_main(["run", *argv])


@pytest.mark.parametrize(
    "overrides, key, value",
    [
        (["run.bogus=1"], "run.bogus", "1"),
        (["nosuch.key=1"], "nosuch", "1"),
        (["matrix.bucket_cap_mb=0"], "matrix.bucket_cap_mb", "0.0"),
        (["matrix.bucket_cap_mb=-5"], "matrix.bucket_cap_mb", "-5.0"),
        (["matrix.world_size=0"], "matrix.world_size", "0"),
        (["run.timed_steps=0"], "run.timed_steps", "0"),
        (["run.warmup_steps=1"], "run.warmup_steps", "1"),
        (["run.timed_steps=abc"], "run.timed_steps", "abc"),
        (["matrix.engine=torch,fsdp"], "matrix.engine", "fsdp"),
        (["workload.global_batch=3", "matrix.world_size=1,2"], "workload.global_batch", "3"),
        (["matrix.precision=fp16"], "matrix.precision", "fp16"),
        (["matrix.precision=tf32"], "matrix.precision", "tf32"),
        (["run.device=cuda"], "run.device", "cuda"),  # no GPU on the test machine
        (["workload.model=nosuchmodel"], "model", "nosuchmodel"),
        (["debug.fault=explode@x"], "debug.fault", "explode@x"),
        (["debug.fault=slow@x"], "debug.fault", "slow@x"),               # slow needs its milliseconds
        (["debug.fault=slow:abc@x"], "debug.fault", "slow:abc@x"),
        (["debug.fault=slow:-5@x"], "debug.fault", "slow:-5@x"),
        (["debug.fault=slow:nan@x"], "debug.fault", "slow:nan@x"),
        (["debug.fault=hang:5@x"], "debug.fault", "hang:5@x"),           # only slow takes a number
        (["debug.fault=slow:5"], "debug.fault", "slow:5"),               # no cell-id substring
        (["workload.fixed_cost_batch=0"], "workload.fixed_cost_batch", "0"),
    ],
)
def test_bad_values_exit_2_naming_key_and_value(tmp_path, capsys, overrides, key, value):
    out = tmp_path / "run"
    sets = [a for o in overrides for a in ("--set", o)]
    assert run_cli("--config", "cpu-smoke", *sets, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert key in err and value in err, err
    assert not out.exists()


def test_unknown_key_in_toml_file(tmp_path, capsys):
    preset = tmp_path / "p.toml"
    preset.write_text('[matrix]\nengine = ["torch"]\nbuckets = [1]\n')
    out = tmp_path / "run"
    assert run_cli("--config", str(preset), "--out", str(out)) == 2
    assert "matrix.buckets" in capsys.readouterr().err
    assert not out.exists()


def test_missing_preset_and_bad_toml(tmp_path, capsys):
    assert run_cli("--config", "no-such-preset") == 2
    assert "no-such-preset" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[matrix\n")
    assert run_cli("--config", str(bad)) == 2


def test_world_size_above_gpus():
    config = load_config("gpu-node", cuda_available=True)
    with pytest.raises(ConfigError, match=r"matrix.world_size=8: above the 4 GPUs"):
        check_device(config, gpu_count=4)
    check_device(config, gpu_count=8)
    check_device(config, gpu_count=4, nnodes=2)  # a plan for two 4-GPU nodes


def test_precedence_cli_over_toml_over_defaults(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('[run]\ntimed_steps = 7\nwarmup_steps = 4\n[on_cpu]\n"run.warmup_steps" = 3\n'
                      '[on_cuda]\n"run.warmup_steps" = 9\n')
    config = load_config(str(preset), ["run.timed_steps=5", "matrix.world_size=1,2,4"], cuda_available=False)
    assert config.run.timed_steps == 5          # CLI beats TOML
    assert config.run.warmup_steps == 3         # [on_cpu] beats the [run] table
    assert config.run.seed == 1234              # the default
    assert config.run.device == "cpu"           # auto resolved
    assert config.matrix.world_size == (1, 2, 4)
    assert load_config(str(preset), cuda_available=True).run.warmup_steps == 9
    assert load_config(str(preset), ["run.warmup_steps=6"], cuda_available=True).run.warmup_steps == 6


def test_cli_value_types():
    config = load_config("cpu-smoke", ["profile.enabled=false", "workload.model=transformer",
                                       "workload.seq_len=64", "matrix.bucket_cap_mb=[1, 2.5]",
                                       "matrix.comm_dtype=none,fp16"])
    assert config.profile.enabled is False
    assert config.workload.seq_len == 64
    assert config.matrix.bucket_cap_mb == (1.0, 2.5)
    assert config.matrix.comm_dtype == ("none", "fp16")
    with pytest.raises(ConfigError, match="profile.enabled='yes'"):
        load_config("cpu-smoke", ["profile.enabled=yes"])


def test_resolved_toml_round_trips():
    for preset, cuda in (("cpu-smoke", False), ("default", False), ("default", True), ("gpu-node", True),
                         ("gpu-node-quick", True)):
        config = load_config(preset, cuda_available=cuda)
        assert config_from_dict(tomllib.loads(to_toml(config))) == config


def test_defaults_are_valid_and_frozen():
    config = BenchConfig()
    with pytest.raises(AttributeError):
        config.run.timed_steps = 3  # type: ignore[misc]


def test_default_preset_chooses_device():
    cpu = load_config("default", cuda_available=False)
    gpu = load_config("default", cuda_available=True)
    assert (cpu.run.device, cpu.workload.model, cpu.matrix.world_size) == ("cpu", "mlp", (1, 2))
    assert gpu.run.device == "cuda" and gpu.workload.model == "transformer"
    assert set(cpu.matrix.engine) == {"torch", "naive", "bucketed", "overlap", "fsdp2"}  # fsdp2: peers slice
    assert len(cpu.matrix.bucket_cap_mb) == 2 and cpu.matrix.precision == ("fp32", "bf16")
    assert cpu.matrix.grad_accum == (1, 2)


def test_existing_folder_refused_and_resume_checks_config(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert run_cli("--config", "cpu-smoke", "--out", str(out)) == 2
    assert "already exists" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert run_cli("--config", "cpu-smoke", "--out", str(out), "--resume") == 2
    assert "no config.toml" in capsys.readouterr().err
    (out / "config.toml").write_text(to_toml(load_config("cpu-smoke")))
    assert run_cli("--config", "cpu-smoke", "--set", "run.timed_steps=9", "--out", str(out), "--resume") == 2
    assert "differs" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "keep.txt"]


def test_pg_timeout_is_below_the_watchdog():
    # A collective that never completes must raise in its rank before the watchdog kills the launch, so
    # the rank records which collective and since when (bench/worker/hangs.py): "auto" is 0.75 of the cell's
    # limit, the watchdog's shortest (30 s → 22.5 s; the first cell also gets startup_timeout_s)
    config = load_config("cpu-smoke", ["run.cell_timeout_s=30", "run.startup_timeout_s=20"])
    assert config.run.pg_timeout_s == "auto"
    assert config.run.watchdog_limit_s(first_cell=False) == 30 and config.run.watchdog_limit_s(True) == 50
    assert config.run.process_group_timeout_s == 30 * PG_TIMEOUT_SHARE == 22.5
    for value in ("51", "10"):  # a user's own value stands, above the watchdog too (which then ends it)
        explicit = load_config("cpu-smoke", ["run.cell_timeout_s=30", f"run.pg_timeout_s={value}"])
        assert explicit.run.process_group_timeout_s == float(value)
    with pytest.raises(ConfigError, match="run.pg_timeout_s='soon'"):
        load_config("cpu-smoke", ["run.pg_timeout_s=soon"])
    gpu = load_config("gpu-node", cuda_available=True)  # its watchdog: 600 s a cell
    assert gpu.run.process_group_timeout_s == 450 < gpu.run.watchdog_limit_s(first_cell=False)


def test_pg_timeout_of_zero_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli("--config", "cpu-smoke", "--set", "run.pg_timeout_s=0", "--out", str(out)) == 2
    assert "run.pg_timeout_s=0" in capsys.readouterr().err
    assert not out.exists()


def test_profile_cells_selects_cells_by_pattern(capsys):
    config = load_config("cpu-smoke", ["matrix.engine=torch,naive", "matrix.grad_accum=1,2",
                                       "profile.cells=*-ga1-*,naive-*"])
    assert config.profile.cells == ("*-ga1-*", "naive-*")
    profiled = {(c.engine, c.grad_accum) for c in expand(config) if config.profile.covers(c.cell_id)}
    assert profiled == {("torch", 1), ("naive", 1), ("naive", 2)}
    assert load_config("cpu-smoke").profile.cells == ("*",)  # default: every cell
    off = load_config("cpu-smoke", ["profile.enabled=false"])
    assert not any(off.profile.covers(c.cell_id) for c in expand(off))
    for preset in ("gpu-node", "gpu-node-quick"):
        gpu = load_config(preset, cuda_available=True)
        cells = [c for c in expand(gpu) if gpu.profile.covers(c.cell_id)]
        # 4 engines × 4 world sizes × strong and weak (the quick one: weak only)
        peers = [c for c in cells if c.option_tags()]  # gpu-node's peers slice (docs/peers.md)
        assert len(cells) - len(peers) == 16 * len(gpu.matrix.scaling)
        assert {c.engine for c in cells} == set(gpu.matrix.engine)
        assert {c.world_size for c in cells} == {1, 2, 4, 8}
    sets = ["matrix.scaling=strong", "profile.cells=*-ga1-*", "matrix.grad_accum=1,2", "matrix.engine=torch",
            "matrix.world_size=2"]
    assert run_cli("--config", "cpu-smoke", *[a for s in sets for a in ("--set", s)], "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [("[profiled]" in line) for line in lines if "-ga" in line] == [True, False]
    assert "(1 profiled)" in next(line for line in lines if "cells to run" in line)  # the count line


def test_profile_cells_must_name_patterns():
    with pytest.raises(ConfigError, match=r"profile.cells=\[\]: must list at least one pattern"):
        load_config("cpu-smoke", ["profile.cells=[]"])


def test_threads_per_rank_share_the_cpus_this_process_may_use(monkeypatch):
    # Under SLURM (or a cpuset) the affinity mask is the allocation; os.cpu_count() is the whole node.
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {4, 5, 6, 7}, raising=False)
    run = load_config("cpu-smoke", ["run.threads_per_rank=0"]).run
    assert usable_cpus() == 4 and run.threads_for(2) == 2 and run.threads_for(8) == 1
    assert load_config("cpu-smoke", ["run.threads_per_rank=3"]).run.threads_for(2) == 3  # as set
    monkeypatch.delattr("os.sched_getaffinity", raising=False)  # macOS: no affinity mask
    assert usable_cpus() == 64 and run.threads_for(2) == 32


@pytest.mark.parametrize("preset,minutes", [("gpu-node", 60), ("gpu-node-quick", 10),
                                            ("gpu-node-full", None)])
def test_gpu_node_presets_say_their_cell_count_and_estimate(preset, minutes):
    """Each GPU-node preset's comment states its real cell count and its --dry-run estimate on 8 GPUs (a
    single figure: the GPU's noise is measured, RATES["cuda"]); gpu-node gives the answer within the hour
    and gpu-node-quick a first look within 10 minutes (issue 43's goals), on gpu-node's model and sizing."""
    from pathlib import Path

    from bench.run.estimate import estimate_seconds
    from bench.run.planner import plan

    text = (Path(__file__).parents[1] / "bench" / "configs" / f"{preset}.toml").read_text()
    planned = plan(preset, [], plan_only=True, gpus_per_node=8)
    runnable = list(planned.runnable)
    stated_cells = int(re.search(r"# (\d+) cells \(", text)[1])
    assert stated_cells == len(expand(planned.config, gpu_count=8)) or stated_cells == len(runnable)
    seconds = estimate_seconds(planned.config, runnable)
    stated = re.search(r"`--dry-run` estimates ([\d.]+) (h|min)", text)
    unit = 3600 if stated and stated[2] == "h" else 60
    assert stated and float(stated[1]) * unit == pytest.approx(seconds, rel=0.05)
    if minutes:
        assert seconds < minutes * 60
    node = load_config("gpu-node", cuda_available=True).workload
    ours = planned.config.workload
    assert (ours.model, ours.model_size, ours.seq_len, ours.micro_batch) == (node.model, node.model_size,
                                                                              node.seq_len, node.micro_batch)


def test_slow_fault_hits_the_last_rank_of_matching_cells():
    from bench.config import DebugConfig

    debug = DebugConfig("slow:12.5@-ws2-")
    assert debug.fault_for("overlap-mlp.tiny-ws2-b25") == "slow" and debug.fault_for("x-ws1-") is None
    assert debug.slow_ms_for("overlap-mlp.tiny-ws2-b25", 1, 2) == 12.5   # the last rank
    assert debug.slow_ms_for("overlap-mlp.tiny-ws2-b25", 0, 2) == 0.0    # not the others
    assert debug.slow_ms_for("overlap-mlp.tiny-ws1-b25", 0, 1) == 0.0    # nor other cells
    assert DebugConfig("hang@x").slow_ms_for("x", 1, 2) == 0.0
