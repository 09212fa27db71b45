"""bench.run.estimate: the --dry-run wall-time estimate, hand-worked, and checked against recorded runs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from bench.config import config_from_dict, load_config, read_tables
from bench.matrix import MEMORY_STEPS, Cell, expand
from bench.run.estimate import (
    RATES,
    Rates,
    estimate_cell_seconds,
    estimate_seconds,
    estimate_step_seconds,
    expected_timed_steps,
    model_size_counts,
)
from bench.workloads import get_workload
from bench.workloads.mlp import MLPWorkload

ESTIMATE_DATA = Path(__file__).parent / "data" / "estimate"


def test_dry_run_says_the_expected_rounds(capsys, monkeypatch):
    # HAND (worst half-width 20 % / √n), steps of 0.24-0.30 s: target ±5 % is met at the checkpoint 20
    monkeypatch.setattr("bench.run.estimate.RATES", {"cpu": HAND})
    assert bench_main(["run", "--config", "cpu-smoke", "--dry-run", "--set", "matrix.engine=torch",
                       "--set", "run.target_ci_pct=5", "--set", "run.timed_steps=10"]) == 0
    assert ("timed rounds per cell expected: 20-20 (median 20), until ±5 % (run.target_ci_pct), at most 320 "
            "rounds or 60 s a group") in capsys.readouterr().out


# Round numbers for hand-worked estimates; bf16 twice fp32's rate, so a lookup by the wrong precision shows.
HAND = Rates(flops={"fp32": 1e12, "bf16": 2e12, "fp16": 2e12}, host_s_per_tensor=1e-3, floor_s_per_param=1e-9,
             opt_s_per_param=2e-9, comm_bytes_per_s=1e9, build_s_per_param=1e-8, cell_s=0.5, profile_s=3.0,
             launch_s=10.0, run_s=7.0, half_width_sqrt_n_pct=20.0)


def hand_cell(**kw) -> Cell:
    base = dict(engine="torch", model="mlp", model_size="tiny", world_size=4, bucket_cap_mb=25.0,
                precision="fp32", comm_dtype="none", grad_accum=2, scaling="weak", per_rank_batch=8,
                global_batch=64)
    return Cell(**(base | kw))


def test_step_estimate_hand_worked():
    # 1e7 parameters in 100 tensors, 1e10 FLOPs per sample.
    # floor = 1e-3 × 100 + 1e-9 × 1e7 = 0.11 s; compute at batch 8, fp32 = 1e10 × 8 / 1e12 = 0.08 s
    # step = 2 micro × max(0.08, 0.11) + optimizer 2e-9 × 1e7 + ring 2·3/4 × 4 B × 1e7 / 1e9 B/s
    #      = 0.22 + 0.02 + 0.06 = 0.30 s; without the all-reduce 0.24 s
    args = (1e10, 10_000_000, 100)
    assert estimate_step_seconds(HAND, hand_cell(), *args) == pytest.approx(0.30)
    assert estimate_step_seconds(HAND, hand_cell(), *args, sync=False) == pytest.approx(0.24)
    # batch 16: compute 0.16 s > floor: 2 × 0.16 + 0.02 + 0.06 = 0.40 s; bf16 halves the compute: floor again
    assert estimate_step_seconds(HAND, hand_cell(per_rank_batch=16), *args) == pytest.approx(0.40)
    bf16 = hand_cell(per_rank_batch=16, precision="bf16")
    assert estimate_step_seconds(HAND, bf16, *args) == pytest.approx(0.30)
    # world size 1: nothing all-reduced; 2 ranks: ring factor 1 → 0.04 s
    assert estimate_step_seconds(HAND, hand_cell(world_size=1), *args) == pytest.approx(0.24)
    assert estimate_step_seconds(HAND, hand_cell(world_size=2), *args) == pytest.approx(0.28)


def test_cell_and_sweep_estimate_hand_worked(monkeypatch):
    config = load_config("cpu-smoke", ["run.warmup_steps=5", "run.timed_steps=20", "run.repeats=1",
                                       "run.phase_steps=3", "run.compute_only_steps=10", "run.launches=1"])
    assert MEMORY_STEPS == 3
    # (5 + 20 + 3 + 3 memory-pass) synced steps × 0.30 + 10 compute-only × 0.24 + 2 builds × 1e-8 × 1e7
    # + 0.5 per cell = 9.3 + 2.4 + 0.2 + 0.5 = 12.4 s
    assert estimate_cell_seconds(config, HAND, hand_cell(), 1e10, 10_000_000, 100) == pytest.approx(12.4)
    # each repeat launch (run.launches): a build 0.1 + 0.5 + (5 warm-up + 20 timed) × 0.30 + its compute-only
    # rounds 10 × 0.24 = 10.5 s more
    three = dataclasses.replace(config, run=dataclasses.replace(config.run, launches=3))
    assert estimate_cell_seconds(three, HAND, hand_cell(), 1e10, 10_000_000, 100) == pytest.approx(
        12.4 + 2 * 10.5)
    # The sweep: one cell run, one launch, profiled (a build 0.1 s, export 3.0 s, warm-up 5 + profiled steps)
    one = load_config("cpu-smoke", ["matrix.engine=torch", "matrix.world_size=4", "matrix.grad_accum=2",
                                    "matrix.scaling=weak", "workload.per_rank_batch=8", "run.warmup_steps=5",
                                    "run.timed_steps=20", "run.repeats=1", "run.phase_steps=3",
                                    "run.compute_only_steps=10", "profile.cells=*", "run.launches=1"])
    monkeypatch.setattr("bench.run.estimate.model_size_counts", lambda config: (10_000_000, 100))
    monkeypatch.setattr(MLPWorkload, "train_flops_per_sample", lambda self, batch=None: 1e10)
    cells = expand(one)
    assert len(cells) == 1 and cells[0].per_rank_batch == 8
    profiled = 0.1 + 3.0 + (5 + one.profile.steps) * 0.30
    assert estimate_seconds(one, cells, HAND) == pytest.approx(7.0 + 10.0 + 12.4 + profiled)


def test_expected_timed_steps_hand_worked():
    # HAND: worst half-width 20 % / √n. Checkpoints 10, 20, 40, 80, 160 (max 160): 20/√n ≤ 2 needs n ≥ 100,
    # so 160 with no budget in the way; at target 5 (n ≥ 16) the checkpoint 20.
    def rounds(round_s, *overrides):
        config = load_config("cpu-smoke", ["run.timed_steps=10", "run.max_timed_steps=160",
                                           "run.max_group_s=100", *overrides])
        return expected_timed_steps(config, HAND, round_s)

    assert rounds(0.1, "run.target_ci_pct=2") == 160
    assert rounds(0.1, "run.target_ci_pct=5") == 20
    # budget: at 1 s a round, 80 rounds fit in 100 s and 160 do not (the worker's rule: elapsed 80 s + 80
    # more rounds at 1 s > 100 s), so it stops looking at 80 and fills the budget: 20 more rounds
    assert rounds(1.0, "run.target_ci_pct=2") == 100
    assert rounds(1.0, "run.target_ci_pct=0") == 10  # off: the fixed count
    assert expected_timed_steps(load_config("cpu-smoke", ["run.timed_steps=10"]), HAND, 1.0) == 10
    # the bounds of estimate_range: noise 0 stops at the minimum, unbounded noise at the cap or the budget
    config = load_config("cpu-smoke", ["run.timed_steps=10", "run.max_timed_steps=160", "run.max_group_s=100",
                                       "run.target_ci_pct=2"])
    assert expected_timed_steps(config, dataclasses.replace(HAND, half_width_sqrt_n_pct=0.0), 0.1) == 10
    assert expected_timed_steps(config, dataclasses.replace(HAND, half_width_sqrt_n_pct=math.inf), 0.1) == 160
    assert expected_timed_steps(config, dataclasses.replace(HAND, half_width_sqrt_n_pct=math.inf), 1.0) == 100


def test_a_gpu_dry_run_prints_one_figure_now_its_noise_is_measured_and_a_range_without(capsys, monkeypatch):
    """The GPU's step-time noise was measured on an H200 (RATES["cuda"].half_width_sqrt_n_pct: ±0.17 % after
    20 rounds of GPU-bound steps): the dry run prints one figure, every group at its minimum rounds. A
    device whose noise is not measured gets a range, from every group stopping at its minimum rounds to
    every group at its cap (gpu-node-quick at two world sizes and one bucket here, for speed)."""
    from bench.run import estimate
    from bench.run.estimate import estimate_range
    from bench.run.planner import plan

    assert RATES["cuda"].half_width_sqrt_n_pct == pytest.approx(0.17 * math.sqrt(20), rel=0.01)
    sets = ["matrix.world_size=1,8", "matrix.bucket_cap_mb=25", "run.target_ci_pct=2"]
    planned = plan("gpu-node-quick", sets, plan_only=True, gpus_per_node=8)
    point = estimate_seconds(planned.config, list(planned.cells))
    assert bench_main(["run", "--config", "gpu-node-quick", *(a for x in sets for a in ("--set", x)),
                       "--dry-run", "--plan-only", "--gpus-per-node", "8"]) == 0
    said = capsys.readouterr().out
    assert f"estimated wall time ~{point / 60:.1f} min" in said
    unmeasured = dataclasses.replace(RATES["cuda"], half_width_sqrt_n_pct=None)
    monkeypatch.setitem(estimate.RATES, "cuda", unmeasured)
    low, high = estimate_range(planned.config, list(planned.cells))
    assert low == pytest.approx(point, rel=0.01) and high > 1.1 * low
    assert bench_main(["run", "--config", "gpu-node-quick", *(a for x in sets for a in ("--set", x)),
                       "--dry-run", "--plan-only", "--gpus-per-node", "8"]) == 0
    assert f"estimated wall time {low / 60:.1f}-{high / 60:.1f} min" in capsys.readouterr().out


def test_model_size_counts_without_allocating():
    config = load_config("gpu-node", cuda_available=True)
    assert model_size_counts(config) == (361_823_040, 291)   # smollm2-360m, classification head
    assert model_size_counts(load_config("default", cuda_available=False)) == (3_684_362, 10)


def recorded(name: str):
    """A recorded run's resolved config and its finished cells (trimmed to the columns used here)."""
    tables = read_tables(ESTIMATE_DATA / name / "config.toml")
    # recorded before the adaptive rounds existed: they ran run.timed_steps × repeats, a fixed count
    tables.setdefault("run", {}).setdefault("target_ci_pct", 0)
    config = config_from_dict(tables)
    rows = [json.loads(line) for line in (ESTIMATE_DATA / name / "cells.jsonl").read_text().splitlines()]
    return config, rows


def cells_estimate(config, rates: Rates, rows) -> float:
    workload = get_workload(config.workload.model, config.workload.model_size, config.workload.options())
    n, t = model_size_counts(config)
    flops = workload.train_flops_per_sample()
    return sum(estimate_cell_seconds(config, rates, Cell.from_dict(r), flops, n, t) for r in rows)


def test_estimate_within_25_percent_of_make_bench_on_this_cpu():
    """`make bench` on the 2-core CPU machine (tests/data/estimate/README.md): 153.6 s wall in all."""
    config, rows = recorded("cpu-default")
    measured = sum(r["cell_wall_s"] for r in rows)
    assert cells_estimate(config, RATES["cpu"], rows) == pytest.approx(measured, rel=0.25)
    assert estimate_seconds(config, expand(config)) == pytest.approx(153.6, rel=0.25)


def test_estimate_within_25_percent_of_h100_runs():
    """The two H100 runs, which built every model on CPU (1.3-1.4 s each for 135M): that build cost in."""
    cpu_built = dataclasses.replace(RATES["cuda"], build_s_per_param=1.0e-8)
    config, rows = recorded("h100-default-partial")   # 32 cells before the run was stopped
    measured = sum(r["cell_wall_s"] for r in rows)
    assert cells_estimate(config, cpu_built, rows) == pytest.approx(measured, rel=0.25)
    # per precision too: fp32 (compute-bound at batch 64) and bf16 (host-bound) each
    for precision in ("fp32", "bf16"):
        some = [r for r in rows if r["precision"] == precision]
        assert cells_estimate(config, cpu_built, some) == pytest.approx(sum(r["cell_wall_s"] for r in some),
                                                                        rel=0.25)
    # the steps: fp32 at batch 64 is kernel-bound (the fp32 rate), bf16/fp16 host-bound (the floor)
    workload = get_workload(config.workload.model, config.workload.model_size, config.workload.options())
    n, t = model_size_counts(config)
    for r in rows:
        est = estimate_step_seconds(cpu_built, Cell.from_dict(r), workload.train_flops_per_sample(), n, t)
        if r["precision"] == "fp32" and r["per_rank_batch"] == 64:
            assert est * 1e3 == pytest.approx(r["step_time_ms_p50"], rel=0.10), r["cell_id"]
        if r["precision"] == "bf16":
            assert est * 1e3 == pytest.approx(r["step_time_ms_p50"], rel=0.15), r["cell_id"]
    config, rows = recorded("h100-diag")   # 12 cells, all profiled: 209 s in all
    assert estimate_seconds(config, expand(config, gpu_count=1), cpu_built) == pytest.approx(209, rel=0.25)


@pytest.mark.parametrize("preset", ["gpu-node", "gpu-node-quick", "default", "gpu-check"])
def test_gpu_presets_keep_the_reference_step_gpu_bound(preset):
    """Every profiled cell of the reference engine (plain torch DDP) on a GPU preset keeps the GPU busy
    ≥ 70 % of its micro-step by the estimate (compute / max(compute, host floor), the H200's bf16 rate);
    default's smollm2-135m at seq 128 and 8 samples a rank was host-bound."""
    from bench.run.estimate import gpu_busy_fraction

    config = load_config(preset, cuda_available=True)
    workload = get_workload(config.workload.model, config.workload.model_size, config.workload.options())
    flops, (n_params, n_tensors) = workload.train_flops_per_sample(), model_size_counts(config)
    cells = [c for c in expand(config) if config.profile.covers(c.cell_id) and c.is_baseline]
    busy = {c.cell_id: gpu_busy_fraction(RATES["cuda"], c, flops, n_params, n_tensors) for c in cells}
    assert cells and min(busy.values()) >= 0.7, busy
    old = load_config("default", ["workload.model_size=smollm2-135m", "workload.seq_len=128",
                                  "workload.global_batch=64", "matrix.scaling=strong,weak",
                                  "workload.per_rank_batch=8"], cuda_available=True)
    eight = next(c for c in expand(old) if c.world_size == 8 and c.per_rank_batch == 8 and c.is_baseline
                 and c.precision == "bf16")
    old_counts = model_size_counts(old)
    old_flops = get_workload("transformer", "smollm2-135m", old.workload.options()).train_flops_per_sample()
    # host-bound by far: a few % (the bf16 rate is the H200's at GPU-bound sizes; small matmuls run below
    # it, so the real share is higher: the H100 showed 9 % at 12 × 128 tokens, still host-bound)
    assert gpu_busy_fraction(RATES["cuda"], eight, old_flops, *old_counts) < 0.1


def test_the_parity_gate_is_counted_for_every_cell_but_plain_torch_ddp():
    """A gated cell costs GATE_STEPS teacher-forced steps of its three trainers (the reference in fp64 on
    CPU: twice a step): alone 4 × (1 + 1 + 2) × its step; in a group of 4 its own 4 steps and a quarter
    of the references' 12; plain torch DDP nothing."""
    from bench.config import load_config
    from bench.matrix import expand
    from bench.run import estimate
    from bench.worker import parity

    config = load_config("cpu-smoke", ["matrix.world_size=2", "matrix.engine=torch,fsdp2",
                                       "matrix.grad_accum=1",
                                       "matrix.scaling=strong"])
    torch_cell, fsdp2 = sorted(expand(config), key=lambda c: c.engine != "torch")
    rates = estimate.RATES["cpu"]
    assert estimate.gate_seconds(rates, torch_cell, 0.1, 10**6) == 0.0
    assert estimate.gate_seconds(rates, fsdp2, 0.1, 10**6) == pytest.approx(parity.GATE_STEPS * 4 * 0.1)
    assert estimate.gate_seconds(rates, fsdp2, 0.1, 10**6, 4) == pytest.approx(0.4 + 1.2 / 4)
    assert parity.GATE_STEPS == 4
