"""The projection beyond one node (issue 35): all-gather and reduce-scatter costs, NICs shared by a node's
GPUs, the sharded (FSDP) step, PowerSGD's messages, the systems of published tables, the one-node base and
its calibration, and the 90 % interval; each against numbers worked out by hand in the comments."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.project import interval
from bench.project.collectives import allgather_cost, hierarchical, reduce_scatter_cost, ring
from bench.project.configuration import Configuration, step_of
from bench.project.interval import Band, bounds, t1_relative_90
from bench.project.network import Network, custom_network, flat_fabric, preset_network
from bench.project.physics import OFF, Physics
from bench.project.powersgd import compress
from bench.project.project import project
from bench.project.sharded import Sharding, estimated_blocks, simulate_sharded
from bench.project.simulate import Buckets, Compute
from bench.report.projection_section import interval_by_world_size
from projection_lab import fitting
from projection_lab.fitting import fit_bands, held_out_bands, shortest
from projection_lab.published import (
    LAST_LINE,
    base_of,
    calibrate,
    predict_row,
    sharding_of,
    units_per_sample,
    validate,
)
from projection_lab.systems import system_of

ROOT = Path(__file__).resolve().parent.parent
MULTINODE = ROOT / "tests" / "data" / "published_multinode" / "train.csv"


def two_level(nics: int | None = None) -> Network:
    intra = flat_fabric("nvl", 100.0, 1.0, "test")
    inter = flat_fabric("net", 10.0, 10.0, "test")
    return Network("two-level", intra, inter, gpus_per_node=4, nics_per_node=nics)


# ---- collectives ---------------------------------------------------------------------------------------


def test_all_gather_and_reduce_scatter_closed_form():
    # Flat 10 GB/s, 5 µs per step, n = 4, S = 1e6 B: one ring pass, 3 steps = 15 µs; 3/4 · 1e6/1e4 = 75 µs.
    for cost in (allgather_cost(custom_network(10.0, 5.0), 1e6, 4),
                 reduce_scatter_cost(custom_network(10.0, 5.0), 1e6, 4)):
        assert (cost.latency_us, cost.bandwidth_us) == pytest.approx((15.0, 75.0))
    # 2 nodes × 4: (7 − 1)·1 + 1·10 = 16 µs; B = min(100, 4 NICs · 10) = 40 → 7/8 · 8e6/4e4 = 175 µs.
    cost = allgather_cost(two_level(), 8e6, 8)
    assert (cost.latency_us, cost.bandwidth_us) == pytest.approx((16.0, 175.0))
    assert allgather_cost(two_level(), 8e6, 1).total_us == 0.0


def test_a_node_with_fewer_nics_than_gpus_moves_less():
    # 2 NICs for 4 GPUs (DGX-1: 4 for 8): the ring's node bandwidth min(100, 2·10) = 20 GB/s →
    # 1.75 · 8e6/2e4 = 700 µs; hierarchical: 2·3/4 · 8e6/1e5 = 120 in the node + each GPU's share of the
    # NICs 2·10/4 = 5 GB/s for its 2e6 B shard, 2·1/2 · 2e6/5e3 = 400 µs.
    net = two_level(nics=2)
    assert ring(net, 8e6, 8).bandwidth_us == pytest.approx(700.0)
    assert hierarchical(net, 8e6, 8).bandwidth_us == pytest.approx(520.0)
    assert hierarchical(two_level(), 8e6, 8).bandwidth_us == pytest.approx(320.0)   # one NIC per GPU


# ---- the sharded step ----------------------------------------------------------------------------------


def _fsdp_compute() -> Compute:
    return Compute(forward_ms=4.0, backward_ms=8.0, optimizer_ms=0.0, grad_accum=1, per_rank_batch=1)


def test_full_shard_step_by_hand():
    # 2 ranks at 1 GB/s, no latency; 2 blocks of 1e6 fp32 parameters: every all-gather and reduce-scatter
    # of 4e6 B costs 1/2 · 4e6 B / 1e3 B/µs = 2 ms. Block compute: forward 2 ms, backward 4 ms each.
    # forward   AG1 0–2; block 1 2–4 (issues AG2: 2–4); block 2 4–6
    # backward  AG2 6–8; block 2 8–12 (issues AG1: 8–10); RS2 12–14; block 1 12–16; RS1 16–18
    # step 18 ms against 12 of compute: exposed 6; six collectives, 12 ms of communication.
    step = simulate_sharded(_fsdp_compute(), (1_000_000, 1_000_000), Sharding("full", 4, 4),
                            custom_network(1.0, 0.0), 2, OFF)
    assert (step.step_ms, step.exposed_comm_ms, step.comm_ms) == pytest.approx((18.0, 6.0, 12.0))
    assert step.algorithms == ("all_gather", "reduce_scatter")


def test_shard_grad_op_and_no_sync_by_hand():
    # SHARD_GRAD_OP keeps the gathered blocks for backward: forward as above (ends 6), then block 2 6–10,
    # RS2 10–12, block 1 10–14, RS1 14–16: 16 ms.
    net = custom_network(1.0, 0.0)
    step = simulate_sharded(_fsdp_compute(), (1_000_000, 1_000_000), Sharding("grad_op", 4, 4), net, 2, OFF)
    assert step.step_ms == pytest.approx(16.0)
    # two micro-steps under no_sync: the first forward+backward 0–12 (its all-gathers as above, no RS),
    # the second 12–24 with AG1 12–14 → block 1 14–16 ... RS1 28–30: the first micro-step's forward waits
    # on its all-gather (2 ms) and so does the second's, and only the last reduces: 6 + 2·... by the loop:
    compute = Compute(8.0, 16.0, 0.0, 2, 1)
    once = simulate_sharded(compute, (1_000_000, 1_000_000), Sharding("grad_op", 4, 4, False), net, 2, OFF)
    every = simulate_sharded(compute, (1_000_000, 1_000_000), Sharding("grad_op", 4, 4, True), net, 2, OFF)
    assert every.step_ms - once.step_ms == pytest.approx(2.0)   # the first micro-step's RS1 is exposed
    assert once.comm_ms == pytest.approx(12.0) and every.comm_ms == pytest.approx(16.0)


def test_one_rank_shards_nothing_and_blocks_follow_the_transformer_estimate():
    step = simulate_sharded(_fsdp_compute(), (10, 10), Sharding("full", 2, 2), None, 1, OFF)
    assert (step.step_ms, step.comm_ms) == (12.0, 0.0)
    # P = 12·L·(128 L)²: 6.66e9 → 32 layers (MPT-7B's), 125e6 → 9 (MPT-125M has 12: an estimate)
    assert estimated_blocks(6_658_859_008) == 32 and estimated_blocks(125_311_488) == 9
    with pytest.raises(ValueError, match="sharding mode 'zero4'"):
        Sharding("zero4", 2, 2)


def test_hybrid_shard_all_reduces_the_shard_between_nodes():
    # 2 nodes × 4 ranks; a block of 4e6 B: RS in the node (4 ranks, 3/4 · 4e6/1e5 = 30 µs, 3 µs latency),
    # then the shard (1e6 B) all-reduced between the 2 nodes on each GPU's share of 4 NICs · 10 / 4 =
    # 10 GB/s: 2·1/2 · 1e6/1e4 = 100 µs + 2·1·10 µs.
    compute = Compute(0.0, 0.001, 0.0, 1, 1)
    full = simulate_sharded(compute, (1_000_000,), Sharding("full", 4, 4), two_level(), 8, OFF)
    hybrid = simulate_sharded(compute, (1_000_000,), Sharding("hybrid", 4, 4), two_level(), 8, OFF)
    # full: AG forward + AG backward + RS, each 7/8 · 4e6/4e4 = 87.5 µs + 16 µs latency
    assert full.comm_ms == pytest.approx(3 * (87.5 + 16.0) / 1e3)
    # hybrid: two in-node AGs (30 + 3 µs each), the in-node RS (33 µs), the shard's all-reduce (120 µs)
    assert hybrid.comm_ms == pytest.approx((3 * 33.0 + 120.0) / 1e3)


# ---- PowerSGD ------------------------------------------------------------------------------------------


def test_powersgd_messages_and_flops_by_hand():
    # rank 4. (64, 32): (64 + 32)·4·2 = 768 < 2048 → compressed: P 64·4 = 256, Q 32·4 = 128 elements;
    # FLOPs 3 · 2·64·32·4 + 2·64·4² = 49,152 + 2,048. (64,): (64 + 1)·1·2 = 130 ≥ 64 → plain.
    # (10, 3): r = 3, (13)·3·2 = 78 ≥ 30 → plain. Messages (fp32): 64·4, 256·4, 128·4; then 30·4.
    out = compress([[(64, 32), (64,)], [(10, 3)]], 4)
    assert out.messages == (256, 1024, 512, 120) and out.bucket_of == (0, 0, 0, 1)
    assert out.flops == 51_200
    with pytest.raises(ValueError, match="powersgd_rank=0"):
        compress([[(4, 4)]], 0)


# ---- published systems, bases and calibration ------------------------------------------------------------


def test_systems_read_from_the_tables_text():
    dgx = system_of("A100-SXM4-80GB", "NVLink3/NVSwitch intra-node; inter-node NOT STATED in README (DGX "
                    "A100 reference config: 8x 200 Gb/s HDR InfiniBand ConnectX-6 per node)", 64, 8)
    assert (dgx.intra, dgx.inter.name, dgx.nics_per_node, dgx.gpus_per_node) == ("a100-nvlink", "ib-hdr200",
                                                                                 8, 8)
    assert "not stated by the table" in dgx.inter_why
    # 25 GB/s line × 0.94 = 23.5 GB/s per NIC
    assert dgx.inter.bandwidth_gbps(1e6) == pytest.approx(23.5)
    roce = system_of("A100-40GB (table says a100_40gb)",
                     "1600 Gbps node-node interconnect (RoCE); intra-node not stated", 128, 16)
    assert roce.intra == "a100-nvlink" and "form factor not stated" in roce.intra_why
    assert roce.inter.name == "roce-200g" and roce.nics_per_node is None and "stated" in roce.inter_why
    dgx1 = system_of("V100-SXM2-32GB", float("nan"), 32, 4)
    assert (dgx1.intra, dgx1.inter.name, dgx1.nics_per_node) == ("v100-dgx1", "ib-edr100", 4)
    assert "the vendor's reference configuration, DGX-1" in dgx1.inter_why
    ndr = system_of("H100-SXM5-80GB", "NVLink 4; NDR 400 Gb/s per GPU", 64, 8)
    assert (ndr.intra, ndr.inter.name, ndr.nics_per_node) == ("h100-nvlink", "ib-ndr400", None)
    unknown = system_of("Mystery-GPU", "", 4, float("nan"))
    assert unknown.intra == "pcie4" and unknown.gpus_per_node == 4
    # Gaudi 2: the all-to-all box (21 × 12.5 GB/s × 512.96/525 = 256.5 GB/s) and 3 × 100 Gb/s RoCE out
    gaudi = system_of("Intel Gaudi2 HL-225", "", 64, 8)
    assert (gaudi.intra, gaudi.inter.name) == ("gaudi2", "roce-300g")
    assert gaudi.network().intra.bandwidth_gbps(1e8) == pytest.approx(262.5 * 512.96 / 525)
    assert system_of("MI300X", "8x 400G RoCE", 32, 4).inter.name == "roce-400g"
    assert system_of("H100", "2x 100 GbE per node", 16, 2).nics_per_node == 2


def _row(gpus: int, throughput: float, nodes: int = 1, **over) -> pd.Series:
    base = dict(source_id="S", model="M", params=100_000_000, framework="PyTorch DDP",
                hardware="A100-SXM4-80GB",
                interconnect="NVSwitch; 8x 200 Gb/s HDR InfiniBand per node", precision="amp_fp16",
                per_gpu_batch=32, grad_accum=1, gpus=gpus, nodes=nodes, throughput=throughput,
                throughput_unit="sequences/s", notes="")
    return pd.Series(base | over)


def test_calibration_takes_the_bases_own_communication_out():
    # A 16-GPU base (2 nodes): the micro-step m that simulates to its published step, simulated again,
    # gives that step back; a base step shorter than its communication cannot be calibrated.
    net = system_of("A100-SXM4-80GB", "8x 200 Gb/s HDR", 16, 2).network()
    physics = Physics()
    m = calibrate(120.0, 2, 32, 100_000_000, None, net, 16, physics)
    from projection_lab.published import _compute, _simulate

    assert _simulate(_compute(m, 2, 32), 100_000_000, None, net, 16, physics).step_ms == pytest.approx(120.0,
                                                                                                      rel=1e-9)
    assert m < 60.0
    from projection_lab.published import Skip

    with pytest.raises(Skip, match="shorter than its modelled communication"):
        calibrate(0.01, 1, 32, 10_000_000_000, None, net, 16, physics)


def test_a_multi_node_row_is_predicted_from_the_groups_one_node_row():
    group = pd.DataFrame([_row(1, 1000.0), _row(8, 7200.0), _row(16, 14000.0, nodes=2)])
    assert int(base_of(group, group.iloc[2])[0]["gpus"]) == 8
    assert int(base_of(group, group.iloc[1])[0]["gpus"]) == 1
    preds, skipped, eligible = validate(group, OFF)
    assert eligible == 2 and not skipped
    across = [p for p in preds if int(p.row["gpus"]) == 16][0]
    assert across.regime == "inter-node" and across.published_eff == pytest.approx(14000 / 16 / (7200 / 8))


def test_strong_scaling_groups_keep_their_changing_batch_and_accumulation():
    strong = "STRONG SCALING: global batch fixed"
    group = pd.DataFrame([_row(8, 8000.0, grad_accum=8, notes=strong),
                          _row(16, 15000.0, nodes=2, per_gpu_batch=16, grad_accum=8, notes=strong)])
    preds, skipped, _ = validate(group, OFF)
    assert not skipped and len(preds) == 1
    p = preds[0]
    # the base's step: 32 · 8 sequences per GPU at 1,000 per GPU per second = 256 ms, so a micro-step of 32
    # is just under 32 ms once its own communication is taken out; the row's 8 micro-steps of 16: 128 ms
    assert p.t1_ms == pytest.approx(128.0, rel=0.01) and p.t1_ms < 128.0


def test_sharding_and_units_from_the_rows_text():
    fsdp = _row(16, 1.0, framework="Composer + PyTorch FSDP", precision="bf16_pure",
                notes="FSDP sharding FULL_SHARD, MP mode PURE")
    sharding, _ = sharding_of(fsdp)
    assert (sharding.mode, sharding.param_bytes, sharding.grad_bytes) == ("full", 2, 2)
    default = sharding_of(fsdp.copy().replace("FSDP sharding FULL_SHARD, MP mode PURE",
                                              "SHARD_GRAD_OP, MP mode DEFAULT"))[0]
    assert (default.mode, default.param_bytes, default.grad_bytes) == ("grad_op", 2, 4)
    assert sharding_of(_row(16, 1.0, framework="DeepSpeed ZeRO-3"))[0].mode == "full"
    assert sharding_of(_row(16, 1.0))[0] is None
    assert units_per_sample("MPT-7b seq2048", "tokens/s")[0] == 2048.0
    assert units_per_sample("MPT-7b seq2048", "tokens/s/GPU")[0] == 2048.0
    assert units_per_sample("AnyNet", "img/sec")[0] == 1.0
    assert units_per_sample("Llama 3 8B", "wps per GPU", "local batch 1; seq_len=8192")[0] == 8192.0
    assert units_per_sample("Llama 3 8B", "tokens per second", "seq len 2048, FSDP")[0] == 2048.0
    assert units_per_sample("WaveGlow", "samples/s")[0] == 16000.0   # a model's own rule first
    # a per-GPU throughput is not divided by the GPUs again
    from projection_lab.published import per_gpu

    assert per_gpu(_row(16, 500.0, throughput_unit="sequences/s per GPU"), 1.0) == 500.0
    assert per_gpu(_row(16, 500.0), 1.0) == 500.0 / 16


def test_fsdp_rows_are_predicted_as_sharded():
    fsdp = dict(framework="Composer + PyTorch FSDP", precision="bf16_pure", throughput_unit="tokens/s",
                model="X seq2048", notes="FULL_SHARD, MP mode PURE", params=1_000_000_000, per_gpu_batch=8,
                interconnect="1600 Gbps node-node interconnect (RoCE)")
    p = predict_row(_row(32, 800_000.0, nodes=4, **fsdp), _row(8, 205_000.0, **fsdp), Physics())
    assert p.regime == "fsdp" and 0.9 < p.predicted_eff < 1.0 and p.held_out == ""


# ---- the interval --------------------------------------------------------------------------------------


def test_shortest_band_holds_the_conformal_count():
    # n = 5, level 0.6: k = ⌈0.6 · 6⌉ = 4 values; windows [0, 3] (width 3) and [1, 10] (9): [0, 3].
    assert shortest([10.0, 0.0, 2.0, 1.0, 3.0], 0.6) == (0.0, 3.0)
    assert shortest([1.0, 2.0], 0.9) == (1.0, 2.0)   # k > n: all of them


def test_bands_pool_a_regime_of_too_few_sources_and_hold_out_sources():
    rows = [(src, "nvlink", sign * 0.01 * i) for src, sign in (("A", -1), ("B", 1), ("D", 1))
            for i in range(20)]
    rows += [("C", "fsdp", 0.0) for _ in range(20)]
    bands = fit_bands(rows, 0.9)
    assert bands["fsdp"].pooled and not bands["nvlink"].pooled
    assert (bands["fsdp"].low, bands["fsdp"].high) == (bands["pooled"].low, bands["pooled"].high)
    loso = held_out_bands(rows, 0.9)
    assert loso["A"]["nvlink"].pooled   # without A, nvlink has two sources left: not checkable, pooled
    assert not loso["C"]["nvlink"].pooled and loso["C"]["nvlink"].low >= -0.19
    # a band per regime at its own level: nvlink at 0.5 holds ⌈0.5·61⌉ = 31 of its 60 residuals
    narrow = fit_bands(rows, {"pooled": 0.9, "nvlink": 0.5})["nvlink"]
    assert narrow.high - narrow.low < bands["nvlink"].high - bands["nvlink"].low


def test_levels_are_raised_until_held_out_sources_fall_inside():
    # four sources of 20 residuals each (0, 0.001, … 0.019), shifted by 0, 0.002, 0.004, 0.006: a band
    # fitted on three of them misses the held-out one's edge; held-out coverage 80 % at level 0.85 (a band
    # holding ⌈0.85 · 61⌉ = 52 of the other 60), 85.0 % at 0.90, 86.25 % at 0.91, 88.75 % at 0.92: the
    # first at or above HELD_OUT (87 %), so the calibrated level is 0.92
    rows = [(src, "nvlink", off + 0.001 * i) for src, off in zip("ABCD", (0.0, 0.002, 0.004, 0.006))
            for i in range(20)]
    assert interval.HELD_OUT == 0.87
    assert fitting.calibrated_levels(rows)["nvlink"] == (0.92, 0.8875)
    assert fitting.held_out_coverage(rows, {"pooled": 0.9, "nvlink": 0.85}, ["nvlink"]) == 0.80
    assert fitting.held_out_coverage(rows, {"pooled": 0.9, "nvlink": 0.90}, ["nvlink"]) == 0.85


def test_interval_bounds_and_t1():
    band = Band("nvlink", 100, -0.1, 0.05)
    assert bounds(80.0, band, 0.02) == pytest.approx((80 * math.exp(-0.12), 80 * math.exp(0.07)))
    assert band.width_points(80.0) == pytest.approx(80 * (math.exp(0.05) - math.exp(-0.1)))
    # a 95 % half-width of 1.96 % is a 90 % one of 1.645 %
    assert t1_relative_90(1.96) == pytest.approx(0.0196 * 1.644854 / 1.959964, rel=1e-6)
    assert t1_relative_90(None) == 0.0


def test_a_band_is_in_units_of_the_models_predicted_loss():
    # issue 44: from the base alone a residual is measured in units of s = max(1 %, 1 − predicted
    # efficiency); anchored in plain ln units
    assert interval.scale_of("", 0.96) == pytest.approx(0.04)
    assert interval.scale_of(interval.OTHER_RECIPE, 0.90) == pytest.approx(0.10)
    assert interval.scale_of("", 0.995) == 0.01   # the floor
    assert interval.scale_of(interval.ANCHORED, 0.90) == 1.0
    # beyond the predicted losses the corpora hold (SCALE_CAP), the scale is held at that edge: a 60 %
    # across nodes is scaled as 95.4 % (0.046), not 0.40 (a band of −11.7 s would reach 1 % of 60 %)
    assert interval.scale_of("", 0.60, "inter-node") == interval.SCALE_CAP["inter-node"] == 0.046
    assert interval.scale_of("", 0.97, "inter-node") == pytest.approx(0.03)  # inside: its own
    assert interval.scale_of("", 0.60) == pytest.approx(0.40)  # no regime named: no edge
    with pytest.raises(ValueError, match="basis='sideways'"):
        interval.scale_of("sideways", 0.9)
    # three sources' rows: predicted 98 % (s 0.02) published 2 % slower, r = ln(0.98) ≈ −0.0202 → −1.01 s;
    # predicted 90 % (s 0.10) published 20 % slower, r = ln(0.8) ≈ −0.223 → −2.23 s; predicted 95 % (s 0.05)
    # exactly right → 0. Scaled, the window holding all three is [−2.23, 0] (in s).
    rows = [fitting.Residual(src, "nvlink", math.log(pub / pred), "", interval.cap_of(pred),
                              interval.scale_of("", pred))
            for src, pred, pub in (("A", 0.98, 0.98 * 0.98), ("B", 0.90, 0.90 * 0.8), ("C", 0.95, 0.95))]
    pooled = fit_bands(rows, 0.99)["pooled"]
    assert (pooled.low, pooled.high) == pytest.approx((math.log(0.8) / 0.10, 0.0))
    # the row the model predicts near linear gets the narrow interval: at 98 %, [98 · e^(−2.23·0.02), 98]
    # = [93.7, 98.0] (4.3 points); at 90 %, [90 · 0.8, 90] = [72, 90] (18 points)
    assert bounds(98.0, pooled, 0.0, 100.0, 0.02) == pytest.approx((98 * 0.8 ** 0.2, 98.0))
    assert pooled.width_points(98.0, 0.02) == pytest.approx(98 * (1 - 0.8 ** 0.2))
    assert pooled.width_points(90.0, 0.10) == pytest.approx(18.0)
    assert pooled.contains(math.log(0.8), interval.cap_of(0.9), 0.10)
    assert not pooled.contains(math.log(0.8), interval.cap_of(0.98), 0.02)


def _config(sharded: bool) -> Configuration:
    base = pd.Series({"cell_id": "c", "engine": "fsdp2" if sharded else "torch", "model": "m",
                      "model_size": "s", "bucket_cap_mb": 25.0, "precision": "bf16", "comm_dtype": "none",
                      "grad_accum": 1, "scaling": "weak", "per_rank_batch": 8, "world_size": 1,
                      "step_time_half_width_pct": 2.0})
    compute = Compute(100.0, 200.0, 10.0, 1, 8)
    buckets = Buckets((400_000_000,), (1.0,), "test")
    shard = (Sharding("full", 2, 4, False), (50_000_000, 50_000_000)) if sharded else None
    return Configuration(base, pd.DataFrame([base]), compute, buckets, sharded=shard)


@pytest.mark.parametrize("sharded", [False, True])
def test_every_projected_row_carries_its_interval(sharded):
    net = preset_network("a100-nvlink", 8, "ib-hdr200")
    rows = project(_config(sharded), "a100-nvlink", lambda n, d: (net, net.label), [1, 8, 64], "auto",
                   Physics())
    one, node, many = rows
    # one rank: efficiency exactly 100, samples/s within T1's 90 % interval (2 % · 1.645/1.96)
    assert one["efficiency_pct_low"] == one["efficiency_pct_high"] == 100.0
    assert one["predicted_samples_per_s_high"] / one["predicted_samples_per_s"] == pytest.approx(
        math.exp(0.02 * interval.HALF_90 / interval.HALF_95))
    stored = interval.read_bands()[0]
    for row, regime in ((node, "fsdp" if sharded else "nvlink"), (many, "fsdp" if sharded else "inter-node")):
        band = stored[regime]
        assert row["interval_regime"].startswith(regime)
        # the band in units of the row's predicted loss, 1 − efficiency (at least 1 %, at most the largest
        # loss the regime's corpus rows reach: SCALE_CAP)
        eff, samples = row["efficiency_pct"], row["predicted_samples_per_s"]
        s = min(max(0.01, 1 - eff / 100), interval.SCALE_CAP[regime])
        assert row["efficiency_pct_low"] == pytest.approx(eff * math.exp(band.low * s))
        # never past the physical limit: 100 % efficiency, and for samples/s N × T1's rate at the fast end
        # of T1's own interval (samples / efficiency is the linear N × T1 rate)
        t1 = 0.02 * interval.HALF_90 / interval.HALF_95
        assert row["efficiency_pct_high"] == pytest.approx(min(100.0, eff * math.exp(band.high * s)))
        linear = samples / (eff / 100) * math.exp(t1)
        assert row["predicted_samples_per_s_high"] == pytest.approx(
            min(linear, samples * math.exp(band.high * s + t1)))
        assert row["predicted_samples_per_s_low"] < row["predicted_samples_per_s"] <= \
            row["predicted_samples_per_s_high"]
    if sharded:
        assert node["algorithm"] == "all_gather+reduce_scatter"
        step = step_of(_config(True), _config(True).compute, net, 8, "auto", OFF)
        assert step.comm_ms > 0


def test_report_quotes_the_interval():
    projection = pd.DataFrame({"network": ["n", "n"], "cell_id": ["c", "c"], "world_size": [1, 8],
                               "efficiency_pct": [100.0, 83.4], "efficiency_pct_low": [100.0, 76.2],
                               "efficiency_pct_high": [100.0, 88.9],
                               "interval_regime": ["none (one rank: T1's interval)", "nvlink"]})
    table = interval_by_world_size(projection)
    assert table.to_dict("records")[0] == {"network": "n", "cell_id": "c", "ws1": "100 % (100–100)",
                                           "ws8": "83 % (76–89)", "error band": "nvlink"}
    assert interval_by_world_size(projection.drop(columns=["efficiency_pct_low"])) is None
    # a projection.csv written before the limit (an anchored 95 % [70, 104]) is quoted at most 100 %
    old = projection.assign(efficiency_pct=[100.0, 101.0], efficiency_pct_low=[100.0, 70.0],
                            efficiency_pct_high=[100.0, 104.0])
    assert interval_by_world_size(old).to_dict("records")[0]["ws8"] == "100 % (70–100)"


def test_the_reports_measured_efficiency_interval_stops_at_100(tmp_path):
    # weak scaling, 64 per rank: 100 ms on one rank, 101 ms on two (efficiency 100/101 = 99.0 %), its 95 %
    # interval 98–104 ms: efficiency 99.0 · 101/104 = 96.2 % to 99.0 · 101/98 = 102.0 %, cut at 100 %
    from report_fixtures import row, write_run

    from bench.advise import api as advise
    from bench.report.answer_section import headline_numbers
    from bench.run_folder import load_run

    rows = [row("torch", 1, 100.0, scaling="weak", per_rank_batch=64, compute_only_ms=100.0),
            row("torch", 2, 101.0, scaling="weak", per_rank_batch=64, compute_only_ms=100.0)]
    for r, (low, high) in zip(rows, ((99.0, 101.0), (98.0, 104.0))):
        r.update(step_time_ms_ci95_low=low, step_time_ms_ci95_high=high)
    run = write_run(tmp_path / "results" / "weak", rows)
    numbers = headline_numbers(load_run(run).results, advise.run(run, target=None, write=False).table)
    card = numbers[numbers["name"] == "weak scaling efficiency"].iloc[0]
    assert (card["value"], card["interval"]) == ("99.0 %", "95 % interval 96.2–100.0 %")


# ---- the corpora ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_validation_on_the_multinode_corpus():
    """The in-project multi-node corpus through the script, from the base alone (the last line): the issue's
    coverage (≥ 80 % of rows with a base) and median (≤ 5 %) goals, the mean, held-out inside-interval rate
    and median width as measured (docs/projection.md: 8.0 %, 89.8 %, 23.9 points; issue 44's first pass had
    88.1 % at 24.2, which the width may not exceed; the ≤ 6 % and ≤ 15-point goals are NOT met); anchored
    (the line before) the mean goal holds."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validate_projection.py"), "--corpus",
                          str(MULTINODE)], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    lines = out.strip().splitlines()
    m = LAST_LINE.match(lines[-1])
    assert m, lines[-1]
    rows, mean, median, inside, width = int(m[1]), float(m[2]), float(m[3]), float(m[6]), float(m[7])
    predicted, counted = (int(w) for w in [line for line in lines if line.startswith("predicted ")][0]
                          .split()[1:4:2])
    assert rows == predicted and predicted >= 0.8 * counted
    assert median <= 5.0 and mean <= 8.5 and 85.0 <= inside <= 95.0 and width <= 24.2
    anchored = LAST_LINE.match(lines[-2].removeprefix("anchored (--anchored): "))
    assert anchored and float(anchored[2]) <= 8.0 and float(anchored[3]) <= 5.0, lines[-2]
    assert any(line.startswith("held out of the headline:") for line in lines)


@pytest.mark.slow
def test_stored_bands_are_the_fit_of_the_in_project_corpora():
    """bench/project/model_error.csv is what `validate_projection.py --fit-interval` gives today."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from validate_projection import TRAINING, training_residuals
    finally:
        sys.path.pop(0)
    residuals = training_residuals(TRAINING, Physics())
    levels = {name: level for name, (level, _) in fitting.calibrated_levels(residuals).items()}
    stored, stored_levels = interval.read_bands()
    assert stored_levels == levels
    for name, band in fit_bands(residuals, levels).items():
        assert (stored[name].low, stored[name].high, stored[name].rows) == pytest.approx(
            (band.low, band.high, band.rows), abs=1e-6)


def test_what_if_takes_a_sharded_engine_and_nics_per_node():
    from bench.project.spec import SpecError, project_spec

    keys = dict(params=1_000_000_000, step_ms=1000.0, per_gpu_batch=8, precision="bf16",
                network="a100-nvlink", inter_network="ib-hdr200", world_sizes=[1, 8, 64])
    fsdp = project_spec(**keys, sharding="full").set_index("world_size")
    assert fsdp.loc[64, "algorithm"] == "all_gather+reduce_scatter"
    assert fsdp.loc[64, "interval_regime"].startswith("fsdp")
    ddp = project_spec(**keys).set_index("world_size")
    fewer_nics = project_spec(**keys, nics_per_node=2).set_index("world_size")
    # 2 NICs per node move a quarter of 8: the 64-GPU all-reduce is slower, the one-node step unchanged
    assert fewer_nics.loc[64, "comm_ms"] > ddp.loc[64, "comm_ms"]
    assert fewer_nics.loc[8, "predicted_step_ms"] == ddp.loc[8, "predicted_step_ms"]
    with pytest.raises(SpecError, match="sharding='zero4'"):
        project_spec(**keys, sharding="zero4")
    with pytest.raises(SpecError, match="nics_per_node=0"):
        project_spec(**keys, nics_per_node=0)


def test_a_measured_networks_residual_widens_the_interval():
    # a fit with a 10 % RMS residual: the step with busbw × (1 − 1.645·0.10) is slower, and that ratio
    # widens both ends of the band; a preset (no residual) gives the band alone
    from bench.project.fit import Fit, measured_network

    fit = Fit(alpha_us=50.0, us_per_byte=1e-4, n_points=4, alpha_fitted=True, rms_residual_pct=10.0,
              max_residual_pct=15.0)
    measured = measured_network(fit, 4, "test")
    assert measured.bandwidth_rel_error == pytest.approx(0.10)
    config = _config(False)
    rows = project(config, "measured", lambda n, d: (measured, "m"), [4], "auto", Physics())
    band = interval.read_bands()[0]["pcie"]
    row = rows[0]
    assert row["interval_regime"].startswith("pcie")
    low, high = (math.log(row[c] / row["efficiency_pct"]) for c in ("efficiency_pct_low",
                                                                      "efficiency_pct_high"))
    s = max(0.01, 1 - row["efficiency_pct"] / 100)   # the band's unit: the row's predicted loss
    delta = band.low * s - low
    # the high end widens by the same δ, then stops at the limit (100 %)
    assert delta > 0 and high == pytest.approx(min(band.high * s + delta,
                                                   math.log(100 / row["efficiency_pct"])))
