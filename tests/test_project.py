"""The projection engine (bench.project): fabrics, all-reduce costs, the step simulation, the α-β fit and the
bucket timeline, each against numbers worked out by hand in the comments."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.project.buckets import uniform_buckets
from bench.project.collectives import TREE_BW_FACTOR, allreduce_cost, hierarchical, ring, tree
from bench.project.configuration import Configuration
from bench.project.fit import FitError, fit_alpha_beta, measured_network
from bench.project.inputs import timeline_buckets
from bench.project.network import (
    A100_NVLINK,
    H100_NVLINK,
    Fabric,
    MiB,
    Network,
    custom_network,
    flat_fabric,
    preset_network,
)
from bench.project.project import project
from bench.project.simulate import Buckets, Compute, simulate_step

# ---- fabrics -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fabric", [H100_NVLINK, A100_NVLINK])
def test_nvlink_preset_returns_the_published_time_at_its_points(fabric):
    # At 8 ranks the model must give back nccl-tests' own time t = 2·7/8 · S / busbw at each published size.
    net = preset_network(fabric.name)
    for size, busbw in fabric.points:
        published_us = 1.75 * size / (busbw * 1e3)
        assert ring(net, size, 8).total_us == pytest.approx(published_us, rel=1e-12)


def test_bandwidth_interpolates_in_log_size_and_holds_at_the_ends():
    f = Fabric("t", ((MiB, 10.0), (4 * MiB, 30.0)), hop_us=0, base_us=0, tree_hop_us=0, tree_base_us=0,
               source="test")
    assert f.bandwidth_gbps(2 * MiB) == pytest.approx(20.0)   # halfway in log2: 20 → 21 → 22
    assert f.bandwidth_gbps(1024) == 10.0 and f.bandwidth_gbps(1 << 40) == 30.0


def test_a_published_point_faster_than_the_latency_is_refused():
    with pytest.raises(ValueError, match="ring latency"):
        Fabric("t", ((1024, 100.0),), hop_us=1.0, base_us=5.0, tree_hop_us=1, tree_base_us=5, source="t",
               ref_ranks=8)  # 1.75·1024 B / 100 GB/s = 0.018 µs < 5 + 14·1 µs


# ---- all-reduce costs --------------------------------------------------------------------------------


def test_ring_closed_form():
    # B = 10 GB/s, α = 5 µs per step, n = 4, S = 1e6 B: 2·3·5 = 30 µs + 1.5 · 1e6 / 1e4 = 150 µs.
    cost = ring(custom_network(10.0, 5.0), 1e6, 4)
    assert (cost.latency_us, cost.bandwidth_us) == pytest.approx((30.0, 150.0))


def test_tree_closed_form():
    # n = 8 flat: 2·floor(log2 8)·5 = 30 µs; 2·1e6 / (0.92 · 1e4) = 217.39 µs.
    cost = tree(custom_network(10.0, 5.0), 1e6, 8)
    assert (cost.latency_us, cost.bandwidth_us) == pytest.approx((30.0, 2e6 / (TREE_BW_FACTOR * 1e4)))


def two_level() -> Network:
    intra = flat_fabric("nvl", 100.0, 1.0, "test")
    inter = flat_fabric("net", 10.0, 10.0, "test")
    return Network("two-level", intra, inter, gpus_per_node=4)


def test_hierarchical_ring_and_auto_closed_form():
    # 2 nodes × 4 ranks, S = 8e6 B. Hierarchical: latency 2·(3·1) + 2·1·10 = 26; bandwidth
    # 2·3/4 · 8e6/1e5 = 120 plus 2·1/2 · 2e6/1e4 = 200 → 346 µs.
    # Ring: latency (14 − 2)·1 + 2·10 = 32; B = min(100, 4·10) = 40 → 1.75 · 8e6/4e4 = 350 → 382 µs.
    # Tree: 2·(3·1 + 1·10) = 26; 2·8e6 / (0.92·4e4) = 434.8 → 460.8 µs. auto picks hierarchical.
    net = two_level()
    h, r, t = hierarchical(net, 8e6, 8), ring(net, 8e6, 8), tree(net, 8e6, 8)
    assert (h.latency_us, h.bandwidth_us) == pytest.approx((26.0, 320.0))
    assert (r.latency_us, r.bandwidth_us) == pytest.approx((32.0, 350.0))
    assert (t.latency_us, t.bandwidth_us) == pytest.approx((26.0, 2 * 8e6 / (TREE_BW_FACTOR * 4e4)))
    assert allreduce_cost(net, 8e6, 8).algorithm == "hierarchical"


def test_one_rank_communicates_nothing():
    for algorithm in ("auto", "ring", "tree", "hierarchical"):
        assert allreduce_cost(preset_network("h100-nvlink"), 1e9, 1, algorithm).total_us == 0.0


def test_ranks_beyond_a_node_must_fill_whole_nodes():
    with pytest.raises(ValueError, match="not a multiple of gpus_per_node=8"):
        ring(preset_network("h100-nvlink"), 1e6, 12)


def test_cost_never_falls_as_ranks_grow():
    for name in ("h100-nvlink", "a100-nvlink", "ib-ndr400", "eth-100g"):
        net = preset_network(name)
        for size in (4e3, 1e6, 25 * MiB, 1e9):
            costs = [allreduce_cost(net, size, n).total_us for n in (1, 2, 4, 8, 16, 64, 256, 1024)]
            assert costs == sorted(costs), (name, size, costs)


# ---- the step ----------------------------------------------------------------------------------------

COMPUTE = Compute(forward_ms=10.0, backward_ms=20.0, optimizer_ms=5.0, grad_accum=1, per_rank_batch=8)
ZERO_LATENCY = custom_network(10.0, 0.0)  # n = 2: a ring all-reduce of S bytes takes S / 1e7 ms


def test_one_bucket_at_the_end_of_backward_is_fully_exposed():
    # 1e8 B on 2 ranks: 1 · 1e8 / 1e4 µs = 10 ms, started at the end of backward: step 10 + 20 + 10 + 5.
    step = simulate_step(COMPUTE, Buckets((10**8,), (1.0,), "t"), ZERO_LATENCY, 2)
    assert (step.step_ms, step.exposed_comm_ms, step.comm_ms) == pytest.approx((45.0, 10.0, 10.0))
    assert step.bottleneck == "overlap-limited"  # 10 ms fits in the 20 ms backward: the schedule lost it


def test_a_bucket_ready_at_the_start_hides_completely():
    step = simulate_step(COMPUTE, Buckets((10**8,), (0.0,), "t"), ZERO_LATENCY, 2)
    assert (step.step_ms, step.exposed_comm_ms) == pytest.approx((35.0, 0.0))
    assert step.bottleneck == "compute"


def test_buckets_queue_on_one_stream():
    # Ready at 10 and 20 ms, 15 ms each: 10 → 25, then max(20, 25) = 25 → 40: exposed 20, comm 30 > 20.
    step = simulate_step(COMPUTE, Buckets((15 * 10**7, 15 * 10**7), (0.5, 1.0), "t"), ZERO_LATENCY, 2)
    assert (step.step_ms, step.exposed_comm_ms, step.comm_ms) == pytest.approx((55.0, 20.0, 30.0))
    assert step.bottleneck == "bandwidth"


def test_only_the_last_micro_step_overlaps():
    # K = 2: backward 20 ms is two of 10 ms; one 4 ms bucket at the end of the last: 10 + 10 + 10 + 4 + 5.
    compute = Compute(10.0, 20.0, 5.0, grad_accum=2, per_rank_batch=8)
    step = simulate_step(compute, Buckets((4 * 10**7,), (1.0,), "t"), ZERO_LATENCY, 2)
    assert (step.step_ms, step.exposed_comm_ms) == pytest.approx((39.0, 4.0))


def test_world_size_one_is_the_compute_step():
    step = simulate_step(COMPUTE, Buckets((10**9,), (1.0,), "t"), None, 1)
    assert (step.step_ms, step.exposed_comm_ms, step.comm_ms) == (35.0, 0.0, 0.0)


def test_many_tiny_buckets_are_latency_bound():
    # 100 × 1 KB on 8 ranks at 100 µs per step: a ring takes 14 · 100 µs = 1.4 ms each, bandwidth ~0;
    # the tree 2 · log2(8) · 100 µs = 0.6 ms, which auto prefers.
    buckets, net = Buckets((1000,) * 100, (1.0,) * 100, "t"), custom_network(100.0, 100.0)
    step = simulate_step(COMPUTE, buckets, net, 8, "ring")
    assert step.bottleneck == "latency" and step.latency_ms == pytest.approx(140.0)
    auto = simulate_step(COMPUTE, buckets, net, 8)
    assert auto.algorithms == ("tree",) and auto.latency_ms == pytest.approx(60.0)


def test_more_bandwidth_is_never_slower():
    buckets = Buckets((25 * MiB, 25 * MiB, 10 * MiB), (0.3, 0.7, 1.0), "t")
    for n in (2, 8, 64):
        steps = [simulate_step(COMPUTE, buckets, custom_network(bw, 5.0), n).step_ms
                 for bw in (0.5, 1, 2, 5, 10, 50, 200)]
        assert steps == sorted(steps, reverse=True), (n, steps)


def test_compute_scales_with_the_per_rank_batch_except_the_optimizer():
    half = COMPUTE.at_batch(4)
    assert (half.forward_ms, half.backward_ms, half.optimizer_ms) == (5.0, 10.0, 5.0)


# ---- projection over world sizes -------------------------------------------------------------------


def configuration(scaling: str, per_rank: int, world_size: int = 1, engine: str = "torch") -> Configuration:
    base = pd.Series({"cell_id": "base", "engine": engine, "model": "mlp", "model_size": "tiny",
                      "bucket_cap_mb": 25.0, "precision": "fp32", "comm_dtype": "none", "grad_accum": 1,
                      "scaling": scaling, "per_rank_batch": per_rank, "world_size": world_size})
    compute = Compute(40.0, 80.0, 3.0, 1, per_rank)
    buckets = uniform_buckets(engine, [25 * MiB] * 4 + [2 * MiB], "test")
    return Configuration(base, pd.DataFrame([base]), compute, buckets)


SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


@pytest.mark.parametrize("name", ["h100-nvlink", "a100-nvlink", "ib-ndr400", "eth-100g"])
def test_strong_efficiency_never_above_100_and_never_rising(name):
    net = preset_network(name)
    rows = project(configuration("strong", 1024), name, lambda n, d: (net, name), SIZES, "auto")
    eff = [r["efficiency_pct"] for r in rows]
    assert eff[0] == pytest.approx(100.0)
    assert all(e <= 100.0 + 1e-9 for e in eff)
    assert all(b <= a + 1e-9 for a, b in zip(eff, eff[1:])), eff


def test_weak_efficiency_never_rising():
    net = preset_network("a100-nvlink")
    rows = project(configuration("weak", 64), "a100", lambda n, d: (net, "a100"), SIZES, "auto")
    eff = [r["efficiency_pct"] for r in rows]
    assert eff[0] == pytest.approx(100.0) and all(b <= a + 1e-9 for a, b in zip(eff, eff[1:]))


def test_strong_scaling_past_the_global_batch_is_a_row_with_a_reason():
    net = preset_network("h100-nvlink")
    rows = project(configuration("strong", 16), "h100", lambda n, d: (net, "h100"), [8, 16, 32], "auto")
    assert rows[1]["per_rank_batch"] == 1 and rows[1]["predicted_step_ms"] > 0
    assert "predicted_step_ms" not in rows[2]
    assert rows[2]["reason"] == "global batch 16 per micro-step does not divide among 32 ranks"


def test_uniform_buckets_follow_bytes_for_overlapping_engines_and_wait_for_the_others():
    assert uniform_buckets("overlap", [1, 3], "t").ready == (0.25, 1.0)
    assert uniform_buckets("bucketed", [1, 3], "t").ready == (1.0, 1.0)


# ---- the fit ----------------------------------------------------------------------------------------

SWEEP_SIZES = [4096 * 2**i for i in range(15)]  # 4 KiB .. 64 MiB, doubling


def test_fit_recovers_a_known_alpha_and_beta():
    alpha, slope = 25.0, 1 / 10e3  # 25 µs, 10 GB/s algbw
    fit = fit_alpha_beta(SWEEP_SIZES, [alpha + slope * s for s in SWEEP_SIZES])
    assert fit.alpha_us == pytest.approx(alpha, rel=1e-9)
    assert fit.algbw_gbps() == pytest.approx(10.0, rel=1e-9)
    assert fit.rms_residual_pct == pytest.approx(0.0, abs=1e-9) and fit.alpha_fitted


def test_fit_with_noise_reports_its_residual():
    # ±3 % alternating: α and β stay within a few percent, the residual says about 3 %.
    alpha, slope = 40.0, 1 / 2e3
    times = [(alpha + slope * s) * (1.03 if i % 2 else 0.97) for i, s in enumerate(SWEEP_SIZES)]
    fit = fit_alpha_beta(SWEEP_SIZES, times)
    assert fit.alpha_us == pytest.approx(alpha, rel=0.1)
    assert fit.algbw_gbps() == pytest.approx(2.0, rel=0.03)
    assert 2.0 < fit.rms_residual_pct < 4.0 and fit.max_residual_pct < 6.0


def test_fit_without_spread_sets_alpha_to_zero():
    fit = fit_alpha_beta([1000.0, 1000.0], [10.0, 12.0])
    assert fit.alpha_us == 0.0 and not fit.alpha_fitted
    assert fit_alpha_beta([5e5], [100.0]).us_per_byte == pytest.approx(100.0 / 5e5)


def test_fit_refuses_time_falling_with_size():
    with pytest.raises(FitError, match="does not grow"):
        fit_alpha_beta([1e3, 1e4, 1e5], [300.0, 200.0, 100.0])


def test_measured_network_reproduces_the_fit_at_its_world_size():
    fit = fit_alpha_beta(SWEEP_SIZES, [30.0 + s / 5e3 for s in SWEEP_SIZES])
    net = measured_network(fit, 4, "test")
    for s in (1e3, 1e6, 1e8):
        assert allreduce_cost(net, s, 4, "tree").total_us == pytest.approx(fit.time_us(s))  # ring only
    assert allreduce_cost(net, 1e6, 8).latency_us == pytest.approx(30.0 * 14 / 6)  # α per step × 2(n−1)


# ---- the bucket timeline ----------------------------------------------------------------------------


def test_timeline_takes_medians_and_drops_steps_with_another_bucket_count():
    rows = []
    for rank, ready0 in ((0, 2.0), (1, 4.0)):
        for step in (1, 2):
            rows += [{"cell_id": "c", "trace_file": f"r{rank}", "rank": rank, "step": step, "bucket": 0,
                      "bytes": 100, "ready_ms": ready0, "backward_ms": 10.0},
                     {"cell_id": "c", "trace_file": f"r{rank}", "rank": rank, "step": step, "bucket": 1,
                      "bytes": 300, "ready_ms": 12.0, "backward_ms": 10.0}]
    # A first step with one big bucket only (before torch DDP's rebuild): left out.
    rows.append({"cell_id": "c", "trace_file": "r0", "rank": 0, "step": 0, "bucket": 0, "bytes": 400,
                 "ready_ms": 9.0, "backward_ms": 10.0})
    buckets = timeline_buckets(pd.DataFrame(rows), "c")
    assert buckets.sizes == (100, 300)
    assert buckets.ready == (pytest.approx(0.3), 1.0)  # median of 0.2, 0.2, 0.4, 0.4; 1.2 clipped to 1
    assert timeline_buckets(pd.DataFrame(rows), "other") is None
    assert math.isclose(sum(buckets.sizes), 400)
